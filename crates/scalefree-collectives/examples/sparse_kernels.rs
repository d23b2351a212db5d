//! Times the direct reduce's two kernels on the bench's sizes (a part of a 190k-row
//! accumulator): `cargo run --release --example sparse_kernels` (`SCALEFREE_SPARSE_SIMD=0`
//! for the scalar reference).
use std::time::Instant;

use scalefree_collectives::sparse::kernels::{combine_rows, copy_rows, RowMap, SDType, SOp};

fn main() {
    let rows = 190_000usize;
    let n = 100_000usize;
    let mut s = 1u64;
    let mut rnd = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as usize
    };
    // n distinct rows of the accumulator, ascending (a part is in key order), and n random
    // caller positions (a permutation of 0..n).
    let mut pick: Vec<usize> = (0..rows).collect();
    for i in 0..n {
        let j = i + rnd() % (rows - i);
        pick.swap(i, j);
    }
    let mut dst_rows: Vec<usize> = pick[..n].to_vec();
    dst_rows.sort_unstable();
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        perm.swap(i, rnd() % (i + 1));
    }
    let dm = RowMap::from_positions(dst_rows.iter().copied());
    let sm = RowMap::from_positions(perm.iter().copied());
    let run = RowMap::Contig { start: 0, len: n };
    let mut acc = vec![0f32; rows];
    let vals: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut out = vec![0f32; n];
    let time = |f: &mut dyn FnMut()| {
        let mut t = Vec::new();
        for _ in 0..200 {
            let t0 = Instant::now();
            f();
            t.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (t[t.len() / 2], t[0])
    };
    unsafe {
        let (m, lo) = time(&mut || combine_rows(SDType::F32, SOp::Sum, acc.as_mut_ptr() as *mut u8, &dm, vals.as_ptr() as *const u8, &sm, 1));
        println!("combine, rows from a permutation: median {m:.1} us, min {lo:.1} us ({:.2} ns/row)", m * 1e3 / n as f64);
        let (m, lo) = time(&mut || combine_rows(SDType::F32, SOp::Sum, acc.as_mut_ptr() as *mut u8, &dm, vals.as_ptr() as *const u8, &run, 1));
        println!("combine, rows from a run:          median {m:.1} us, min {lo:.1} us ({:.2} ns/row)", m * 1e3 / n as f64);
        let (m, lo) = time(&mut || copy_rows(SDType::F32, out.as_mut_ptr() as *mut u8, &sm, acc.as_ptr() as *const u8, &dm, 1));
        println!("copy into a permutation:           median {m:.1} us, min {lo:.1} us ({:.2} ns/row)", m * 1e3 / n as f64);
        let (m, lo) = time(&mut || copy_rows(SDType::F32, out.as_mut_ptr() as *mut u8, &run, acc.as_ptr() as *const u8, &dm, 1));
        println!("copy into a run:                   median {m:.1} us, min {lo:.1} us ({:.2} ns/row)", m * 1e3 / n as f64);
    }
}
