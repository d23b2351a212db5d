//! sort: an out-of-core sort of a flash array in place, in IEEE total order (-NaN first, then
//! -inf .. +inf, then NaN), by parallel sorting by regular sampling:
//!
//! 1. Run tasks read a chunk that fits a task's share of the budget, sort it, and write it to
//!    a scratch run file; each keeps a regular sample of its sorted run (value and position).
//! 2. Splitters are chosen from the samples. Ties are broken by (run, position), so a
//!    splitter cuts every run at one exact place and no partition grows past its bound however
//!    many equal values there are: a partition holds at most n/P + runs * spacing elements.
//! 3. Partition tasks read their segment of every run, merge them (sort of the concatenation),
//!    and write the partition's range of the output, which is the input array itself.
//!
//! Both phases are DAGs of the runtime, so reads are prefetched and the budget holds.

use std::cmp::Ordering;
use std::sync::Mutex;

use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::file::FlashPtr;
use crate::io::Access;
use crate::runtime::Runtime;
use crate::sched::{FnTask, RunStats};

/// IEEE total order.
fn cmp<T: Real>(a: &T, b: &T) -> Ordering {
    a.to_f64().total_cmp(&b.to_f64())
}

/// A sample or splitter: a value and where it stands, compared by (value, run, position).
#[derive(Clone, Copy)]
struct Key<T> {
    value: T,
    run: usize,
    pos: u64,
}

fn key_cmp<T: Real>(a: &Key<T>, b: &Key<T>) -> Ordering {
    cmp(&a.value, &b.value).then(a.run.cmp(&b.run)).then(a.pos.cmp(&b.pos))
}

/// Elements per task: a task holds its input and output, and `max_tasks_in_flight` tasks run
/// at once.
fn chunk_elements<T>(runtime: &Runtime) -> u64 {
    let o = runtime.options();
    let task_bytes = o.memory_budget_bytes / (o.max_tasks_in_flight.max(1) as u64);
    (task_bytes / (2 * std::mem::size_of::<T>() as u64)).max(2)
}

/// Sorts `data` in place. Returns the statistics of both phases added up.
pub fn sort<T: Real>(runtime: &Runtime, data: &FlashPtr<T>) -> Result<RunStats> {
    let n = data.len();
    let chunk = chunk_elements::<T>(runtime);
    if n <= 1 {
        return Ok(RunStats::default());
    }
    let runs: Vec<(u64, u64)> = (0..n.div_ceil(chunk)).map(|i| (i * chunk, ((i + 1) * chunk).min(n))).collect();
    let k = runs.len() as u64;
    // Partitions of about chunk/2 elements; samples spaced so that runs * spacing <= chunk/2.
    let parts = n.div_ceil((chunk / 2).max(1)).max(1);
    let spacing = (chunk / (2 * k)).max(1);
    let scratch = FlashPtr::<T>::scratch(runtime.dir(), n, &runtime.file_options())?;

    // Phase 1: sorted runs and their samples.
    let samples: Mutex<Vec<Key<T>>> = Mutex::new(Vec::new());
    let stats1 = {
        let dag = runtime.dag();
        for (run, &(lo, hi)) in runs.iter().enumerate() {
            let samples = &samples;
            let accesses = vec![Access::read(data.access(lo, hi - lo)?), Access::write(scratch.access(lo, hi - lo)?)];
            dag.add(
                FnTask::new("sort-run", accesses, move |buffers, _| {
                    let input = buffers.read::<T>(0);
                    let out = buffers.take_write::<T>(1);
                    out.copy_from_slice(input);
                    out.sort_unstable_by(cmp);
                    let mine: Vec<Key<T>> = (0..out.len() as u64).step_by(spacing as usize).map(|pos| Key { value: out[pos as usize], run, pos }).collect();
                    samples.lock().expect("sort samples lock poisoned").extend(mine);
                    Ok(())
                }),
                &[],
            )?;
        }
        dag.run()?
    };
    let mut samples = samples.into_inner().expect("sort samples lock poisoned");
    samples.sort_unstable_by(key_cmp);
    let splitters: Vec<Key<T>> = (1..parts).map(|p| samples[(p * samples.len() as u64 / parts) as usize]).collect();

    // Exact cut of each run at each splitter: the first position whose key is not below it.
    // Samples bound the position to one spacing; that stretch is read and searched.
    let mut per_run_samples: Vec<Vec<(T, u64)>> = vec![Vec::new(); runs.len()];
    for s in &samples {
        per_run_samples[s.run].push((s.value, s.pos));
    }
    for v in &mut per_run_samples {
        v.sort_unstable_by_key(|&(_, pos)| pos);
    }
    let mut cuts = vec![vec![0u64; splitters.len() + 2]; runs.len()];
    let mut stretch = Vec::new();
    for (run, &(lo, hi)) in runs.iter().enumerate() {
        let len = hi - lo;
        cuts[run][splitters.len() + 1] = len;
        for (p, sp) in splitters.iter().enumerate() {
            let below = |value: &T, pos: u64| key_cmp(&Key { value: *value, run, pos }, sp) == Ordering::Less;
            let rs = &per_run_samples[run];
            // Samples below the splitter form a prefix (keys increase along a run).
            let below_count = rs.partition_point(|(v, pos)| below(v, *pos));
            let cut = if below_count == 0 {
                0
            } else {
                let from = rs[below_count - 1].1 + 1;
                let to = if below_count < rs.len() { rs[below_count].1 } else { len };
                if from >= to {
                    from
                } else {
                    stretch.resize((to - from) as usize, T::ZERO);
                    scratch.read(lo + from, &mut stretch)?;
                    from + stretch.iter().enumerate().take_while(|(i, v)| below(v, from + *i as u64)).count() as u64
                }
            };
            cuts[run][p + 1] = cut;
        }
    }

    // Phase 2: merge every partition into its place in `data`.
    let max_part = 2 * chunk;
    let stats2 = {
        let dag = runtime.dag();
        let mut out_at = 0u64;
        for p in 0..=splitters.len() {
            let mut accesses = Vec::new();
            let mut total = 0u64;
            for (run, &(lo, _)) in runs.iter().enumerate() {
                let (a, b) = (cuts[run][p], cuts[run][p + 1]);
                if b > a {
                    accesses.push(Access::read(scratch.access(lo + a, b - a)?));
                    total += b - a;
                }
            }
            if total == 0 {
                continue;
            }
            if total > max_part {
                return Err(FlashError::invalid(format!("sort: partition {p} has {total} elements, over its bound {max_part} (a bug)")));
            }
            let inputs = accesses.len();
            accesses.push(Access::write(data.access(out_at, total)?));
            out_at += total;
            dag.add(
                FnTask::new("sort-merge", accesses, move |buffers, _| {
                    let out = buffers.take_write::<T>(inputs);
                    let mut at = 0;
                    for i in 0..inputs {
                        let seg = buffers.read::<T>(i);
                        out[at..at + seg.len()].copy_from_slice(seg);
                        at += seg.len();
                    }
                    // The concatenation is `inputs` sorted runs: a stable sort merges them in
                    // O(m log inputs) (it detects the runs).
                    out.sort_by(cmp);
                    Ok(())
                }),
                &[],
            )?;
        }
        debug_assert_eq!(out_at, n);
        dag.run()?
    };
    Ok(stats1.add(&stats2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_support::random_vec;
    use crate::runtime::RuntimeOptions;

    #[test]
    fn flash_sort_matches_std_sort_within_budget() {
        let budget = 16 << 10;
        let rt = Runtime::new(RuntimeOptions { memory_budget_bytes: budget, compute_threads: 2, io_threads: 2, max_tasks_in_flight: 3, ..RuntimeOptions::default() }).unwrap();
        for &n in &[0usize, 1, 2, 17, 1000, 20_011] {
            for dup in [false, true] {
                let mut v = random_vec::<f64>(n as u64 + 3, n);
                if dup {
                    // Heavy duplicates: most values equal, some NaN and infinities.
                    for (i, x) in v.iter_mut().enumerate() {
                        *x = match i % 7 {
                            0 => f64::NAN,
                            1 => f64::NEG_INFINITY,
                            2 => f64::INFINITY,
                            3 | 4 | 5 => 0.5,
                            _ => *x,
                        };
                    }
                }
                let p = FlashPtr::from_slice(rt.dir(), &v, &rt.file_options()).unwrap();
                let stats = sort(&rt, &p).unwrap();
                assert!(stats.cache.peak_resident_bytes <= budget);
                v.sort_by(|a, b| a.total_cmp(b));
                let got = p.to_vec().unwrap();
                assert_eq!(got.len(), v.len());
                assert!(got.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits()), "n={n} dup={dup}");
            }
        }
        let v = random_vec::<f32>(9, 50_000);
        let p = FlashPtr::from_slice(rt.dir(), &v, &rt.file_options()).unwrap();
        sort(&rt, &p).unwrap();
        let mut want = v.clone();
        want.sort_by(|a, b| a.total_cmp(b));
        assert_eq!(p.to_vec().unwrap(), want);
    }
}
