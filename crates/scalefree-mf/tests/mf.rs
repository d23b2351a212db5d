use std::io::Write;
use std::path::{Path, PathBuf};

use scalefree_mf::data::{self, read_ratings};
use scalefree_mf::kernel::{padded_k, sgd_block, sgd_block_ld, sgd_block_scalar, Entry, Factors, Isa, Schedule, SgdParams};
use scalefree_mf::rng::Rng;
use scalefree_mf::{LocalOptions, LocalTrainer, MfError, Model, Ratings};

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sfmf-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

fn expected() -> Ratings {
    Ratings::from_triples(&[1, 2, 1], &[10, 10, 30], &[4.0, 3.5, 1.0]).unwrap()
}

#[test]
fn readers_agree_across_formats() {
    let d = tmpdir("fmt");
    let files = [
        write(&d, "u.data", "1\t10\t4\t881250949\n2\t10\t3.5\t1\n1\t30\t1\t2\n"),
        write(&d, "ratings.dat", "1::10::4::881250949\n2::10::3.5::1\n1::30::1::2\n"),
        write(&d, "ratings.csv", "userId,movieId,rating,timestamp\n1,10,4,1\n2,10,3.5,1\n1,30,1.0,2\n"),
        write(&d, "libmf.txt", "1 10 4\n2 10 3.5\n\n1 30 1\n"),
        write(&d, "m.mtx", "%%MatrixMarket matrix coordinate real general\n% c\n2 30 3\n1 10 4\n2 10 3.5\n1 30 1\n"),
    ];
    for f in &files {
        assert_eq!(read_ratings(f).unwrap(), expected(), "{}", f.display());
        // gzip of each
        let gz = d.join(format!("{}.gz", f.file_name().unwrap().to_string_lossy()));
        let mut e = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::fast());
        e.write_all(&std::fs::read(f).unwrap()).unwrap();
        e.finish().unwrap();
        assert_eq!(read_ratings(&gz).unwrap(), expected(), "{}", gz.display());
    }
}

fn err_of(body: &str) -> String {
    let d = tmpdir("bad");
    let p = write(&d, "bad.txt", body);
    let e = read_ratings(&p).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("bad.txt"), "{s}");
    s
}

#[test]
fn malformed_inputs_name_file_and_line() {
    assert!(err_of("1 2 3\n1 2\n").contains(":2:"));
    assert!(err_of("1 2 3\n1 2 nan\n").contains(":2: rating"));
    assert!(err_of("1 2 3\n1 2 3\n-4 2 3\n").contains(":3: negative user"));
    assert!(err_of("1 99999999999999999999999 3\n").contains(":1: item id"));
    assert!(err_of("1 2 x\n").contains(":1: rating"));
    assert!(err_of("").contains("empty"));
    assert!(err_of("# only a comment\n").contains("empty"));
    let d = tmpdir("missing");
    assert!(matches!(read_ratings(&d.join("nope.txt")), Err(MfError::Io { .. })));
}

#[test]
fn cache_round_trip_and_split() {
    let d = tmpdir("cache");
    let mut body = String::new();
    let mut rng = Rng::new(3);
    for _ in 0..1000 {
        body += &format!("{} {} {}\n", rng.below(50), rng.below(70) + 1000, rng.below(5) + 1);
    }
    let p = write(&d, "r.txt", &body);
    let a = data::load(&p, Some(&d.join("c"))).unwrap();
    let cp = data::cache_path(&p, &d.join("c")).unwrap();
    assert!(cp.exists());
    let b = data::load(&p, Some(&d.join("c"))).unwrap();
    assert_eq!(a, b);
    assert_eq!(data::decode(&data::encode(&a), &cp).unwrap(), a);
    assert!(data::decode(&data::encode(&a)[..100], &cp).is_err());
    let (tr, te) = a.split(0.1, 0).unwrap();
    assert_eq!(tr.len() + te.len(), 1000);
    assert_eq!(te.len(), 100);
    assert_eq!(a.split(0.1, 0).unwrap(), (tr.clone(), te.clone()));
    assert_ne!(a.split(0.1, 1).unwrap().1, te);
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (n, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-3 * (1.0 + y.abs()), "{what}: element {n}: {x} vs {y}");
    }
}

/// Every kernel build this CPU runs, unpadded (`sgd_block`) and on padded rows
/// (`sgd_block_ld`), against the scalar reference: ranks around the SIMD widths, odd block
/// sizes, empty blocks, both step-size rules.
#[test]
fn kernel_matches_scalar_reference() {
    let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.available()).collect();
    for &k in &[1usize, 7, 8, 13, 16, 24, 40, 64, 100, 136] {
        for &nr in &[0usize, 1, 7, 300] {
            for sched in [Schedule::Constant, Schedule::Adagrad, Schedule::AdagradSplit { slow_only: false }, Schedule::AdagradSplit { slow_only: true }] {
                let (m, n) = (9, 11);
                let mut rng = Rng::new(k as u64 * 1000 + nr as u64);
                let block: Vec<Entry> = (0..nr).map(|_| Entry { u: rng.below(m) as u32, i: rng.below(n) as u32, r: 1.0 + 4.0 * rng.unit_f32() }).collect();
                let p: Vec<f32> = (0..m * k).map(|_| rng.unit_f32() * 0.5).collect();
                let q: Vec<f32> = (0..n * k).map(|_| rng.unit_f32() * 0.5).collect();
                let apr = sched.acc_per_row();
                let pg: Vec<f32> = (0..m * apr).map(|_| 1.0 + rng.unit_f32()).collect();
                let qg: Vec<f32> = (0..n * apr).map(|_| 1.0 + rng.unit_f32()).collect();
                let (mut p2, mut q2, mut pg2, mut qg2) = (p.clone(), q.clone(), pg.clone(), qg.clone());
                let prm = SgdParams { k, eta: 0.05, lambda: 0.05, schedule: sched };
                let want = sgd_block_scalar(&block, &mut p2, &mut q2, &mut pg2, &mut qg2, &prm);
                let loss_ok = |l: f64, what: &str| assert!((l - want).abs() <= 1e-3 * want.max(1.0), "{what}: loss {l} vs {want}");

                // Unpadded rows (the entry point the multi-rank modes use).
                let (mut p1, mut q1, mut pg1, mut qg1) = (p.clone(), q.clone(), pg.clone(), qg.clone());
                let f = Factors { p: p1.as_mut_ptr(), q: q1.as_mut_ptr(), pg: pg1.as_mut_ptr(), qg: qg1.as_mut_ptr() };
                let what = format!("sgd_block k={k} n={nr} {sched:?}");
                loss_ok(unsafe { sgd_block(&block, f, &prm) }, &what);
                close(&p1, &p2, &what);
                close(&q1, &q2, &what);
                close(&pg1, &pg2, &what);
                close(&qg1, &qg2, &what);

                // Padded rows with each build; the padding must stay zero.
                for &isa in &isas {
                    for extra in [0usize, 8] {
                        let ld = padded_k(k) + extra;
                        let pad = |a: &[f32], rows: usize| -> Vec<f32> {
                            let mut out = vec![0f32; rows * ld];
                            for r in 0..rows {
                                out[r * ld..r * ld + k].copy_from_slice(&a[r * k..r * k + k]);
                            }
                            out
                        };
                        let unpad = |a: &[f32]| -> Vec<f32> { a.chunks_exact(ld).flat_map(|r| r[..k].to_vec()).collect() };
                        let (mut pp, mut qp, mut pg1, mut qg1) = (pad(&p, m), pad(&q, n), pg.clone(), qg.clone());
                        let f = Factors { p: pp.as_mut_ptr(), q: qp.as_mut_ptr(), pg: pg1.as_mut_ptr(), qg: qg1.as_mut_ptr() };
                        let what = format!("{isa:?} ld={ld} k={k} n={nr} {sched:?}");
                        loss_ok(unsafe { sgd_block_ld(&block, f, &prm, ld, isa) }, &what);
                        close(&unpad(&pp), &p2, &what);
                        close(&unpad(&qp), &q2, &what);
                        close(&pg1, &pg2, &what);
                        close(&qg1, &qg2, &what);
                        for row in pp.chunks_exact(ld).chain(qp.chunks_exact(ld)) {
                            assert!(row[k..].iter().all(|&x| x == 0.0), "{what}: padding changed");
                        }
                    }
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "row stride")]
fn kernel_rejects_a_short_stride() {
    let (mut p, mut q, mut pg, mut qg) = (vec![0f32; 40], vec![0f32; 40], vec![1f32; 1], vec![1f32; 1]);
    let f = Factors { p: p.as_mut_ptr(), q: q.as_mut_ptr(), pg: pg.as_mut_ptr(), qg: qg.as_mut_ptr() };
    let prm = SgdParams { k: 5, eta: 0.1, lambda: 0.05, schedule: Schedule::Adagrad };
    let _ = unsafe { sgd_block_ld(&[Entry { u: 0, i: 0, r: 1.0 }], f, &prm, 5, Isa::Portable) };
}

fn synthetic(m: usize, n: usize, nnz: usize, seed: u64) -> Ratings {
    let mut rng = Rng::new(seed);
    let k = 4;
    let pu: Vec<f32> = (0..m * k).map(|_| rng.unit_f32()).collect();
    let qi: Vec<f32> = (0..n * k).map(|_| rng.unit_f32()).collect();
    let (mut us, mut is, mut vs) = (vec![], vec![], vec![]);
    for _ in 0..nnz {
        let (u, i) = (rng.below(m), rng.below(n));
        let v: f32 = (0..k).map(|d| pu[u * k + d] * qi[i * k + d]).sum();
        us.push(u as u64);
        is.push(i as u64);
        vs.push(v + 0.05 * (rng.unit_f32() - 0.5));
    }
    Ratings::from_triples(&us, &is, &vs).unwrap()
}

#[test]
fn local_training_learns_low_rank_and_model_round_trips() {
    let r = synthetic(200, 150, 20_000, 1);
    let (tr, te) = r.split(0.1, 0).unwrap();
    for threads in [1, 2, 3] {
        let mut t = LocalTrainer::new(&tr, &LocalOptions { k: 8, threads, lambda: 0.01, ..Default::default() }).unwrap();
        let before = t.rmse(&te).unwrap();
        for _ in 0..30 {
            t.epoch();
        }
        let after = t.rmse(&te).unwrap();
        assert!(after < 0.2 && after < before / 2.0, "threads={threads}: {before} -> {after}");
        let m = t.model();
        assert!((m.rmse(&te).unwrap() - after).abs() < 1e-6);
        let d = tmpdir("model");
        let path = d.join("m.sfmf");
        m.save(&path).unwrap();
        let m2 = Model::load(&path).unwrap();
        assert_eq!(m, m2);
        let ids_u: Vec<u64> = te.users.iter().map(|u| te.user_ids[u as usize]).collect();
        let ids_i: Vec<u64> = te.items.iter().map(|i| te.item_ids[i as usize]).collect();
        let pr = m2.predict(&ids_u, &ids_i).unwrap();
        let rm = (pr.iter().zip(&te.values).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / te.len() as f64).sqrt();
        assert!((rm - after).abs() < 1e-4);
        assert_eq!(m2.predict(&[u64::MAX], &[0]).unwrap()[0], m2.mean);
        std::fs::write(&path, b"garbage").unwrap();
        assert!(Model::load(&path).is_err());
    }
}

/// Every epoch runs each block exactly once, whatever the threads and with no barrier between
/// epochs (the run counts of all blocks equal the epochs done), the per-epoch losses fall, and
/// 1 thread is bit-for-bit repeatable across calls cut differently (the block orders derive
/// from the seed and the epoch number alone).
#[test]
fn each_epoch_runs_every_block_once() {
    let r = synthetic(120, 90, 6_000, 3);
    for threads in [1, 2, 3, 5] {
        let o = LocalOptions { k: 8, threads, lambda: 0.01, ..Default::default() };
        let mut t = LocalTrainer::new(&r, &o).unwrap();
        let mut losses = t.run_epochs(3);
        losses.extend(t.run_epochs(4));
        assert_eq!(losses.len(), 7);
        assert!(losses[6] < losses[0], "threads={threads}: {losses:?}");
        let s = t.state();
        assert!(s.counts.iter().all(|&c| c == 7), "threads={threads}: {:?}", s.counts);
        assert_eq!(s.epochs, 7);
        if threads == 1 {
            let mut a = LocalTrainer::new(&r, &o).unwrap();
            let la = a.run_epochs(7);
            assert_eq!(la, losses);
            assert_eq!(a.state().p, s.p);
        }
    }
}

/// 1, 2 and 3 threads (and every kernel build) reach nearly the same test RMSE: the block
/// scheduling changes the order of updates, not what is learned.
#[test]
fn threads_and_kernel_builds_agree() {
    let r = synthetic(300, 200, 30_000, 5);
    let (tr, te) = r.split(0.1, 1).unwrap();
    let mut seen = vec![];
    for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable].into_iter().filter(|i| i.available()) {
        for threads in [1, 2, 3] {
            for k in [7, 16] {
                let mut t = LocalTrainer::new(&tr, &LocalOptions { k, threads, lambda: 0.01, isa: Some(isa), ..Default::default() }).unwrap();
                assert_eq!(t.isa(), isa);
                for _ in 0..20 {
                    t.epoch();
                }
                seen.push((k, format!("{isa:?} threads={threads} k={k}"), t.rmse(&te).unwrap()));
            }
        }
    }
    // Compared within each k (a different rank learns a different model).
    for (k, what, rmse) in &seen {
        let best = seen.iter().filter(|s| s.0 == *k).map(|s| s.2).fold(f64::INFINITY, f64::min);
        assert!(*rmse < 0.1 && *rmse <= best * 1.1, "{what}: RMSE {rmse} (best {best}); all: {seen:?}");
    }
}

#[test]
fn bad_options_are_errors() {
    let r = synthetic(10, 10, 50, 2);
    assert!(LocalTrainer::new(&r, &LocalOptions { k: 0, ..Default::default() }).is_err());
    assert!(LocalTrainer::new(&r, &LocalOptions { threads: 4, blocks: Some(3), ..Default::default() }).is_err());
    assert!(LocalTrainer::new(&Ratings::default(), &LocalOptions::default()).is_err());
}

/// Out of core: the blocks on flash, read through the flash runtime's program cache at a
/// quarter of the records. Each pass starts with the blocks the previous one ended with (the
/// carry: as many as the budget holds beside the reads in flight); one thread: the losses and
/// the model equal those of the in-memory run given the same carry bit for bit, and the
/// in-memory default (no carry) reaches nearly the same loss; more threads: every block still
/// runs once per epoch, the cache stays within the budget; a budget below one block per thread
/// is refused up front.
#[test]
fn out_of_core_local_training_is_the_in_memory_run() {
    let r = synthetic(300, 200, 30_000, 5);
    let budget = (r.len() * 12 / 4) as u64;
    for threads in [1, 2, 3] {
        let o = LocalOptions { k: 8, threads, lambda: 0.01, ..Default::default() };
        let mut disk = LocalTrainer::new(&r, &LocalOptions { memory_budget: Some(budget), ..o.clone() }).unwrap();
        // 400 blocks of 4 KiB (whole pages) in 90,000 bytes: 21 held, less 2 per IO thread (8
        // unless SCALEFREE_FLASH_IO_THREADS says otherwise) and 1 per thread.
        assert!(disk.carry() > 0 && disk.carry() <= 21 - threads, "threads={threads}: {}", disk.carry());
        let mut mem = LocalTrainer::new(&r, &LocalOptions { carry: Some(disk.carry()), ..o.clone() }).unwrap();
        let mut plain = LocalTrainer::new(&r, &o).unwrap();
        assert!(disk.out_of_core() && !mem.out_of_core() && plain.carry() == 0);
        let lm = mem.run_epochs(3);
        let ld = disk.try_run_epochs(3).unwrap();
        let lp = plain.run_epochs(3);
        if threads == 1 {
            assert_eq!(lm, ld);
            assert_eq!(mem.model(), disk.model());
            assert_ne!(lp, ld, "the carry changes the order of the passes after the first");
        }
        assert!((lp[2] - ld[2]).abs() <= 0.05 * lp[2], "threads={threads}: {lp:?} {ld:?}");
        assert!(disk.state().counts.iter().all(|&c| c == 3), "threads={threads}");
        let s = disk.flash_stats().unwrap();
        assert!(s.cache.peak_resident_bytes <= budget && s.cache.bytes_prefetched > 0, "{s:?}");
    }
    // At half the records 43 blocks fit: each pass after the first reads only the blocks it did
    // not carry over (when the call returns, the next pass's may be read ahead too: at most the
    // blocks the budget holds beside the carried ones).
    let half = budget * 2;
    let mut disk = LocalTrainer::new(&r, &LocalOptions { k: 8, threads: 1, lambda: 0.01, memory_budget: Some(half), ..Default::default() }).unwrap();
    disk.try_run_epochs(3).unwrap();
    let (c, held) = (disk.carry() as u64, half / 4096);
    let read = disk.flash_stats().unwrap().cache.bytes_prefetched / 4096;
    assert!(c >= held / 2 && 1200 - 2 * c <= read && read <= 1200 - 3 * c + held, "carry {c}, {read} blocks read");
    let o = LocalOptions { k: 8, threads: 2, memory_budget: Some(4096), ..Default::default() };
    assert!(matches!(LocalTrainer::new(&r, &o), Err(MfError::OutOfBudget(_))));
}

/// Out of core, one pass per call (as `mf train` calls it) with the next pass's blocks read
/// ahead across calls, and a state restored from an earlier pass (which drops what was read
/// ahead): one thread still gives the in-memory run bit for bit.
#[test]
fn out_of_core_passes_read_ahead_across_calls_and_restores() {
    let r = synthetic(300, 200, 30_000, 5);
    let budget = (r.len() * 12 / 4) as u64;
    let o = LocalOptions { k: 8, threads: 1, lambda: 0.01, ..Default::default() };
    let mut disk = LocalTrainer::new(&r, &LocalOptions { memory_budget: Some(budget), ..o.clone() }).unwrap();
    let o = LocalOptions { carry: Some(disk.carry()), ..o };
    let mut mem = LocalTrainer::new(&r, &o).unwrap();
    let saved = (mem.run_epochs(2), disk.try_run_epochs(1).unwrap(), disk.try_run_epochs(1).unwrap());
    assert_eq!(saved.0, [saved.1[0], saved.2[0]]);
    let at2 = disk.state();
    for _ in 0..2 {
        assert_eq!(mem.run_epochs(1), disk.try_run_epochs(1).unwrap());
    }
    assert_eq!(mem.model(), disk.model());
    disk.set_state(at2).unwrap(); // back to pass 2: the passes read ahead for pass 4 are dropped
    let mut again = LocalTrainer::new(&r, &o).unwrap();
    again.run_epochs(2);
    assert_eq!(again.run_epochs(2), disk.try_run_epochs(2).unwrap());
    assert_eq!(again.model(), disk.model());
    assert!(disk.flash_stats().unwrap().cache.peak_resident_bytes <= budget);
}
