//! Time `local` training on a LIBMF text file: 1 epoch, then n − 1 more; prints ms.
use scalefree_mf::{data, LocalOptions, LocalTrainer};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let r = data::load(std::path::Path::new(&a[1]), None).expect("load");
    let reps: usize = a.get(2).map_or(7, |s| s.parse().unwrap());
    let threads: usize = a.get(3).map_or(2, |s| s.parse().unwrap());
    let n = 20;
    let mut ts = vec![];
    for rep in 0..reps {
        let mut t = LocalTrainer::new(&r, &LocalOptions { k: 40, threads, lambda: 0.05, seed: rep as u64, ..Default::default() }).unwrap();
        t.run_epochs(1);
        let t0 = std::time::Instant::now();
        t.run_epochs(n - 1);
        ts.push(t0.elapsed().as_secs_f64() * 1e3 * n as f64 / (n - 1) as f64);
    }
    ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("{:?} median {:.2} ms", ts.iter().map(|x| (x * 100.0).round() / 100.0).collect::<Vec<_>>(), ts[reps / 2]);
}
