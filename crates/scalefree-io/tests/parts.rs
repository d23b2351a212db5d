//! Part directories, delimiters and headers, and gzip files split by members (many members,
//! BGZF blocks): for P = 1..=5 the shares of all ranks together hold every edge once, and
//! bad input is one line naming the file and line.

use std::io::Write;
use std::path::PathBuf;

use scalefree_io::{read_edges_share, read_ratings_share, read_svmlight_share, Delimiter, EdgeOptions, Header, Part, ReadOptions};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("scalefree-io-parts-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gz_member(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// `bytes` as gzip members cut at the byte offsets `cuts` (anywhere, not at line ends).
fn gz_members(bytes: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
        out.extend(gz_member(&bytes[at..c]));
        at = c;
    }
    out
}

/// One BGZF block of `b` (a gzip member with the `BC` extra field holding its size).
fn bgzf_block(b: &[u8]) -> Vec<u8> {
    let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    d.write_all(b).unwrap();
    let deflated = d.finish().unwrap();
    let total = 18 + deflated.len() + 8;
    let mut out = vec![0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 6, 0, b'B', b'C', 2, 0];
    out.extend(((total - 1) as u16).to_le_bytes());
    out.extend(deflated);
    let mut crc = flate2::Crc::new();
    crc.update(b);
    out.extend(crc.sum().to_le_bytes());
    out.extend((b.len() as u32).to_le_bytes());
    out
}

/// `bytes` as BGZF: blocks of `block` bytes of text, then the empty end block.
fn bgzf(bytes: &[u8], block: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in bytes.chunks(block.max(1)) {
        out.extend(bgzf_block(c));
    }
    out.extend(bgzf_block(b""));
    out
}

fn edges(rng: &mut Rng, n: usize) -> Vec<(i64, i64)> {
    (0..n).map(|_| (rng.below(1 << 20) as i64, rng.below(1000) as i64)).collect()
}

fn text(e: &[(i64, i64)], sep: &str, header: Option<&str>) -> String {
    let mut s = header.map(|h| format!("{h}\n")).unwrap_or_default();
    for (a, b) in e {
        s.push_str(&format!("{a}{sep}{b}\n"));
    }
    s
}

fn all_shares(path: &std::path::Path, size: usize, o: &ReadOptions) -> Result<Vec<(i64, i64)>, String> {
    let mut got = Vec::new();
    for rank in 0..size {
        let e = read_edges_share(path, Part::new(rank, size, 0).unwrap(), &EdgeOptions::default(), o).map_err(|e| e.to_string())?;
        got.extend(e.src.into_iter().zip(e.dst));
    }
    Ok(got)
}

fn sorted(mut v: Vec<(i64, i64)>) -> Vec<(i64, i64)> {
    v.sort();
    v
}

#[test]
fn delimiters_and_headers() {
    let dir = Dir::new("dialect");
    let mut rng = Rng(7);
    let e = edges(&mut rng, 57);
    for (sep, header) in [(",", Some("src,dst")), (";", Some("from;to")), ("\t", None), (" ", Some("src dst")), (" , ", None), (",", None)] {
        let p = dir.path("e.csv");
        std::fs::write(&p, text(&e, sep, header)).unwrap();
        for size in 1..=5 {
            assert_eq!(all_shares(&p, size, &ReadOptions::default()).unwrap(), e, "sep {sep:?} header {header:?} P={size}");
        }
    }
    // Overrides: --header yes skips a numeric first line; --header no reads it.
    let p = dir.path("h.txt");
    std::fs::write(&p, "1,2\n3,4\n").unwrap();
    let o = ReadOptions { header: Header::Present, ..ReadOptions::default() };
    assert_eq!(all_shares(&p, 1, &o).unwrap(), [(3, 4)]);
    let o = ReadOptions { header: Header::Absent, ..ReadOptions::default() };
    std::fs::write(&p, "src,dst\n3,4\n").unwrap();
    let err = all_shares(&p, 1, &o).unwrap_err();
    assert!(err.ends_with("h.txt:1: 'src' is not an integer vertex id"), "{err}");
    // A given delimiter that the file does not use: a wrong field count, with the line.
    let o = ReadOptions { delimiter: Some(Delimiter::Semicolon), ..ReadOptions::default() };
    std::fs::write(&p, "1;2\n3,4\n").unwrap();
    let err = all_shares(&p, 1, &o).unwrap_err();
    assert!(err.ends_with("h.txt:2: expected 2 fields (from to), found 1: '3,4'"), "{err}");
    // Ambiguous: every rank reports the same line.
    std::fs::write(&p, "# c\n1,2;3\n4,5\n").unwrap();
    for size in 1..=3 {
        for rank in 0..size {
            let err = read_edges_share(&p, Part::new(rank, size, 0).unwrap(), &EdgeOptions::default(), &ReadOptions::default()).unwrap_err().to_string();
            assert!(err.contains("h.txt:2: ambiguous delimiter: '1,2;3' holds both ',' and ';' (pass --delimiter)"), "{err}");
        }
    }
    // Ratings and svmlight read headers too.
    std::fs::write(&p, "user;item;rating\n1;2;3.5\n4;5;1\n").unwrap();
    let r = read_ratings_share(&p, Part::whole(), &ReadOptions::default()).unwrap();
    assert_eq!((r.users, r.items, r.ratings), (vec![1, 4], vec![2, 5], vec![3.5, 1.0]));
    std::fs::write(&p, "label features\n1 3:0.5\n-1 2:1\n").unwrap();
    let s = read_svmlight_share(&p, Part::whole(), 100, &ReadOptions::default()).unwrap();
    assert_eq!(s.labels, [1.0, -1.0]);
}

/// A random part directory: the edges cut into parts, each plain, one gzip stream, several
/// members or BGZF, each with the header (or none), plus markers that are not read.
#[test]
fn part_directories_are_one_body() {
    let mut rng = Rng(11);
    for case in 0..60 {
        let dir = Dir::new(&format!("dir{case}"));
        let n = rng.below(300) as usize;
        let e = edges(&mut rng, n);
        let nparts = 1 + rng.below(5) as usize;
        let header = if case % 2 == 0 { Some("src,dst") } else { None };
        let sep = if header.is_some() { "," } else { "\t" };
        let mut cuts: Vec<usize> = (0..nparts - 1).map(|_| rng.below(n as u64 + 1) as usize).collect();
        cuts.sort();
        let bounds: Vec<usize> = std::iter::once(0).chain(cuts).chain(std::iter::once(n)).collect();
        for k in 0..nparts {
            let body = text(&e[bounds[k]..bounds[k + 1]], sep, header);
            let (name, bytes) = match rng.below(4) {
                0 => (format!("part-{k:05}.csv"), body.into_bytes()),
                1 => (format!("part-{k:05}.csv.gz"), gz_member(body.as_bytes())),
                2 => {
                    let m: Vec<usize> = (0..rng.below(6)).map(|_| rng.below(body.len() as u64 + 1) as usize).collect();
                    let mut m = m;
                    m.sort();
                    (format!("part-{k:05}.csv.gz"), gz_members(body.as_bytes(), &m))
                }
                _ => (format!("part-{k:05}.csv.gz"), bgzf(body.as_bytes(), 1 + rng.below(200) as usize)),
            };
            std::fs::write(dir.path(&name), bytes).unwrap();
        }
        std::fs::write(dir.path("_SUCCESS"), b"").unwrap();
        std::fs::write(dir.path(".part-00000.csv.crc"), b"\x00\x01garbage").unwrap();
        for size in 1..=5 {
            for chunk in [7, 4 << 20] {
                let o = ReadOptions { gzip_chunk_bytes: chunk, ..ReadOptions::default() };
                let got = all_shares(&dir.0, size, &o);
                if n == 0 {
                    let err = got.unwrap_err();
                    assert!(err.contains("no edges (empty file)"), "{err}");
                    continue;
                }
                assert_eq!(sorted(got.unwrap()), sorted(e.clone()), "case {case} P={size} chunk {chunk}");
            }
        }
    }
}

#[test]
fn a_part_with_another_header() {
    let dir = Dir::new("hdr");
    std::fs::write(dir.path("part-00000.csv"), "src,dst\n1,2\n").unwrap();
    std::fs::write(dir.path("part-00001.csv"), "src,dst\n3,4\n").unwrap();
    std::fs::write(dir.path("part-00002.csv"), "# a comment\nfrom,to\n5,6\n").unwrap();
    for size in 1..=4 {
        for rank in 0..size {
            let err = read_edges_share(&dir.0, Part::new(rank, size, 0).unwrap(), &EdgeOptions::default(), &ReadOptions::default()).unwrap_err().to_string();
            let want = format!("{}:2: the part starts with 'from,to', not the header 'src,dst' of {}", dir.path("part-00002.csv").display(), dir.path("part-00000.csv").display());
            assert_eq!(err, want);
            assert!(!err.contains('\n'));
        }
    }
}

/// A gzip file of many members is cut by members: ranks decompress disjoint members (each
/// rank's share is about its 1/P of the lines), and the line numbers of errors stay
/// absolute.
#[test]
fn members_split_across_ranks() {
    let dir = Dir::new("members");
    let mut rng = Rng(3);
    let e = edges(&mut rng, 20000);
    let body = text(&e, "\t", None);
    let cuts: Vec<usize> = (1..40).map(|k| k * body.len() / 40 + 3).collect();
    let p = dir.path("m.txt.gz");
    std::fs::write(&p, gz_members(body.as_bytes(), &cuts)).unwrap();
    let b = dir.path("b.txt.gz");
    std::fs::write(&b, bgzf(body.as_bytes(), 10000)).unwrap();
    for path in [&p, &b] {
        for size in 1..=5 {
            let mut got = Vec::new();
            for rank in 0..size {
                let s = read_edges_share(path, Part::new(rank, size, 0).unwrap(), &EdgeOptions::default(), &ReadOptions::default()).unwrap();
                let share = s.src.len();
                assert!(share.abs_diff(e.len() / size) < e.len() / 20 + 1, "P={size} rank {rank}: {share} of {}", e.len());
                got.extend(s.src.into_iter().zip(s.dst));
            }
            assert_eq!(got, e, "P={size}: in file order");
        }
    }
    // A bad line deep in the file: its absolute line number, from whichever rank owns it.
    let mut lines: Vec<String> = body.lines().map(String::from).collect();
    lines[15000] = "1 x".into();
    let bad = lines.join("\n") + "\n";
    std::fs::write(&p, gz_members(bad.as_bytes(), &cuts)).unwrap();
    for size in 1..=4 {
        let errs: Vec<String> = (0..size)
            .filter_map(|rank| read_edges_share(&p, Part::new(rank, size, 0).unwrap(), &EdgeOptions::default(), &ReadOptions::default()).err())
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errs, [format!("{}:15001: 'x' is not an integer vertex id", p.display())], "P={size}");
    }
}
