//! Times the bf16 loops of the compressed allreduce (`dense::wire::kernels`) against the
//! per-element conversions of the `half` crate they replaced, in cache (32k elements: the
//! lane reader's 64 KiB parts) and from memory (8M elements: a 32 MiB float32 part), with a
//! float32 memcpy of the same elements for scale; then the fp16 loops (F16C) against `half`'s
//! slice conversions and per-element sums: `cargo run --release --example wire_convert`.
use std::hint::black_box;
use std::time::Instant;

use scalefree_collectives::dense::wire::fp16;
use scalefree_collectives::dense::wire::kernels::{add_round_on, add_widened_on, narrow_on, widen_on, Isa};

/// Best of `reps` timings of `f`, in ns per element.
fn time(n: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best * 1e9 / n as f64
}

fn main() {
    for &n in &[32usize << 10, 8 << 20] {
        let reps = if n < 1 << 20 { 2000 } else { 10 };
        let src: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.618).sin() * 10.0).collect();
        let mut h = vec![0u16; n];
        let mut f = vec![1f32; n];
        let mut out = vec![0u16; n];
        println!("{n} elements ({} KiB of float32), ns per element (best of {reps}):", n * 4 >> 10);
        let mut g = vec![0f32; n];
        println!("  {:<28} {:.3}", "memcpy float32", time(n, reps, || { g.copy_from_slice(black_box(&src)); black_box(&g); }));
        let t = time(n, reps, || {
            for (d, &s) in h.iter_mut().zip(black_box(&src)) {
                *d = half::bf16::from_f32(s).to_bits();
            }
            black_box(&h);
        });
        println!("  {:<28} {t:.3}", "narrow, half per element");
        let t = time(n, reps, || {
            for ((d, &s), o) in f.iter_mut().zip(black_box(&h)).zip(out.iter_mut()) {
                let x = half::bf16::from_f32(*d + half::bf16::from_bits(s).to_f32());
                *o = x.to_bits();
                *d = x.to_f32();
            }
            black_box(&f);
        });
        println!("  {:<28} {t:.3}", "add_round, half per element");
        let t = time(n, reps, || {
            for (d, &s) in g.iter_mut().zip(black_box(&h)) {
                *d = half::bf16::from_bits(s).to_f32();
            }
            black_box(&g);
        });
        println!("  {:<28} {t:.3}", "widen, half per element");
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            if !isa.available() {
                continue;
            }
            let name = format!("{isa:?}").to_lowercase();
            println!("  {:<28} {:.3}", format!("narrow, {name}"), time(n, reps, || { narrow_on(isa, black_box(&src), &mut h); black_box(&h); }));
            println!("  {:<28} {:.3}", format!("add_round, {name}"), time(n, reps, || { add_round_on(isa, black_box(&h), &mut f, &mut out); black_box(&f); }));
            println!("  {:<28} {:.3}", format!("add_widened, {name}"), time(n, reps, || { add_widened_on(isa, black_box(&h), &mut f); black_box(&f); }));
            println!("  {:<28} {:.3}", format!("widen, {name}"), time(n, reps, || { widen_on(isa, black_box(&h), &mut g); black_box(&g); }));
        }
        let t = time(n, reps, || {
            for (d, &s) in f.iter_mut().zip(black_box(&h)) {
                *d += half::f16::from_bits(s).to_f32();
            }
            black_box(&f);
        });
        println!("  {:<28} {t:.3}", "fp16 add_widened, half");
        let t = time(n, reps, || {
            for ((d, &s), o) in f.iter_mut().zip(black_box(&h)).zip(out.iter_mut()) {
                let x = half::f16::from_f32(*d + half::f16::from_bits(s).to_f32());
                *o = x.to_bits();
                *d = x.to_f32();
            }
            black_box(&f);
        });
        println!("  {:<28} {t:.3}", "fp16 add_round, half");
        // narrow and widen are `half`'s slice conversions (F16C where the CPU has it).
        println!("  {:<28} {:.3}", "fp16 narrow, half slice", time(n, reps, || { fp16::narrow(black_box(&src), &mut h); black_box(&h); }));
        println!("  {:<28} {:.3}", "fp16 add_widened, f16c", time(n, reps, || { fp16::add_widened(black_box(&h), &mut f); black_box(&f); }));
        println!("  {:<28} {:.3}", "fp16 add_round, f16c", time(n, reps, || { fp16::add_round(black_box(&h), &mut f, &mut out); black_box(&f); }));
        println!("  {:<28} {:.3}", "fp16 widen, half slice", time(n, reps, || { fp16::widen(black_box(&h), &mut g); black_box(&g); }));
    }
}
