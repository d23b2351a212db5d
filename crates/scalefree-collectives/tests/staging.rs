//! With cross-memory attach switched off (`SCALEFREE_CMA=0`, as under Yama ptrace
//! restrictions), buffers that are not in a region are staged through shared memory.

use std::time::Duration;

use scalefree_collectives::{Algorithm, CommOptions, Communicator, DType, ReduceOp};
use scalefree_testing::{options, ranks};

#[test]
fn staged_allreduce_broadcast_allgather() {
    std::env::set_var("SCALEFREE_CMA", "0");
    let n = 3u32;
    ranks(n, "staging-", options(Duration::from_secs(60)), move |dev| {
        let r = dev.rank();
        assert!(!dev.cma_everywhere() || n == 1);
        let mut c = Communicator::new(dev, CommOptions { inline_bytes: 1024, one_shot_max_bytes: 512, piece_bytes: 4096, stage_max_bytes: 0, ..CommOptions::default() }).unwrap();
        // Growing sizes force the staging region to grow collectively.
        for &count in &[300usize, 5000, 40_000, 1000] {
            for algo in [Algorithm::Direct, Algorithm::Ring] {
                let mut v: Vec<f64> = (0..count).map(|i| (i as f64) * (r as f64 + 1.0)).collect();
                unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, count, DType::F64, ReduceOp::Sum, algo).unwrap() };
                assert!(v.iter().enumerate().all(|(i, x)| *x == i as f64 * 6.0), "{algo:?} {count}");
            }
            let mut b: Vec<i32> = if r == 1 { (0..count as i32).collect() } else { vec![0; count] };
            unsafe { c.broadcast(b.as_mut_ptr() as *mut u8, count, DType::I32, 1, Algorithm::Direct).unwrap() };
            assert!(b.iter().enumerate().all(|(i, x)| *x == i as i32));
            let mine = vec![r as i32; count];
            let mut all = vec![-1i32; count * n as usize];
            unsafe { c.allgather(mine.as_ptr() as *const u8, count, all.as_mut_ptr() as *mut u8, DType::I32, Algorithm::Direct).unwrap() };
            assert!(all.iter().enumerate().all(|(i, x)| *x == (i / count) as i32));
        }
    });
}
