//! Time `local` training as one call of n epochs against n calls of one epoch (the per-call
//! hand-off cost: what `MatrixFactorization.fit` pays when it evaluates after every epoch).
use scalefree_mf::{data, LocalOptions, LocalTrainer};

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let r = data::load(std::path::Path::new(&a[1]), None).expect("load");
    let reps: usize = a.get(2).map_or(5, |s| s.parse().unwrap());
    let threads: usize = a.get(3).map_or(2, |s| s.parse().unwrap());
    let n = 20;
    let (mut one, mut many) = (vec![], vec![]);
    for rep in 0..reps {
        let o = LocalOptions { k: 40, threads, lambda: 0.05, seed: rep as u64, ..Default::default() };
        let mut t = LocalTrainer::new(&r, &o).unwrap();
        t.run_epochs(1);
        let t0 = std::time::Instant::now();
        t.run_epochs(n);
        one.push(t0.elapsed().as_secs_f64() * 1e3 / n as f64);
        let mut t = LocalTrainer::new(&r, &o).unwrap();
        t.run_epochs(1);
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            t.run_epochs(1);
        }
        many.push(t0.elapsed().as_secs_f64() * 1e3 / n as f64);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!("ms per epoch: one call {:.3}, one call per epoch {:.3}", med(&mut one), med(&mut many));
}
