//! The sparse allreduce with ranks as threads, against a sequential reference: world sizes
//! 1–5, 0 / 1 / odd / large index counts, duplicates, hashed and unhashed keys, every dtype
//! and op, widths 1 and 3, values in ordinary memory (sent as a key-ordered copy) and in a
//! registered region (read in place), the direct reduce and the general path.

use std::time::Duration;

use scalefree_collectives::sparse::{SDType, SOp, SparseAllreduce};
use scalefree_collectives::{CommOptions, Communicator};
use scalefree_testing::{options, ranks};

fn run<F>(n: u32, f: F)
where
    F: Fn(&mut Communicator) + Send + Sync + Clone + 'static,
{
    ranks(n, "s", options(Duration::from_secs(60)), move |dev| {
        let mut c = Communicator::new(dev, CommOptions::default()).unwrap();
        f(&mut c);
    });
}

fn rnd(state: &mut u64) -> u64 {
    *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *state >> 33
}

/// Indices of rank `r`: `n` of them in `[0, dim)`, skewed to small ids, with duplicates
/// when `dups`, ascending when `sorted` (distinct then).
fn indices(seed: u64, r: u32, n: usize, dim: u64, dups: bool, sorted: bool) -> Vec<i64> {
    let mut s = seed ^ ((r as u64 + 1) * 0x9e37_79b9);
    let mut v: Vec<i64> = (0..n)
        .map(|_| {
            let a = rnd(&mut s) % dim;
            (if rnd(&mut s).is_multiple_of(2) { a % (dim / 8 + 1) } else { a }) as i64
        })
        .collect();
    if !dups || sorted {
        v.sort_unstable();
        v.dedup();
        if !sorted {
            // Shuffle.
            for i in (1..v.len()).rev() {
                let j = (rnd(&mut s) % (i as u64 + 1)) as usize;
                v.swap(i, j);
            }
        }
    }
    v
}

/// Small integer values, exact in every dtype and under any order of combination.
fn value(r: u32, i: usize, c: usize) -> i64 {
    ((i as i64 * 7 + r as i64 * 13 + c as i64 * 5) % 23) + 1
}

fn to_bytes(dt: SDType, x: &[i64]) -> Vec<u8> {
    x.iter()
        .flat_map(|&v| match dt {
            SDType::F32 => (v as f32).to_ne_bytes().to_vec(),
            SDType::F64 => (v as f64).to_ne_bytes().to_vec(),
            SDType::I32 => (v as i32).to_ne_bytes().to_vec(),
            SDType::I64 => v.to_ne_bytes().to_vec(),
            SDType::U32 => (v as u32).to_ne_bytes().to_vec(),
            SDType::U64 => (v as u64).to_ne_bytes().to_vec(),
            SDType::U8 => vec![v as u8], // sums wrap, as the kernel's do
        })
        .collect()
}

/// The identity of `op` in `dt`, as the reference writes it.
fn identity_bytes(dt: SDType, op: SOp) -> Vec<u8> {
    match (dt, op) {
        (SDType::F32, SOp::Max) => f32::NEG_INFINITY.to_ne_bytes().to_vec(),
        (SDType::F32, SOp::Min) => f32::INFINITY.to_ne_bytes().to_vec(),
        (SDType::F64, SOp::Max) => f64::NEG_INFINITY.to_ne_bytes().to_vec(),
        (SDType::F64, SOp::Min) => f64::INFINITY.to_ne_bytes().to_vec(),
        (SDType::I32, SOp::Max) => i32::MIN.to_ne_bytes().to_vec(),
        (SDType::I32, SOp::Min) => i32::MAX.to_ne_bytes().to_vec(),
        (SDType::I64, SOp::Max) => i64::MIN.to_ne_bytes().to_vec(),
        (SDType::I64, SOp::Min) => i64::MAX.to_ne_bytes().to_vec(),
        (SDType::U32, SOp::Min) => u32::MAX.to_ne_bytes().to_vec(),
        (SDType::U64, SOp::Min) => u64::MAX.to_ne_bytes().to_vec(),
        (SDType::U8, SOp::Min) => vec![u8::MAX],
        _ => vec![0; dt.size_bytes()],
    }
}

fn combine(op: SOp, a: i64, b: i64) -> i64 {
    match op {
        SOp::Sum => a + b,
        SOp::Max => a.max(b),
        SOp::Min => a.min(b),
        SOp::Or => a | b,
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    n: u32,
    nnz: usize,
    dim: u64,
    dups: bool,
    sorted: bool,
    hash: bool,
    dt: SDType,
    op: SOp,
    w: usize,
    /// Values in a registered region (read in place by peers) instead of a Vec.
    region: bool,
    /// `SCALEFREE_SPARSE_DIRECT`-style choice, via degrees: None = auto (one layer).
    degrees: Option<&'static [usize]>,
    seed: u64,
}

fn check(case: Case) {
    run(case.n, move |c| {
        let Case { n, nnz, dim, dups, sorted, hash, dt, op, w, region, degrees, seed } = case;
        let me = c.rank();
        let out_idx = indices(seed, me, nnz, dim, dups, sorted);
        // Requests: a different pattern (with its own duplicates), plus some of the out ones.
        let mut in_idx = indices(seed ^ 0xabc, me, nnz / 2 + 1, dim, dups, sorted);
        if !sorted {
            in_idx.extend(out_idx.iter().take(nnz / 3));
        }
        let mut sa = SparseAllreduce::new(dim, op, degrees.map(|d| d.to_vec()), n as usize, hash.then_some(seed), 1).unwrap();
        sa.config(c, &out_idx, &in_idx).unwrap_or_else(|e| panic!("{case:?}: rank {me} config: {e}"));
        let one_layer = sa.degrees().len() == 1;
        assert!(degrees.is_none_or(|d| d.len() != 1) || one_layer);
        let off = std::env::var("SCALEFREE_SPARSE_DIRECT").is_ok_and(|v| v == "0");
        assert_eq!(sa.direct(), n > 1 && one_layer && !off, "{case:?}: direct path chosen wrongly");
        let es = dt.size_bytes();
        for call in 0..3 {
            let vals: Vec<i64> = (0..out_idx.len() * w).map(|i| value(me, i / w + call, i % w)).collect();
            let bytes = to_bytes(dt, &vals);
            let reg = region.then(|| c.device().alloc_region(bytes.len().max(8)).unwrap());
            let src: &[u8] = match &reg {
                Some(r) => unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), r.as_ptr(), bytes.len());
                    std::slice::from_raw_parts(r.as_ptr(), bytes.len())
                },
                None => &bytes,
            };
            let mut out = vec![0u8; in_idx.len() * w * es];
            sa.reduce(c, src, &mut out, dt, w).unwrap_or_else(|e| panic!("{case:?}: rank {me} call {call}: {e}"));
            // Reference: every rank's contributions by index.
            let mut by_idx = std::collections::HashMap::<(i64, usize), i64>::new();
            for r in 0..n {
                let oi = indices(seed, r, nnz, dim, dups, sorted);
                for (i, &x) in oi.iter().enumerate() {
                    for col in 0..w {
                        let v = value(r, i + call, col);
                        by_idx.entry((x, col)).and_modify(|a| *a = combine(op, *a, v)).or_insert(v);
                    }
                }
            }
            let id = identity_bytes(dt, op);
            let mut want = Vec::with_capacity(out.len());
            for &x in &in_idx {
                for col in 0..w {
                    match by_idx.get(&(x, col)) {
                        Some(&v) => want.extend(to_bytes(dt, &[v])),
                        None => want.extend(&id),
                    }
                }
            }
            assert!(out == want, "{case:?}: rank {me} call {call}: result differs from the reference");
        }
    });
}

const DTYPES: [SDType; 7] = [SDType::F32, SDType::F64, SDType::I32, SDType::I64, SDType::U32, SDType::U64, SDType::U8];

#[test]
fn every_world_size_and_size() {
    for n in 1..=5 {
        for nnz in [0usize, 1, 7, 1001, 20_000] {
            for (dups, sorted, hash) in [(false, false, true), (true, false, true), (false, true, false), (true, false, false)] {
                for region in [false, true] {
                    check(Case { n, nnz, dim: 50_000, dups, sorted, hash, dt: SDType::F32, op: SOp::Sum, w: 1, region, degrees: None, seed: 11 + nnz as u64 });
                }
            }
        }
    }
}

#[test]
fn every_dtype_op_and_width() {
    for n in [2u32, 3] {
        for dt in DTYPES {
            for op in [SOp::Sum, SOp::Max, SOp::Min, SOp::Or] {
                if op == SOp::Or && !matches!(dt, SDType::U32 | SDType::U64) {
                    continue;
                }
                for w in [1usize, 3] {
                    for region in [false, true] {
                        check(Case { n, nnz: 517, dim: 4000, dups: true, sorted: false, hash: true, dt, op, w, region, degrees: None, seed: 5 });
                        check(Case { n, nnz: 517, dim: 4000, dups: false, sorted: true, hash: false, dt, op, w, region, degrees: None, seed: 6 });
                    }
                }
            }
        }
    }
}

#[test]
fn several_layers_and_dense_segments() {
    // Two layers run the general path; a tiny dim makes the ranges dense.
    for (n, degrees) in [(4u32, &[2usize, 2][..]), (6, &[2, 3][..]), (4, &[4][..])] {
        for dt in [SDType::F32, SDType::I64] {
            for region in [false, true] {
                check(Case { n, nnz: 3000, dim: 100_000, dups: true, sorted: false, hash: true, dt, op: SOp::Sum, w: 1, region, degrees: Some(degrees), seed: 9 });
                check(Case { n, nnz: 300, dim: 64, dups: true, sorted: false, hash: true, dt, op: SOp::Max, w: 2, region, degrees: Some(degrees), seed: 10 });
            }
        }
    }
}
