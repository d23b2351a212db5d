//! Train `local` mode on a rating file and print per-epoch test RMSE and throughput:
//! `cargo run --release -p scalefree-mf --example mf_local -- DATA [k] [iters] [threads]`.
use scalefree_mf::{data, LocalOptions, LocalTrainer};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let r = data::load(std::path::Path::new(&a[1]), None).expect("load");
    let k = a.get(2).map_or(40, |s| s.parse().unwrap());
    let iters = a.get(3).map_or(20, |s| s.parse().unwrap());
    let threads = a.get(4).map_or(2, |s| s.parse().unwrap());
    let (tr, te) = r.split(0.1, 0).unwrap();
    let mut t = LocalTrainer::new(&tr, &LocalOptions { k, threads, ..Default::default() }).unwrap();
    let t0 = std::time::Instant::now();
    for it in 0..iters {
        let l = t.epoch();
        println!("iter {it} train_mse {l:.4} test_rmse {:.4}", t.rmse(&te).unwrap());
    }
    let s = t0.elapsed().as_secs_f64();
    println!("{s:.3}s  {:.1} M updates/s", (iters * tr.len()) as f64 / s / 1e6);
}
