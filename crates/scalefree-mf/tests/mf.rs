use std::io::Write;
use std::path::{Path, PathBuf};

use scalefree_mf::data::{self, read_ratings};
use scalefree_mf::kernel::{sgd_block, sgd_block_scalar, Entry, Factors, Schedule, SgdParams};
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

#[test]
fn kernel_matches_scalar_reference() {
    for &k in &[1usize, 7, 8, 13, 40] {
        for sched in [Schedule::Constant, Schedule::Adagrad] {
            let (m, n) = (9, 11);
            let mut rng = Rng::new(k as u64);
            let block: Vec<Entry> = (0..300).map(|_| Entry { u: rng.below(m) as u32, i: rng.below(n) as u32, r: 1.0 + 4.0 * rng.unit_f32() }).collect();
            let mut p: Vec<f32> = (0..m * k).map(|_| rng.unit_f32() * 0.5).collect();
            let mut q: Vec<f32> = (0..n * k).map(|_| rng.unit_f32() * 0.5).collect();
            let (mut pg, mut qg) = (vec![1f32; m], vec![1f32; n]);
            let (mut p2, mut q2, mut pg2, mut qg2) = (p.clone(), q.clone(), pg.clone(), qg.clone());
            let prm = SgdParams { k, eta: 0.05, lambda: 0.05, schedule: sched };
            let f = Factors { p: p.as_mut_ptr(), q: q.as_mut_ptr(), pg: pg.as_mut_ptr(), qg: qg.as_mut_ptr() };
            let l1 = unsafe { sgd_block(&block, f, &prm) };
            let l2 = sgd_block_scalar(&block, &mut p2, &mut q2, &mut pg2, &mut qg2, &prm);
            assert!((l1 - l2).abs() <= 1e-3 * l2.max(1.0), "k={k} {sched:?}: {l1} vs {l2}");
            for (a, b) in p.iter().chain(&q).zip(p2.iter().chain(&q2)) {
                assert!((a - b).abs() <= 1e-3 * (1.0 + b.abs()), "k={k} {sched:?}: {a} vs {b}");
            }
        }
    }
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
        assert!((m.rmse(&te) - after).abs() < 1e-6);
        let d = tmpdir("model");
        let path = d.join("m.sfmf");
        m.save(&path).unwrap();
        let m2 = Model::load(&path).unwrap();
        assert_eq!(m, m2);
        let ids_u: Vec<u64> = te.users.iter().map(|&u| te.user_ids[u as usize]).collect();
        let ids_i: Vec<u64> = te.items.iter().map(|&i| te.item_ids[i as usize]).collect();
        let pr = m2.predict(&ids_u, &ids_i).unwrap();
        let rm = (pr.iter().zip(&te.values).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / te.len() as f64).sqrt();
        assert!((rm - after).abs() < 1e-4);
        assert_eq!(m2.predict(&[u64::MAX], &[0]).unwrap()[0], m2.mean);
        std::fs::write(&path, b"garbage").unwrap();
        assert!(Model::load(&path).is_err());
    }
}

#[test]
fn bad_options_are_errors() {
    let r = synthetic(10, 10, 50, 2);
    assert!(LocalTrainer::new(&r, &LocalOptions { k: 0, ..Default::default() }).is_err());
    assert!(LocalTrainer::new(&r, &LocalOptions { threads: 4, blocks: Some(3), ..Default::default() }).is_err());
    assert!(LocalTrainer::new(&Ratings::default(), &LocalOptions::default()).is_err());
}
