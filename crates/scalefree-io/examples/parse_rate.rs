//! Parse rate of the edge-list reader on a seeded SNAP-style file (64M edges by default).
//!
//! `cargo run --release -p scalefree-io --example parse_rate -- [PATH] [EDGES]`
//!
//! Writes PATH (and PATH.gz) once if missing; the files are read once before timing (page
//! cache warm, so this measures parsing, not the disk). Rows: one rank of 1 (the whole
//! file), each rank of 2, the same file through a naive `split_whitespace` + `parse` loop
//! (peer row), and the gzip path (every rank decompresses everything).

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use scalefree_io::{read_edges_share, EdgeOptions, Part, ReadOptions};

fn generate(path: &Path, edges: u64) {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut s = 42u64;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    writeln!(w, "# seeded SNAP-style edge list, {edges} edges\n# FromNodeId\tToNodeId").unwrap();
    for _ in 0..edges {
        let (a, b) = (next() % (1 << 26), next() % (1 << 26));
        writeln!(w, "{a}\t{b}").unwrap();
    }
    w.flush().unwrap();
}

fn warm(path: &Path) -> u64 {
    let mut f = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).unwrap();
        if k == 0 {
            break n;
        }
        n += k as u64;
    }
}

/// Best of three: seconds and edges.
fn time(mut f: impl FnMut() -> usize) -> (f64, usize) {
    let mut best = f64::MAX;
    let mut n = 0;
    for _ in 0..3 {
        let t = Instant::now();
        n = f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    (best, n)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = PathBuf::from(args.get(1).cloned().unwrap_or_else(|| "/tmp/scalefree-io-edges.txt".into()));
    let edges: u64 = args.get(2).map(|s| s.parse().unwrap()).unwrap_or(64 << 20);
    let gz = path.with_extension("txt.gz");
    if !path.exists() {
        generate(&path, edges);
    }
    if !gz.exists() {
        let mut e = flate2::write::GzEncoder::new(BufWriter::new(std::fs::File::create(&gz).unwrap()), flate2::Compression::fast());
        std::io::copy(&mut std::fs::File::open(&path).unwrap(), &mut e).unwrap();
        e.finish().unwrap();
    }
    let bytes = warm(&path);
    let gz_bytes = warm(&gz);
    let mb = bytes as f64 / 1e6;
    let o = ReadOptions::default();
    let eo = EdgeOptions::default();
    println!("file {} ({mb:.0} MB, gzip {:.0} MB)", path.display(), gz_bytes as f64 / 1e6);
    let (t, n) = time(|| read_edges_share(&path, Part::whole(), &eo, &o).unwrap().src.len());
    println!("{:<34} {n:>10} edges {t:>7.3} s {:>7.0} MB/s", "plain, rank 0 of 1", mb / t);
    for rank in 0..2 {
        let (t, n) = time(|| read_edges_share(&path, Part::new(rank, 2, 0).unwrap(), &eo, &o).unwrap().src.len());
        println!("{:<34} {n:>10} edges {t:>7.3} s {:>7.0} MB/s of its half", format!("plain, rank {rank} of 2"), mb / 2.0 / t);
    }
    let map = unsafe { memmap2::Mmap::map(&std::fs::File::open(&path).unwrap()).unwrap() };
    let (t, n) = time(|| {
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for line in std::str::from_utf8(&map).unwrap().lines() {
            if line.starts_with('#') {
                continue;
            }
            let mut f = line.split_whitespace();
            src.push(f.next().unwrap().parse::<i64>().unwrap());
            dst.push(f.next().unwrap().parse::<i64>().unwrap());
        }
        src.len()
    });
    println!("{:<34} {n:>10} edges {t:>7.3} s {:>7.0} MB/s", "peer: lines + split_whitespace", mb / t);
    for (rank, size) in [(0, 1), (0, 2), (1, 2)] {
        let (t, n) = time(|| read_edges_share(&gz, Part::new(rank, size, 0).unwrap(), &eo, &o).unwrap().src.len());
        println!("{:<34} {n:>10} edges {t:>7.3} s {:>7.0} MB/s of the text", format!("gzip, rank {rank} of {size}"), mb / t);
    }
}
