//! Stale-synchronous reductions with ranks as threads: randomized runs that check, for
//! every call, that the caller's own contributions are all in its result, that no other
//! rank's data is older than the slack, that consistent variants give every shard the same
//! set of contributions, and, after flush, that every rank holds the exact total.

use std::time::Duration;

use scalefree_collectives::ssp::{PushOrder, SspReduction, Variant};
use scalefree_collectives::{DType, ReduceOp};
use scalefree_testing::{options, ranks, Rng};
use scalefree_transport::Device;

fn devices<F>(n: u32, f: F)
where
    F: Fn(Device) + Send + Sync + Clone + 'static,
{
    ranks(n, "ssp", options(Duration::from_secs(20)), f);
}

fn as_bytes(v: &[i64]) -> &[u8] {
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 8) }
}
fn as_bytes_mut(v: &mut [i64]) -> &mut [u8] {
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 8) }
}


/// Element `j` counts the contributions of rank `j % n`; each call adds 1 there (so every
/// shard holds a counter for every rank) and a pseudo-random payload that the final total
/// must match exactly.
#[allow(clippy::too_many_arguments)]
fn run_case(seed: u64, n: u32, variant: Variant, order: PushOrder, reps: usize, count: usize, calls: u64, slack: u64, delay_us: u64) {
    devices(n, move |dev| {
        let me = dev.rank();
        let mut rng = Rng(seed * 7919 + me as u64 * 104_729 + 1);
        let mut red = SspReduction::with_order(&dev, count, DType::I64, ReduceOp::Sum, variant, order).unwrap();
        assert_eq!(red.push_order(), order);
        let mut out = vec![0i64; count];
        let payload = |r: u32, t: u64, j: usize| ((r as i64 + 1) * 1_000_003 + t as i64 * 7_919 + j as i64 * 31) % 1013;
        for t in 1..=calls {
            let mut c = vec![0i64; count];
            for (j, x) in c.iter_mut().enumerate() {
                if j < reps * n as usize {
                    *x = (j % n as usize == me as usize) as i64;
                } else {
                    *x = payload(me, t, j);
                }
            }
            if delay_us > 0 && rng.below(3) == 0 {
                std::thread::sleep(Duration::from_micros(rng.below(delay_us)));
            }
            let st = red.allreduce(as_bytes(&c), as_bytes_mut(&mut out), slack)
                .unwrap_or_else(|e| panic!("{variant:?} n={n} count={count} calls={calls} slack={slack} delay={delay_us} rank {me} seed {seed}: {e}"));
            assert_eq!(st.clock, t);
            assert!(st.age_diff <= slack, "{variant:?} n={n}: age difference {} > slack {slack}", st.age_diff);
            for r in 0..n as usize {
                let seen: Vec<i64> = (0..reps).map(|i| out[i * n as usize + r]).collect();
                if r == me as usize {
                    assert!(seen.iter().all(|&s| s == t as i64), "{variant:?} n={n} rank {me} clock {t}: own count {seen:?}");
                } else {
                    let lo = t.saturating_sub(slack) as i64;
                    assert!(seen.iter().all(|&s| s >= lo && s <= calls as i64),
                        "{variant:?} n={n} rank {me} clock {t} slack {slack}: rank {r} counts {seen:?}, need >= {lo}");
                    if variant.consistent() {
                        assert!(seen.iter().all(|&s| s == seen[0]), "{variant:?}: shards disagree {seen:?}");
                    }
                }
            }
        }
        red.flush(as_bytes_mut(&mut out))
            .unwrap_or_else(|e| panic!("{variant:?} n={n} count={count} calls={calls} slack={slack} rank {me}: {e}"));
        for (j, &x) in out.iter().enumerate() {
            let want = if j < reps * n as usize {
                calls as i64
            } else {
                (0..n).map(|r| (1..=calls).map(|t| payload(r, t, j)).sum::<i64>()).sum()
            };
            assert_eq!(x, want, "{variant:?} n={n} after flush, element {j}");
        }
        assert!(red.allreduce(as_bytes(&vec![0; count]), as_bytes_mut(&mut out), 0).is_err());
    });
}

#[test]
fn slack_zero_is_exact_every_variant_every_size() {
    for n in 1..=5u32 {
        for v in Variant::ALL {
            for order in [PushOrder::Cyclic, PushOrder::Fixed] {
                run_case(n as u64, n, v, order, 2, 2 * n as usize + 37, 12, 0, 0);
            }
        }
    }
}

#[test]
fn randomized_runs_conserve_every_contribution() {
    let mut rng = Rng(0x5eed);
    let runs: usize = std::env::var("SSP_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    for i in 0..runs {
        let n = 1 + rng.below(4) as u32;
        let v = Variant::ALL[rng.below(Variant::ALL.len() as u64) as usize];
        let reps = 1 + rng.below(3) as usize;
        let count = reps * n as usize + rng.below(300) as usize;
        let calls = 1 + rng.below(25);
        let slack = [0, 1, 2, 4, 8, 255][rng.below(6) as usize];
        let delay = [0, 50, 500][rng.below(3) as usize];
        let order = [PushOrder::Cyclic, PushOrder::Fixed][rng.below(2) as usize];
        run_case(1000 + i as u64, n, v, order, reps, count, calls, slack, delay);
    }
}

/// The ring at every world size 1–5 and at sizes 0, 1, odd and large (segments of zero
/// length when the vector is shorter than the ring), with seeded random delays.
#[test]
fn ring_conserves_every_contribution_at_every_size() {
    let mut rng = Rng(0x7149);
    for n in 1..=5u32 {
        for (count, reps) in [(0, 0), (1, 0), (2 * n as usize + 37, 2), (3 * n as usize + 1, 3), (100_003, 1)] {
            for slack in [0, 1, 3, 255] {
                let calls = if count > 10_000 { 6 } else { 1 + rng.below(20) };
                let delay = [0, 50, 500][rng.below(3) as usize];
                run_case(7000 + rng.below(1000), n, Variant::Ring, PushOrder::Cyclic, reps, count, calls, slack, delay);
            }
        }
    }
}

#[test]
fn auto_takes_the_ring_for_large_vectors_over_three_ranks() {
    assert_eq!(Variant::resolve("auto", 4, 16 << 20, 1 << 20).unwrap(), Variant::Ring);
    assert_eq!(Variant::resolve("auto", 4, 1000, 1 << 20).unwrap(), Variant::ShardedAsyncThread);
    assert_eq!(Variant::resolve("auto", 2, 16 << 20, 1 << 20).unwrap(), Variant::ShardedAsyncThread);
    assert_eq!(Variant::resolve("ring", 1, 0, 1 << 20).unwrap(), Variant::Ring);
    assert!(Variant::resolve("rings", 4, 0, 1).is_err());
}

#[test]
fn other_ops_and_dtypes_flush_exactly() {
    for v in Variant::ALL {
        devices(3, move |dev| {
            let me = dev.rank() as usize;
            let count = 1001;
            for op in [ReduceOp::Max, ReduceOp::Min] {
                let mut red = SspReduction::new(&dev, count, DType::F64, op, v).unwrap();
                let mut out = vec![0f64; count];
                let val = |r: usize, t: usize, j: usize| (((r * 131 + t * 17 + j * 7) % 97) as f64) - 40.0;
                for t in 0..9 {
                    let c: Vec<f64> = (0..count).map(|j| val(me, t, j)).collect();
                    let cb = unsafe { std::slice::from_raw_parts(c.as_ptr() as *const u8, count * 8) };
                    let ob = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, count * 8) };
                    red.allreduce(cb, ob, 3).unwrap();
                }
                let ob = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, count * 8) };
                red.flush(ob).unwrap();
                for (j, &x) in out.iter().enumerate() {
                    let all = (0..3).flat_map(|r| (0..9).map(move |t| val(r, t, j)));
                    let want = if op == ReduceOp::Max { all.fold(f64::MIN, f64::max) } else { all.fold(f64::MAX, f64::min) };
                    assert_eq!(x, want, "{v:?} {op:?} element {j}");
                }
            }
        });
    }
}

#[test]
fn mismatched_arguments_are_an_error() {
    devices(2, |dev| {
        let count = if dev.rank() == 0 { 10 } else { 11 };
        let e = SspReduction::new(&dev, count, DType::F32, ReduceOp::Sum, Variant::Sharded).err().expect("mismatch");
        assert!(e.to_string().contains("disagree"), "{e}");
    });
    devices(2, |dev| {
        let order = if dev.rank() == 0 { PushOrder::Cyclic } else { PushOrder::Fixed };
        let e = SspReduction::with_order(&dev, 10, DType::F32, ReduceOp::Sum, Variant::Sharded, order).err().expect("mismatch");
        assert!(e.to_string().contains("push"), "{e}");
    });
}

#[test]
fn cyclic_push_order_starts_at_the_next_rank() {
    assert_eq!(PushOrder::Cyclic.sequence(0, 4), vec![1, 2, 3, 0]);
    assert_eq!(PushOrder::Cyclic.sequence(3, 4), vec![0, 1, 2, 3]);
    assert_eq!(PushOrder::Cyclic.sequence(1, 3), vec![2, 0, 1]);
    assert_eq!(PushOrder::Cyclic.sequence(0, 1), vec![0]);
    assert_eq!(PushOrder::Fixed.sequence(2, 4), vec![0, 1, 2, 3]);
    // At any step i, the p ranks push to p different shards.
    for p in 1..=7 {
        for i in 0..p {
            let mut hit: Vec<usize> = (0..p).map(|r| PushOrder::Cyclic.sequence(r, p)[i]).collect();
            hit.sort();
            assert_eq!(hit, (0..p).collect::<Vec<_>>());
        }
    }
}

