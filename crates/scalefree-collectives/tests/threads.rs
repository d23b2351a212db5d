//! Ranks as threads of one process (fast); the Python suite runs the same checks with
//! real processes. Every result is compared with a sequential reference.

use std::time::Duration;

use scalefree_collectives::dense::share_bounds;
use scalefree_collectives::{Algorithm, CommOptions, Communicator, DType, ReduceOp};
use scalefree_testing::{options, ranks};

fn run<F>(n: u32, f: F)
where
    F: Fn(&mut Communicator) + Send + Sync + Clone + 'static,
{
    ranks(n, "t", options(Duration::from_secs(60)), move |dev| {
        let copts = CommOptions { inline_bytes: 4096, one_shot_max_bytes: 2048, piece_bytes: 4096, stage_max_bytes: 0, ..CommOptions::default() };
        let mut c = Communicator::new(dev, copts).unwrap();
        // `SCALEFREE_TRANSPORT=ucx cargo test --test threads` runs this suite over UCX.
        if n > 1 && std::env::var("SCALEFREE_TRANSPORT").is_ok_and(|t| t == "ucx") {
            assert!(c.is_networked() && c.device().transport_name() == "ucx");
        }
        f(&mut c);
    });
}

fn contribution(rank: u32, i: usize) -> i64 {
    ((i as i64 * 7 + rank as i64 * 13) % 23) - 11
}

#[test]
fn allreduce_i64_all_ops_algorithms_sizes() {
    for n in 1..=4u32 {
        run(n, move |c| {
            let me = c.rank();
            for &count in &[0usize, 1, 7, 1000, 5003, 70_001] {
                for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                    for algo in [Algorithm::Auto, Algorithm::OneShot, Algorithm::Direct, Algorithm::Ring] {
                        if algo == Algorithm::OneShot && count * 8 > 4096 {
                            continue;
                        }
                        let mut v: Vec<i64> = (0..count).map(|i| contribution(me, i)).collect();
                        unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, count, DType::I64, op, algo).unwrap() };
                        for (i, x) in v.iter().enumerate() {
                            let mut e = contribution(0, i);
                            for r in 1..n {
                                let y = contribution(r, i);
                                e = match op {
                                    ReduceOp::Sum => e.wrapping_add(y),
                                    ReduceOp::Prod => e.wrapping_mul(y),
                                    ReduceOp::Min => e.min(y),
                                    ReduceOp::Max => e.max(y),
                                };
                            }
                            assert_eq!(*x, e, "n={n} count={count} op={op:?} algo={algo:?} i={i}");
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn float_results_are_identical_on_every_rank() {
    run(3, |c| {
        let me = c.rank();
        let count = 33_333;
        let mut v: Vec<f32> = (0..count).map(|i| ((i * 31 + me as usize * 17) % 101) as f32 * 0.013).collect();
        unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, count, DType::F32, ReduceOp::Sum, Algorithm::Direct).unwrap() };
        let mut all = vec![0f32; count * 3];
        unsafe { c.allgather(v.as_ptr() as *const u8, count, all.as_mut_ptr() as *mut u8, DType::F32, Algorithm::Auto).unwrap() };
        for r in 0..3 {
            assert_eq!(&all[r * count..(r + 1) * count], &v[..], "rank {r} differs");
        }
    });
}

#[test]
fn reduce_scatter_allgather_broadcast_barrier() {
    for n in 1..=4u32 {
        run(n, move |c| {
            let me = c.rank();
            for &count in &[0usize, 1, 7, 1000, 9001] {
                // reduce_scatter
                let input: Vec<i32> = (0..count).map(|i| contribution(me, i) as i32).collect();
                let (lo, hi) = share_bounds(count, n, me);
                let mut out = vec![0i32; hi - lo];
                unsafe { c.reduce_scatter(input.as_ptr() as *const u8, count, out.as_mut_ptr() as *mut u8, DType::I32, ReduceOp::Sum, Algorithm::Auto).unwrap() };
                for (k, x) in out.iter().enumerate() {
                    let e: i32 = (0..n).map(|r| contribution(r, lo + k) as i32).sum();
                    assert_eq!(*x, e);
                }
                // allgather
                let mine: Vec<f64> = (0..count).map(|i| (i as f64) + 1000.0 * me as f64).collect();
                let mut all = vec![0f64; count * n as usize];
                unsafe { c.allgather(mine.as_ptr() as *const u8, count, all.as_mut_ptr() as *mut u8, DType::F64, Algorithm::Auto).unwrap() };
                for r in 0..n as usize {
                    for i in 0..count {
                        assert_eq!(all[r * count + i], i as f64 + 1000.0 * r as f64);
                    }
                }
                // broadcast from every root
                for root in 0..n {
                    let mut b: Vec<i64> = if me == root { (0..count as i64).map(|i| i * 3 + root as i64).collect() } else { vec![-1; count] };
                    unsafe { c.broadcast(b.as_mut_ptr() as *mut u8, count, DType::I64, root, Algorithm::Auto).unwrap() };
                    assert!(b.iter().enumerate().all(|(i, x)| *x == i as i64 * 3 + root as i64));
                }
                c.barrier().unwrap();
            }
        });
    }
}

/// A call that one rank makes small (one message per round between hosts: recursive
/// doubling) and the others large, or another collective altogether: every rank gets a
/// `Mismatch` error naming the first rank that differs from rank 0, never a hang, and the
/// group stays usable. Over UCX (`SCALEFREE_TRANSPORT=ucx`) the small side is `doubling`.
#[test]
fn mismatched_paths_error_on_every_rank() {
    // The rank that differs: the last, and one in the middle (over simulated hosts of 2
    // ranks, `n = 4`: a host's first rank, which leads the small calls of its host).
    for (n, odd) in [(2u32, 1u32), (3, 2), (3, 1), (4, 3), (4, 2)] {
        run(n, move |c| {
            let me = c.rank();
            for case in 0..5 {
                let r = match case {
                    // small on `odd`, large (the header exchange, then pieces) on the others
                    0 => {
                        let count = if me == odd { 10 } else { 100_000 };
                        let mut v = vec![1f32; count];
                        unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, count, DType::F32, ReduceOp::Sum, Algorithm::Auto) }.map(|_| ())
                    }
                    // large on `odd`, small on the others
                    1 => {
                        let count = if me == odd { 100_000 } else { 10 };
                        let mut v = vec![1f32; count];
                        unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, count, DType::F32, ReduceOp::Sum, Algorithm::Auto) }.map(|_| ())
                    }
                    // a barrier against a small allreduce
                    2 => {
                        if me == odd {
                            c.barrier()
                        } else {
                            let mut v = vec![1f32; 3];
                            unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, 3, DType::F32, ReduceOp::Sum, Algorithm::Auto) }.map(|_| ())
                        }
                    }
                    // a broadcast from another root (small: by doubling between hosts)
                    4 => {
                        let mut v = vec![1f32; 6];
                        unsafe { c.broadcast(v.as_mut_ptr() as *mut u8, 6, DType::F32, if me == odd { odd } else { 0 }, Algorithm::Auto) }
                    }
                    // an allgather against a small allreduce (between hosts both by doubling)
                    _ => {
                        let mut v = vec![1f32; 4 * n as usize];
                        if me == odd {
                            unsafe { c.allgather(v.as_ptr() as *const u8, 4, v.as_mut_ptr() as *mut u8, DType::F32, Algorithm::Auto) }
                        } else {
                            unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, 4, DType::F32, ReduceOp::Sum, Algorithm::Auto) }.map(|_| ())
                        }
                    }
                };
                let e = r.expect_err("a mismatch");
                assert!(matches!(e, scalefree_transport::Error::Mismatch(_)), "case {case} n {n}: {e}");
                assert!(e.to_string().contains(&format!("rank {odd}")), "case {case} n {n}: {e}");
                let mut w = vec![me as f32 + 1.0; 5];
                unsafe { c.allreduce(w.as_mut_ptr() as *mut u8, 5, DType::F32, ReduceOp::Sum, Algorithm::Auto).unwrap() };
                assert_eq!(w, vec![(n * (n + 1) / 2) as f32; 5]);
                c.barrier().unwrap();
            }
        });
    }
}

#[test]
fn mismatched_counts_error_on_every_rank() {
    run(3, |c| {
        let me = c.rank();
        let count = if me == 2 { 10 } else { 11 };
        let mut v = vec![1f32; count];
        let r = unsafe { c.allreduce(v.as_mut_ptr() as *mut u8, count, DType::F32, ReduceOp::Sum, Algorithm::Auto) };
        let e = r.unwrap_err();
        assert!(matches!(e, scalefree_transport::Error::Mismatch(_)), "{e}");
        // The group stays usable after a mismatch.
        let mut w = vec![1f32; 5];
        unsafe { c.allreduce(w.as_mut_ptr() as *mut u8, 5, DType::F32, ReduceOp::Sum, Algorithm::Auto).unwrap() };
        assert_eq!(w, vec![3f32; 5]);
    });
}
