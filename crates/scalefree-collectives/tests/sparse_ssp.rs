//! The sparse allreduce with slack (bounded staleness), ranks as threads, seeded random
//! delays: every result must be, key by key, a combination of one contribution per rank that
//! contributes the key, none more than `slack` reductions older than the caller's (and none
//! more than `slack + 1` newer), the caller's own the current one; `flush` must be exact. Contributions are tagged: with `sum`, rank `r`
//! at call `t` puts the code of `t` in bit field `r` of column 0 and a 1 in bit field `r` of
//! column 1, so each field of a result names the call a contribution came from, and a
//! contribution lost or counted twice shows in column 1.

use std::time::Duration;

use scalefree_collectives::sparse::{SDType, SOp, SparseAllreduce};
use scalefree_collectives::{CommOptions, Communicator};
use scalefree_testing::{options, ranks, Rng};

fn run<F>(n: u32, f: F)
where
    F: Fn(&mut Communicator) + Send + Sync + Clone + 'static,
{
    ranks(n, "sp", options(Duration::from_secs(60)), move |dev| {
        let mut c = Communicator::new(dev, CommOptions::default()).unwrap();
        f(&mut c);
    });
}

/// Distinct indices of logical rank `r` in `[0, dim)`, shuffled.
fn indices(seed: u64, r: usize, nnz: usize, dim: u64) -> Vec<i64> {
    let mut g = Rng(seed * 31 + r as u64 * 7919 + 17);
    let mut v: Vec<i64> = (0..nnz).map(|_| (g.next() % dim) as i64).collect();
    v.sort_unstable();
    v.dedup();
    for i in (1..v.len()).rev() {
        let j = (g.next() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

/// Bits per rank field: what the dtype holds exactly for 5 ranks.
fn field_bits(dt: SDType) -> u32 {
    match dt {
        SDType::F32 => 4,
        SDType::F64 => 10,
        SDType::I32 | SDType::U32 => 6,
        _ => 12,
    }
}

/// The tag of call `t` (never 0: 0 means "no contribution").
fn code(t: u64, bits: u32) -> u64 {
    1 + t % ((1 << bits) - 1)
}

fn to_bytes(dt: SDType, x: &[u64]) -> Vec<u8> {
    x.iter()
        .flat_map(|&v| match dt {
            SDType::F32 => (v as f32).to_ne_bytes().to_vec(),
            SDType::F64 => (v as f64).to_ne_bytes().to_vec(),
            SDType::I32 => (v as i32).to_ne_bytes().to_vec(),
            SDType::I64 => (v as i64).to_ne_bytes().to_vec(),
            SDType::U32 => (v as u32).to_ne_bytes().to_vec(),
            SDType::U64 => v.to_ne_bytes().to_vec(),
            SDType::U8 => vec![v as u8],
        })
        .collect()
}

/// Values as i128 (the identity of max reads as a negative or -inf, mapped to -1).
fn from_bytes(dt: SDType, b: &[u8]) -> Vec<i128> {
    let es = dt.size_bytes();
    b.chunks(es)
        .map(|c| match dt {
            SDType::F32 => {
                let f = f32::from_ne_bytes(c.try_into().unwrap());
                if f.is_finite() { f as i128 } else { -1 }
            }
            SDType::F64 => {
                let f = f64::from_ne_bytes(c.try_into().unwrap());
                if f.is_finite() { f as i128 } else { -1 }
            }
            SDType::I32 => i32::from_ne_bytes(c.try_into().unwrap()) as i128,
            SDType::I64 => i64::from_ne_bytes(c.try_into().unwrap()) as i128,
            SDType::U32 => u32::from_ne_bytes(c.try_into().unwrap()) as i128,
            SDType::U64 => u64::from_ne_bytes(c.try_into().unwrap()) as i128,
            SDType::U8 => c[0] as i128,
        })
        .collect()
}

#[derive(Clone, Copy, Debug)]
struct Case {
    n: u32,
    replication: usize,
    degrees: Option<&'static [usize]>,
    dt: SDType,
    op: SOp,
    slack: u64,
    calls: u64,
    nnz: usize,
    hash: bool,
    seed: u64,
}

/// Runs `calls` reduces with random delays (a mid-run and a final flush), checking each.
fn check(case: Case) {
    run(case.n, move |c| {
        let Case { n, replication, degrees, dt, op, slack, calls, nnz, hash, seed } = case;
        let m = n as usize / replication;
        let me = c.rank() as usize % m; // logical rank
        let dim = 4 * nnz as u64 + 8;
        let outs: Vec<Vec<i64>> = (0..m).map(|r| indices(seed, r, nnz, dim)).collect();
        let sets: Vec<std::collections::HashSet<i64>> = outs.iter().map(|o| o.iter().copied().collect()).collect();
        let mut in_idx = indices(seed ^ 0x5a5a, me + 100, nnz, dim);
        in_idx.extend(outs[me].iter().take(nnz / 2)); // keys it also contributes (may repeat)
        let w = if op == SOp::Sum { 2 } else { 1 };
        let mut sa = SparseAllreduce::new(dim, op, degrees.map(|d| d.to_vec()), n as usize, hash.then_some(seed), replication).unwrap();
        sa.enable_ssp();
        sa.config(c, &outs[me], &in_idx).unwrap();
        let bits = field_bits(dt);
        let mask = (1u64 << bits) - 1;
        let contribution = |t: u64| -> Vec<u8> {
            let mut v = Vec::with_capacity(outs[me].len() * w);
            for _ in &outs[me] {
                if op == SOp::Sum {
                    v.push(code(t, bits) << (bits as usize * me));
                    v.push(1u64 << (bits as usize * me));
                } else {
                    v.push(t * 8 + me as u64);
                }
            }
            to_bytes(dt, &v)
        };
        // Checks one result of call `t` (exact: every contribution is that of call t).
        let verify = |res: &[i128], t: u64, exact: bool, what: &str| {
            let lo = if exact { t } else { t.saturating_sub(slack).max(1) };
            // A peer may be ahead: it publishes its messages down of call t + slack + 1 before
            // it waits for this rank's call t + 1 (newer is no harm; only staleness is bounded).
            // Replicated, a replica of a peer paces itself by this rank's sibling replicas, so it
            // may be further ahead.
            let hi = if exact { t } else if replication > 1 { calls } else { t + slack + 1 };
            for (i, &x) in in_idx.iter().enumerate() {
                if op == SOp::Sum {
                    let (v, cnt) = (res[i * 2] as u64, res[i * 2 + 1] as u64);
                    for (r, set) in sets.iter().enumerate() {
                        let (f, k) = ((v >> (bits as usize * r)) & mask, (cnt >> (bits as usize * r)) & mask);
                        if !set.contains(&x) {
                            assert!(f == 0 && k == 0, "{case:?} {what}: rank {me} call {t} index {x}: rank {r} does not contribute it but shows ({f}, {k})");
                            continue;
                        }
                        assert_eq!(k, 1, "{case:?} {what}: rank {me} call {t} index {x}: rank {r}'s contribution counted {k} times");
                        if r == me {
                            assert_eq!(f, code(t, bits), "{case:?} {what}: rank {me} call {t} index {x}: own contribution not current");
                        } else {
                            assert!((lo..=hi).any(|u| code(u, bits) == f), "{case:?} {what}: rank {me} call {t} index {x}: rank {r}'s tag {f} is not of calls {lo}..={hi}");
                        }
                    }
                } else {
                    let v = res[i];
                    let who: Vec<usize> = (0..m).filter(|&r| sets[r].contains(&x)).collect();
                    if who.is_empty() {
                        assert!(v <= 0, "{case:?} {what}: index {x} nobody contributes reads {v}");
                        continue;
                    }
                    let (tt, r) = ((v / 8) as u64, (v % 8) as usize);
                    assert!(who.contains(&r) && (lo..=hi).contains(&tt), "{case:?} {what}: rank {me} call {t} index {x}: {v} is no contribution of calls {lo}..={hi}");
                    if exact {
                        assert_eq!(v, (t * 8 + *who.iter().max().unwrap() as u64) as i128, "{case:?} {what}: index {x}");
                    }
                    if sets[me].contains(&x) {
                        assert!(v >= (t * 8 + me as u64) as i128, "{case:?} {what}: rank {me} call {t} index {x}: own current contribution missing");
                    }
                }
            }
        };
        let es = dt.size_bytes();
        let mut out = vec![0u8; in_idx.len() * w * es];
        let mut g = Rng(seed * 1_000_003 + c.rank() as u64 * 7 + 1);
        let mut stale = 0u64;
        for t in 1..=calls {
            if g.next() % 3 == 0 {
                std::thread::sleep(Duration::from_micros(g.next() % 500));
            }
            let vals = contribution(t);
            let st = sa.reduce_ssp(c, &vals, &mut out, dt, w, slack).unwrap_or_else(|e| panic!("{case:?}: rank {me} call {t}: {e}"));
            assert_eq!(st.clock, t);
            assert!(st.age_diff <= slack, "{case:?}: age_diff {} over the slack", st.age_diff);
            stale += (st.age_diff > 0) as u64;
            verify(&from_bytes(dt, &out), t, slack == 0, "reduce");
            if t == calls / 2 || t == calls {
                let mut exact = vec![0u8; out.len()];
                sa.flush_ssp(c, &mut exact).unwrap();
                verify(&from_bytes(dt, &exact), t, true, "flush");
            }
        }
        assert_eq!(sa.ssp_stats().len() as u64, calls);
        let _ = stale;
    });
}

const SUM_DTYPES: [SDType; 6] = [SDType::F64, SDType::F32, SDType::I64, SDType::I32, SDType::U32, SDType::U64];

#[test]
fn sum_every_world_size_and_dtype() {
    // SPARSE_SSP_DTYPES=k: k dtypes per world size, rotating (fewer runs where ranks are slower
    // to start, as across simulated hosts); all six by default.
    let k: usize = std::env::var("SPARSE_SSP_DTYPES").ok().and_then(|v| v.parse().ok()).unwrap_or(SUM_DTYPES.len());
    for n in 1..=5u32 {
        for (i, dt) in SUM_DTYPES.into_iter().enumerate() {
            if (i + n as usize) % SUM_DTYPES.len() >= k {
                continue;
            }
            let slack = if (i + n as usize) % 3 == 0 { 0 } else { 3 };
            let seed = 3 + n as u64 * 10 + i as u64;
            check(Case { n, replication: 1, degrees: None, dt, op: SOp::Sum, slack, calls: 16, nnz: 100, hash: i % 2 == 0, seed });
        }
    }
}

#[test]
fn sum_empty_and_single_index() {
    for (n, nnz) in [(3u32, 0usize), (2, 1), (4, 1)] {
        check(Case { n, replication: 1, degrees: None, dt: SDType::I64, op: SOp::Sum, slack: 2, calls: 10, nnz, hash: true, seed: 41 });
    }
}

#[test]
fn sum_several_layers_and_replicas() {
    for (n, replication, degrees) in [(4u32, 1usize, Some(&[2usize, 2][..])), (4, 2, None), (5, 1, Some(&[5][..]))] {
        for (slack, dt) in [(1u64, SDType::F64), (4, SDType::I64)] {
            check(Case { n, replication, degrees, dt, op: SOp::Sum, slack, calls: 16, nnz: 120, hash: true, seed: 77 + slack });
        }
    }
}

#[test]
fn max_is_idempotent_under_staleness() {
    for (n, degrees) in [(3u32, None), (5, None), (4, Some(&[2usize, 2][..]))] {
        for dt in [SDType::I64, SDType::F64, SDType::U8] {
            check(Case { n, replication: 1, degrees, dt, op: SOp::Max, slack: 3, calls: 16, nnz: 80, hash: true, seed: 5 });
        }
    }
}

#[test]
fn a_slow_rank_is_not_waited_for_within_the_slack() {
    // Rank 0 stops after its first call until both others have made five: with slack 4
    // they need nothing newer from it until then (their call t sees its first contribution,
    // age_diff t - 1); their sixth waits for its second.
    let ahead = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    run(3, move |c| {
        use std::sync::atomic::Ordering;
        let me = c.rank() as usize;
        let idx: Vec<i64> = (0..64).collect();
        let mut sa = SparseAllreduce::new(64, SOp::Sum, None, 3, Some(1), 1).unwrap();
        sa.enable_ssp();
        sa.config(c, &idx, &idx).unwrap();
        let mut out = vec![0u8; 64 * 8];
        let mut ages = Vec::new();
        for t in 1..=8u64 {
            if me == 0 && t == 2 {
                let t0 = std::time::Instant::now();
                while ahead.load(Ordering::SeqCst) < 2 {
                    assert!(t0.elapsed() < Duration::from_secs(30), "the other ranks did not get 4 calls ahead");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            let v = to_bytes(SDType::F64, &vec![t; 64]);
            let st = sa.reduce_ssp(c, &v, &mut out, SDType::F64, 1, 4).unwrap();
            ages.push(st.age_diff);
            if me != 0 && t == 5 {
                ahead.fetch_add(1, Ordering::SeqCst);
            }
        }
        let mut exact = vec![0u8; 64 * 8];
        sa.flush_ssp(c, &mut exact).unwrap();
        assert!(from_bytes(SDType::F64, &exact).iter().all(|&x| x == 24), "flush is not the sum of the last contributions");
        if me != 0 {
            assert_eq!(&ages[..5], &[0, 1, 2, 3, 4], "rank {me}: ages of its first five calls");
        }
    });
}
