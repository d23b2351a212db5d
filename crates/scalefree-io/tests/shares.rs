//! Brute force over small random files: for P = 1..=5 the shares of all ranks, concatenated
//! in rank order, equal what the generator wrote (each data line exactly once), for plain
//! and gzip files (small chunks, so lines straddle every kind of cut), and a bad line is
//! reported by one rank with its absolute line number.

use std::io::Write;
use std::path::{Path, PathBuf};

use scalefree_io::{read_edges_share, read_ratings_share, read_svmlight_share, EdgeOptions, Part, ReadError, ReadOptions};

/// splitmix64: a seeded generator for the test files.
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
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    fn blanks(&mut self, min: u64) -> String {
        (0..min + self.below(3)).map(|_| if self.chance(3) { '\t' } else { ' ' }).collect()
    }
}

struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("scalefree-io-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }
    /// `bytes` gzip-compressed, in one member or in two (a multi-member stream).
    fn write_gz(&self, name: &str, bytes: &[u8], split_at: Option<usize>) -> PathBuf {
        let gz = |b: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(b).unwrap();
            e.finish().unwrap()
        };
        let mut out = Vec::new();
        match split_at {
            Some(k) => {
                out.extend(gz(&bytes[..k]));
                out.extend(gz(&bytes[k..]));
            }
            None => out.extend(gz(bytes)),
        }
        self.write(name, &out)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Line end: LF, or CRLF now and then.
fn eol(rng: &mut Rng) -> &'static str {
    if rng.chance(4) {
        "\r\n"
    } else {
        "\n"
    }
}

/// Filler lines that hold no data: blank, blanks only, `#` and `%` comments.
fn filler(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => String::new(),
        1 => rng.blanks(1),
        2 => format!("{}# comment {}", rng.blanks(0), "x".repeat(rng.below(12) as usize)),
        _ => format!("{}% other {}", rng.blanks(0), rng.below(1000)),
    }
}

/// A generated file: its text, and the start and data (None: no data) of every line.
struct Generated<T> {
    text: String,
    lines: Vec<(usize, Option<T>)>,
}

/// Joins `lines` with random line ends; the final line loses its end now and then.
fn join<T>(rng: &mut Rng, lines: Vec<(String, Option<T>)>) -> Generated<T> {
    let mut text = String::new();
    let n = lines.len();
    let mut out = Vec::new();
    for (k, (l, v)) in lines.into_iter().enumerate() {
        out.push((text.len(), v));
        text.push_str(&l);
        if k + 1 < n || !rng.chance(3) {
            text.push_str(eol(rng));
        }
    }
    Generated { text, lines: out }
}

impl<T: Clone> Generated<T> {
    fn all(&self) -> Vec<T> {
        self.lines.iter().filter_map(|(_, v)| v.clone()).collect()
    }

    /// The data of the lines starting in `[a, b)`.
    fn between(&self, a: usize, b: usize) -> Vec<T> {
        self.lines.iter().filter(|(s, _)| (a..b).contains(s)).filter_map(|(_, v)| v.clone()).collect()
    }

    /// The start of the first data line.
    fn body(&self) -> Option<usize> {
        self.lines.iter().find(|(_, v)| v.is_some()).map(|&(s, _)| s)
    }

    /// Rank `r`'s share of the plain file, by the rule: the lines whose first byte lies in
    /// the nominal range `[lo + r (len - lo) / P, lo + (r + 1) (len - lo) / P)`.
    fn plain_share(&self, r: usize, p: usize) -> Vec<T> {
        let Some(lo) = self.body() else { return Vec::new() };
        let len = self.text.len();
        let at = |k: usize| lo + k * (len - lo) / p;
        self.between(at(r), at(r + 1))
    }

    /// Rank `r`'s share of a single-member gzip file: the chunks `i % P == r` of the data
    /// from the first data line on.
    fn gz_share(&self, r: usize, p: usize, chunk_bytes: usize) -> Vec<T> {
        let Some(lo) = self.body() else { return Vec::new() };
        let mut chunks = scalefree_io::gz::Chunker::new(&self.text.as_bytes()[lo..], chunk_bytes);
        let (mut start, mut index, mut out) = (lo, 0usize, Vec::new());
        while let Some(c) = chunks.next_chunk().unwrap() {
            let end = start + c.len();
            if index % p == r {
                out.extend(self.between(start, end));
            }
            index += 1;
            start = end;
        }
        out
    }
}

/// A random edge list (`lines` long) and its edges.
fn edge_file(rng: &mut Rng, lines: usize) -> Generated<(i64, i64)> {
    let mut out = Vec::new();
    for _ in 0..lines {
        if rng.chance(3) {
            out.push((filler(rng), None));
            continue;
        }
        let bits = rng.below(40);
        let (a, b) = (rng.below(1 << bits) as i64, rng.below(1000) as i64);
        // Mostly plain ids; now and then forms only the careful path takes.
        let sa = match rng.below(10) {
            0 => format!("+{a}"),
            1 => format!("{}{a}", "0".repeat(19)),
            _ => a.to_string(),
        };
        out.push((format!("{}{sa}{}{b}{}", rng.blanks(0), rng.blanks(1), rng.blanks(0)), Some((a, b))));
    }
    join(rng, out)
}

fn options(chunk: usize) -> ReadOptions {
    ReadOptions { gzip_chunk_bytes: chunk, ..ReadOptions::default() }
}

/// All ranks' shares of `path` concatenated, or every rank's error.
fn edge_share(path: &Path, rank: usize, size: usize, offset: u64, o: &ReadOptions) -> Result<Vec<(i64, i64)>, String> {
    read_edges_share(path, Part::new(rank, size, offset).unwrap(), &EdgeOptions::default(), o)
        .map(|e| e.src.into_iter().zip(e.dst).collect())
        .map_err(|e| e.to_string())
}

/// Every rank's share of `path`, or the errors of the ranks that failed.
fn all_edges(path: &Path, size: usize, offset: u64, o: &ReadOptions) -> Result<Vec<Vec<(i64, i64)>>, Vec<String>> {
    let (ok, errors): (Vec<_>, Vec<_>) = (0..size).map(|r| edge_share(path, r, size, offset, o)).partition(|x| x.is_ok());
    if errors.is_empty() {
        Ok(ok.into_iter().map(Result::unwrap).collect())
    } else {
        Err(errors.into_iter().map(Result::unwrap_err).collect())
    }
}

/// Checks every rank's share of the plain and gzip forms of `g` against the rule, and
/// that the shares hold each data line once (in file order for the plain file).
fn check_shares<T: Clone + PartialEq + std::fmt::Debug>(g: &Generated<T>, plain: &Path, gz: &Path, members: usize, chunk: usize, noun: &str, read: impl Fn(&Path, usize, usize, &ReadOptions) -> Result<Vec<T>, String>) {
    let want = g.all();
    for size in 1..=5 {
        for (path, chunk) in [(plain, 4 << 20), (gz, chunk), (gz, 4 << 20)] {
            let o = options(chunk);
            let mut concat = Vec::new();
            let mut count = 0;
            for rank in 0..size {
                let got = read(path, rank, size, &o);
                if want.is_empty() {
                    let e = got.unwrap_err();
                    assert_eq!(e, format!("{}: no {noun} (empty file)", path.display()), "every rank reports an empty file");
                    continue;
                }
                let got = got.unwrap();
                // A multi-member gzip file is split by members (each line once, any cut);
                // a single-member one by chunks.
                let rule = if path == plain { Some(g.plain_share(rank, size)) } else if members == 1 { Some(g.gz_share(rank, size, chunk)) } else { None };
                if let Some(rule) = rule {
                    assert_eq!(got, rule, "P={size} rank {rank} chunk {chunk} {:?}", g.text);
                }
                count += got.len();
                concat.extend(got);
            }
            assert_eq!(count, want.len(), "each line once");
            if path == plain {
                assert_eq!(concat, want);
            } else if members > 1 {
                let key = |v: &Vec<T>| {
                    let mut k: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
                    k.sort();
                    k
                };
                assert_eq!(key(&concat), key(&want), "P={size} {:?}", g.text);
            }
        }
    }
}

#[test]
fn edge_shares_concatenate_to_the_file() {
    let dir = Dir::new("edges");
    let mut rng = Rng(1);
    for case in 0..400 {
        let n = if case < 5 { case } else { rng.below(25) as usize };
        let g = edge_file(&mut rng, n);
        let plain = dir.write("e.txt", g.text.as_bytes());
        let split = (!g.text.is_empty() && rng.chance(2)).then(|| rng.below(g.text.len() as u64) as usize);
        let gz = dir.write_gz("e.txt.gz", g.text.as_bytes(), split);
        let chunk = 1 + rng.below(40) as usize;
        check_shares(&g, &plain, &gz, 1 + usize::from(split.is_some()), chunk, "edges", |p, r, n, o| edge_share(p, r, n, 0, o));
    }
}

/// With P = len - lo ranks every byte of the body is a nominal split point.
#[test]
fn every_byte_is_a_split_point() {
    let dir = Dir::new("bytes");
    let mut rng = Rng(6);
    for _ in 0..60 {
        let n = 1 + rng.below(8) as usize;
        let g = edge_file(&mut rng, n);
        let Some(lo) = g.body() else { continue };
        let plain = dir.write("e.txt", g.text.as_bytes());
        let size = g.text.len() - lo;
        let mut concat = Vec::new();
        for rank in 0..size {
            let got = edge_share(&plain, rank, size, 0, &ReadOptions::default()).unwrap();
            assert_eq!(got, g.plain_share(rank, size), "rank {rank} of {size} {:?}", g.text);
            concat.extend(got);
        }
        assert_eq!(concat, g.all());
    }
}

#[test]
fn body_offset_and_matrix_market_header() {
    let dir = Dir::new("offset");
    let mut rng = Rng(2);
    for case in 0..100 {
        let n = 1 + rng.below(20) as usize;
        let body = edge_file(&mut rng, n);
        let header = "7 nodes and a line that would not parse\nnor this\n";
        let g = Generated { text: format!("{header}{}", body.text), lines: body.lines.into_iter().map(|(s, v)| (s + header.len(), v)).collect() };
        let plain = dir.write("o.txt", g.text.as_bytes());
        let gz = dir.write_gz("o.txt.gz", g.text.as_bytes(), None);
        let chunk = 1 + case % 30;
        check_shares(&g, &plain, &gz, 1, chunk, "edges", |p, r, n, o| edge_share(p, r, n, header.len() as u64, o));
    }
    // A Matrix Market file read from 0: banner and size line skipped, values not read.
    let mm = "%%MatrixMarket matrix coordinate real general\r\n% comment\n3 3 2\n1 2 0.5\n3 1 -1e3\n";
    let p = dir.write("m.mtx", mm.as_bytes());
    for size in 1..=3 {
        let mut got = Vec::new();
        for rank in 0..size {
            let e = read_edges_share(&p, Part::new(rank, size, 0).unwrap(), &EdgeOptions { min_fields: 2, max_fields: 3 }, &ReadOptions::default()).unwrap();
            got.extend(e.src.into_iter().zip(e.dst));
        }
        assert_eq!(got, vec![(1, 2), (3, 1)]);
    }
    let e = read_edges_share(&p, Part::whole(), &EdgeOptions::default(), &ReadOptions::default()).unwrap_err();
    assert!(e.to_string().ends_with("m.mtx:4: expected 2 fields (from to), found 3: '1 2 0.5'"), "{e}");
}

/// Replaces data line `k` (0-based among all lines) with `bad`; returns the new text and
/// the 1-based line number.
fn with_bad_line(text: &str, k: usize, bad: &str) -> (String, usize) {
    let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
    let k = k % lines.len();
    let end = if lines[k].ends_with('\n') { "\n" } else { "" };
    let repl = format!("{bad}{end}");
    lines[k] = &repl;
    (lines.concat(), k + 1)
}

#[test]
fn error_lines_are_absolute_in_every_share() {
    let dir = Dir::new("errors");
    let mut rng = Rng(3);
    let bads = [
        ("1 2 3", "expected 2 fields (from to), found 3: '1 2 3'"),
        ("12", "expected 2 fields (from to), found 1: '12'"),
        ("1 abc", "'abc' is not an integer vertex id"),
        ("-4 1", "negative vertex id '-4'"),
        ("4611686018427387904 1", "vertex id '4611686018427387904' is too large (at most 2^62 - 1)"),
        ("1 2\0", "binary data (NUL byte at column 4), not a text file"),
        ("1 \u{1}\u{2}\u{ff}", "'\\x01\\x02\\xc3\\xbf' is not an integer vertex id"),
        ("1 2\r3 4", "expected 2 fields (from to), found 3: '1 2\\r3 4'"),
    ];
    let mut raw = b"5 6\n7 8\n".to_vec();
    raw.extend(b"\xff\xfe 1\n");
    let p = dir.write("latin1.txt", &raw);
    let e = read_edges_share(&p, Part::whole(), &EdgeOptions::default(), &ReadOptions::default()).unwrap_err().to_string();
    assert!(e.ends_with("latin1.txt:3: binary data (byte 0xff at column 1 is not UTF-8), not a text file"), "{e}");
    for case in 0..200 {
        let n = 2 + rng.below(30) as usize;
        let g = edge_file(&mut rng, n);
        let (bad, msg) = bads[case % bads.len()];
        let (text, line) = with_bad_line(&g.text, rng.below(64) as usize, bad);
        let plain = dir.write("b.txt", text.as_bytes());
        let gz = dir.write_gz("b.txt.gz", text.as_bytes(), None);
        for size in 1..=5 {
            for (path, chunk) in [(&plain, 1 << 20), (&gz, 1 + rng.below(24) as usize)] {
                let errs = all_edges(path, size, 0, &options(chunk)).unwrap_err();
                assert_eq!(errs.len(), 1, "only the owner of the bad line fails: {errs:?}");
                let want = format!("{}:{line}: {msg}", path.display());
                assert_eq!(errs[0], want, "case {case} P={size} {text:?}");
            }
        }
    }
}

#[test]
fn corrupt_and_truncated_gzip() {
    let dir = Dir::new("gz");
    let text: String = (0..20000).map(|k| format!("{k} {}\n", k * 7 % 1000)).collect();
    let full = dir.write_gz("full.gz", text.as_bytes(), None);
    let bytes = std::fs::read(&full).unwrap();
    let truncated = dir.write("trunc.gz", &bytes[..bytes.len() / 2]);
    let mut flipped = bytes.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x55;
    flipped[mid + 1] ^= 0xaa;
    let corrupt = dir.write("corrupt.gz", &flipped);
    let mut trailing = bytes.clone();
    trailing.extend(b"garbage after the stream");
    let garbage = dir.write("trailing.gz", &trailing);
    let mut crc = bytes.clone();
    let at = crc.len() - 8;
    crc[at] ^= 1;
    let crc = dir.write("crc.gz", &crc);
    // A flipped byte inside the deflate data may decode to wrong text before the check at
    // the end of the member catches it: then a bad line or the corrupt data is reported.
    for size in [1, 3] {
        let errs = all_edges(&corrupt, size, 0, &options(1 << 12)).unwrap_err();
        for e in errs {
            assert!(e.starts_with(&format!("{}:", corrupt.display())) && !e.contains('\n'), "{e}");
        }
    }
    for p in [&truncated, &crc, &garbage] {
        for size in [1, 3] {
            let errs = all_edges(p, size, 0, &options(1 << 12)).unwrap_err();
            assert_eq!(errs.len(), size);
            for e in errs {
                let head = format!("{}: corrupt gzip data (", p.display());
                assert!(e.starts_with(&head) && !e.contains('\n'), "{e}");
            }
        }
    }
}

/// A random svmlight file and its rows (label, [(index, value)]).
type Row = (f64, Vec<(i64, f64)>);
fn svm_file(rng: &mut Rng, lines: usize) -> Generated<Row> {
    let mut out = Vec::new();
    for _ in 0..lines {
        if rng.chance(4) {
            out.push((if rng.chance(2) { rng.blanks(0) } else { format!("{}# only a comment", rng.blanks(0)) }, None));
            continue;
        }
        let label = [-1.0, 1.0, 0.0, 2.5][rng.below(4) as usize];
        let mut s = format!("{}{label}", rng.blanks(0));
        if rng.chance(3) {
            s.push_str(&format!("{}qid:{}", rng.blanks(1), rng.below(9)));
        }
        let mut row = Vec::new();
        for _ in 0..rng.below(5) {
            let (i, v) = (rng.below(1 << 20) as i64, (rng.below(2000) as f64 - 1000.0) / 8.0);
            s.push_str(&format!("{}{i}:{v}", rng.blanks(1)));
            row.push((i, v));
        }
        if rng.chance(3) {
            s.push_str(&format!("{}# c 1:2", rng.blanks(0)));
        }
        s.push_str(&rng.blanks(0));
        out.push((s, Some((label, row))));
    }
    join(rng, out)
}

#[test]
fn svmlight_shares_concatenate_to_the_file() {
    let dir = Dir::new("svm");
    let mut rng = Rng(4);
    for case in 0..300 {
        let n = if case < 3 { case } else { rng.below(20) as usize };
        let g = svm_file(&mut rng, n);
        let plain = dir.write("s.svm", g.text.as_bytes());
        let split = (!g.text.is_empty() && rng.chance(2)).then(|| rng.below(g.text.len() as u64) as usize);
        let gz = dir.write_gz("s.svm.gz", g.text.as_bytes(), split);
        let chunk = 1 + rng.below(50) as usize;
        check_shares(&g, &plain, &gz, 1 + usize::from(split.is_some()), chunk, "rows", |path, rank, size, o| {
            let s = read_svmlight_share(path, Part::new(rank, size, 0).unwrap(), 1 << 31, o).map_err(|e| e.to_string())?;
            assert_eq!(s.indptr.len(), s.labels.len() + 1);
            assert_eq!(s.indptr[0], 0);
            Ok(s.labels.iter().enumerate().map(|(r, &y)| {
                let (a, b) = (s.indptr[r] as usize, s.indptr[r + 1] as usize);
                (y, s.indices[a..b].iter().copied().zip(s.values[a..b].iter().copied()).collect())
            }).collect())
        });
    }
}

#[test]
fn svmlight_errors() {
    let dir = Dir::new("svmerr");
    let cases: &[(&str, &str)] = &[
        ("1 2:3\nx 1:1\n", "2: label 'x' is not a number"),
        ("1 2:3\n\n1 4\n", "3: '4' is not index:value"),
        ("1 2:3\n1 -3:1\n", "2: negative feature index -3"),
        ("1 1099511627776:1\n", "1: feature index 1099511627776 is larger than the bound 2147483648"),
        ("1 1:nan\n", "1: value in '1:nan' is not finite"),
        ("inf 1:1\n", "1: label 'inf' is not finite"),
        ("1 1:1\r0 2:2\n", "1: carriage return inside a line (old Mac line ends are not supported)"),
        ("1 1:1\n1 1:\u{e9}\n", "2: non-ASCII byte 0xc3 outside a comment"),
        ("1 1:1\n1 1:\0\n", "2: binary data (NUL byte at column 5), not a text file"),
    ];
    for (k, (text, want)) in cases.iter().enumerate() {
        let p = dir.write(&format!("{k}.svm"), text.as_bytes());
        let e = read_svmlight_share(&p, Part::whole(), 1 << 31, &ReadOptions::default()).unwrap_err().to_string();
        assert_eq!(e, format!("{}:{want}", p.display()));
    }
    // Accepted the way Python accepts them.
    let p = dir.write("ok.svm", b"+1 qid:x 1_0:2_5 -0:.5 # 1:x\n-1\n");
    let s = read_svmlight_share(&p, Part::whole(), 100, &ReadOptions::default()).unwrap();
    assert_eq!((s.labels, s.indptr, s.indices, s.values), (vec![1.0, -1.0], vec![0, 2, 2], vec![10, 0], vec![25.0, 0.5]));
}

/// A random rating file in one of the syntaxes, and its ratings.
fn rating_file(rng: &mut Rng, lines: usize) -> Generated<(i64, i64, f32)> {
    let style = rng.below(4);
    let mut out = Vec::new();
    match style {
        1 if rng.chance(2) => out.push(("userId,movieId,rating,timestamp".to_string(), None)),
        3 => {
            out.push(("%%MatrixMarket matrix coordinate real general".to_string(), None));
            out.push(("% c".to_string(), None));
            out.push((format!("9 9 {lines}"), None));
        }
        _ => {}
    }
    for _ in 0..lines {
        if rng.chance(4) {
            out.push((filler(rng), None));
            continue;
        }
        let (u, i, r) = (rng.below(1 << 40) as i64, rng.below(5000) as i64, (rng.below(10) as f32) / 2.0);
        let line = match style {
            0 => format!("{}{u}{}{i}{}{r}{}{}", rng.blanks(0), rng.blanks(1), rng.blanks(1), rng.blanks(1), rng.below(1 << 30)),
            1 => format!("{u},{i}, {r},{}", rng.below(1 << 30)),
            2 => format!("{u}::{i}::{r}::{}", rng.below(1 << 30)),
            _ => format!("{u} {i} {r}"),
        };
        out.push((line, Some((u, i, r))));
    }
    join(rng, out)
}

#[test]
fn rating_shares_concatenate_to_the_file() {
    let dir = Dir::new("ratings");
    let mut rng = Rng(5);
    for case in 0..300 {
        let n = if case < 3 { case } else { rng.below(20) as usize };
        let g = rating_file(&mut rng, n);
        let plain = dir.write("r.txt", g.text.as_bytes());
        let split = (!g.text.is_empty() && rng.chance(2)).then(|| rng.below(g.text.len() as u64) as usize);
        let gz = dir.write_gz("r.txt.gz", g.text.as_bytes(), split);
        let chunk = 1 + rng.below(50) as usize;
        check_shares(&g, &plain, &gz, 1 + usize::from(split.is_some()), chunk, "ratings", |path, rank, size, o| {
            let s = read_ratings_share(path, Part::new(rank, size, 0).unwrap(), o).map_err(|e| e.to_string())?;
            Ok(s.users.iter().zip(&s.items).zip(&s.ratings).map(|((&u, &i), &r)| (u, i, r)).collect())
        });
    }
}

#[test]
fn rating_errors() {
    let dir = Dir::new("raterr");
    let cases: &[(&str, &str)] = &[
        ("1 2 3\n1 2 nan\n", "2: rating \"nan\" is not finite"),
        ("1 2 3\n1 2\n", "2: expected `user item rating`, got \"1 2\""),
        ("u,i,r\n1,2,3\nx,2,3\n", "3: user id \"x\" is not a non-negative integer"),
        ("1 2 3\n1 -2 3\n", "2: negative item id \"-2\""),
        ("1 2 3\n9223372036854775808 1 1\n", "2: user id \"9223372036854775808\" is larger than 9223372036854775807"),
        ("%%MatrixMarket matrix array real general\n2 2\n", "1: only Matrix Market coordinate files hold ratings"),
        ("1 2 3\n1 2 \u{ff}\n", "2: rating \"ÿ\" is not a number"),
    ];
    for (k, (text, want)) in cases.iter().enumerate() {
        let p = dir.write(&format!("{k}.txt"), text.as_bytes());
        let e = read_ratings_share(&p, Part::whole(), &ReadOptions::default()).unwrap_err().to_string();
        assert_eq!(e, format!("{}:{want}", p.display()));
    }
    let p = dir.write("bin.txt", b"1 2 3\n4 5 \xff\n");
    let e = read_ratings_share(&p, Part::whole(), &ReadOptions::default()).unwrap_err().to_string();
    assert_eq!(e, format!("{}:2: binary data (byte 0xff is not UTF-8), not a text file", p.display()));
    // A header is only a header before the first rating; a bad first rating fails every rank.
    let p = dir.write("h.csv", b"user,item,rating\n1,2,3\n4,5,6\n");
    let r = read_ratings_share(&p, Part::new(1, 2, 0).unwrap(), &ReadOptions::default()).unwrap();
    assert_eq!(r.users, vec![4]);
    let p = dir.write("headeronly.csv", b"user,item,rating\n");
    for rank in 0..3 {
        let e = read_ratings_share(&p, Part::new(rank, 3, 0).unwrap(), &ReadOptions::default()).unwrap_err();
        assert_eq!(e.to_string(), format!("{}: no ratings (empty file)", p.display()));
    }
}

#[test]
fn missing_file_and_bad_arguments() {
    let e = read_edges_share(Path::new("/nonexistent/x.txt"), Part::whole(), &EdgeOptions::default(), &ReadOptions::default()).unwrap_err();
    assert!(matches!(&e, ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound), "{e}");
    assert!(e.to_string().starts_with("/nonexistent/x.txt: "));
    let e = read_edges_share(Path::new("/nonexistent/x.txt"), Part::whole(), &EdgeOptions { min_fields: 3, max_fields: 2 }, &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, ReadError::InvalidArgument(_)));
    let dir = Dir::new("args");
    let p = dir.write("e.txt", b"1 2\n");
    let e = read_edges_share(&p, Part { rank: 0, size: 1, offset: 9 }, &EdgeOptions::default(), &ReadOptions::default()).unwrap_err();
    assert!(matches!(e, ReadError::InvalidArgument(_)), "{e}");
}
