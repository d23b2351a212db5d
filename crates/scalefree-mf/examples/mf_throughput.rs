//! Rating updates per second of `local` mode on a seeded random 1 M-rating matrix shaped like
//! MovieLens-1M (6,040 × 3,700): `cargo run --release -p scalefree-mf --example mf_throughput -- [k] [iters] [threads]`.
use scalefree_mf::rng::Rng;
use scalefree_mf::{LocalOptions, LocalTrainer, Ratings};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let k = a.get(1).map_or(40, |s| s.parse().unwrap());
    let iters: usize = a.get(2).map_or(10, |s| s.parse().unwrap());
    let threads = a.get(3).map_or(2, |s| s.parse().unwrap());
    let (m, n, nnz) = (6040usize, 3700usize, 1_000_000usize);
    let mut rng = Rng::new(7);
    let us: Vec<u64> = (0..nnz).map(|_| rng.below(m) as u64).collect();
    let is: Vec<u64> = (0..nnz).map(|_| rng.below(n) as u64).collect();
    let vs: Vec<f32> = (0..nnz).map(|_| 1.0 + rng.below(5) as f32).collect();
    let r = Ratings::from_triples(&us, &is, &vs).unwrap();
    let t0 = std::time::Instant::now();
    let mut t = LocalTrainer::new(&r, &LocalOptions { k, threads, ..Default::default() }).unwrap();
    println!("setup {:.3}s", t0.elapsed().as_secs_f64());
    t.epoch();
    let t0 = std::time::Instant::now();
    let l = *t.run_epochs(iters).last().unwrap();
    let s = t0.elapsed().as_secs_f64();
    println!("k={k} threads={threads}: {:.1} M updates/s (last train mse {l:.4})", (iters * r.len()) as f64 / s / 1e6);
}
