//! The split of a file among the ranks of a job, and the driver every reader shares.
//!
//! A plain file is memory-mapped. Its body `[lo, len)` starts at the first data line at or
//! after the caller's offset (every rank finds it by reading the prologue, see the crate
//! doc). Rank `r` of `P` has the nominal range `[lo + (r * (len - lo)) / P, lo + ((r + 1) *
//! (len - lo)) / P)` and takes the lines whose first byte lies in it: its real range runs
//! from the first line start at or after its nominal start to the first line start at or
//! after its nominal end. Both ends are found with the same function, so neighbouring ranks
//! meet exactly and every line belongs to one rank; a rank whose nominal range holds no
//! line start gets nothing.
//!
//! gzip files (recognised by their magic bytes, like the other readers of the project) go
//! to [`crate::gz`].

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{BadLine, ReadError, Result};
use crate::line::{count_newlines, line_at};
use crate::ReadOptions;

/// Which share to read: `rank` of `size`, with the body starting at or after byte `offset`
/// (0, or the offset of the body of a format whose header the caller has read; for a gzip
/// file an offset into the decompressed data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub rank: usize,
    pub size: usize,
    pub offset: u64,
}

impl Part {
    /// The whole file, as one rank of one.
    pub fn whole() -> Part {
        Part { rank: 0, size: 1, offset: 0 }
    }

    pub fn new(rank: usize, size: usize, offset: u64) -> Result<Part> {
        if size == 0 || rank >= size {
            return Err(ReadError::InvalidArgument(format!("rank {rank} is not in 0..{size}")));
        }
        Ok(Part { rank, size, offset })
    }
}

/// One input format, as the driver sees it.
pub(crate) trait Format {
    /// What the file holds, for "no edges (empty file)".
    const NOUN: &'static str;

    /// A new part (file) of the input starts; its prologue comes next. Every rank calls this
    /// for every part, in order.
    fn start_part(&mut self, path: &Path);

    /// Called by every rank on the lines from the offset on, in order, until it returns
    /// `Ok(true)`: that line is the first line of the body (parsed by its owner through
    /// [`Format::parse`]; the others are consumed here). `line` has no line end; `at_file_start`
    /// says it is the first line of the file.
    fn is_body(&mut self, line: &[u8], at_file_start: bool) -> std::result::Result<bool, String>;

    /// Parses whole lines of the body (the last one may lack its `\n`), appending to the
    /// share.
    fn parse(&mut self, bytes: &[u8]) -> std::result::Result<(), BadLine>;
}

pub(crate) fn io_error(path: &Path, source: std::io::Error) -> ReadError {
    ReadError::Io { path: path.to_path_buf(), source }
}

pub(crate) fn no_data<F: Format>(path: &Path) -> ReadError {
    ReadError::Format { path: path.to_path_buf(), msg: format!("no {} (empty file)", F::NOUN) }
}

/// One part of the input after its prologue: where its body is, and its weight (the bytes
/// on disk that the split of the job divides).
enum Body {
    Plain { map: memmap2::Mmap, lo: usize },
    Gz(crate::gz::GzPart),
}

impl Body {
    fn weight(&self) -> u64 {
        match self {
            Body::Plain { map, lo } => (map.len() - lo) as u64,
            Body::Gz(g) => g.weight(),
        }
    }
}

/// Reads `part` of the input made of the files `paths` (plain or gzip each, see the module
/// doc of [`crate::share`]) into `format`.
pub(crate) fn read<F: Format>(paths: &[PathBuf], part: Part, options: &ReadOptions, format: &mut F) -> Result<()> {
    let part = Part::new(part.rank, part.size, part.offset)?;
    if paths.is_empty() {
        return Err(ReadError::InvalidArgument("no input files".into()));
    }
    let mut bodies = Vec::with_capacity(paths.len());
    for path in paths {
        format.start_part(path);
        bodies.push(open_part(path, part.offset, options, format)?);
    }
    if bodies.iter().all(Option::is_none) {
        return Err(no_data::<F>(&paths[0]));
    }
    let total: u64 = bodies.iter().flatten().map(Body::weight).sum();
    let nominal = |k: usize| (k as u128 * total as u128 / part.size as u128) as u64;
    let mut base = 0u64;
    for (path, body) in paths.iter().zip(&bodies) {
        let Some(body) = body else { continue };
        let w = body.weight();
        let local = |k: usize| nominal(k).clamp(base, base + w) - base;
        let (a, b) = (local(part.rank), local(part.rank + 1));
        if a < b {
            match body {
                Body::Plain { map, lo } => read_plain_range(path, map, *lo, a, b, w, format)?,
                Body::Gz(g) => {
                    // The ranks that share this part (for a gzip stream that cannot be split).
                    let sharing: Vec<usize> = (0..part.size).filter(|&k| local(k) < local(k + 1)).collect();
                    let index = sharing.iter().position(|&k| k == part.rank).unwrap_or(0);
                    g.read_range(path, a, b, index, sharing.len(), options, format)?;
                }
            }
        }
        base += w;
    }
    Ok(())
}

/// Opens one part and reads its prologue (every rank does, for every part). None: the part
/// holds no body.
fn open_part<F: Format>(path: &Path, offset: u64, options: &ReadOptions, format: &mut F) -> Result<Option<Body>> {
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let len = file.metadata().map_err(|e| io_error(path, e))?.len();
    if len == 0 {
        if offset > 0 {
            return Err(ReadError::InvalidArgument(format!("offset {offset} is past the end of {} ({len} bytes)", path.display())));
        }
        return Ok(None);
    }
    // SAFETY: the map is read-only and private to this call. If another process truncates
    // the file meanwhile, reading the lost pages raises SIGBUS, as for every mapped reader;
    // input files of a job are not written while the job reads them.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_error(path, e))?;
    if map.len() >= 2 && map[..2] == crate::gz::MAGIC {
        return Ok(crate::gz::GzPart::open(path, map, offset, options, format)?.map(Body::Gz));
    }
    if offset > len {
        return Err(ReadError::InvalidArgument(format!("offset {offset} is past the end of {} ({len} bytes)", path.display())));
    }
    match prologue(format, &map, offset as usize, true) {
        Ok(Some(lo)) => Ok(Some(Body::Plain { map, lo })),
        Ok(None) => Ok(None),
        Err((pos, msg)) => Err(parse_error(path, &map, pos, msg)),
    }
}

/// The start of rank `k`'s real range (`k == size`: the end) in a body `[lo, len)` of `bytes`.
#[cfg(test)]
pub(crate) fn share_start(bytes: &[u8], lo: usize, k: usize, size: usize) -> usize {
    let len = bytes.len();
    if k >= size {
        return len;
    }
    line_start_at(bytes, lo, lo + ((k as u128 * (len - lo) as u128) / size as u128) as usize)
}

/// The first line start at or after `nominal` in a body starting at `lo`.
fn line_start_at(bytes: &[u8], lo: usize, nominal: usize) -> usize {
    let len = bytes.len();
    if nominal <= lo {
        return lo;
    }
    if nominal >= len || bytes[nominal - 1] == b'\n' {
        return nominal.min(len);
    }
    memchr::memchr(b'\n', &bytes[nominal..]).map_or(len, |i| nominal + i + 1)
}

fn parse_error(path: &Path, bytes: &[u8], pos: usize, msg: String) -> ReadError {
    ReadError::Parse { path: path.to_path_buf(), line: count_newlines(&bytes[..pos]) + 1, msg }
}

/// Parses the lines whose first byte lies in `[lo + a, lo + b)` of a plain part (`w`: the
/// body's length).
fn read_plain_range<F: Format>(path: &Path, map: &memmap2::Mmap, lo: usize, a: u64, b: u64, w: u64, format: &mut F) -> Result<()> {
    let bytes: &[u8] = map;
    let start = line_start_at(bytes, lo, lo + a as usize);
    let end = if b >= w { bytes.len() } else { line_start_at(bytes, lo, lo + b as usize) };
    if end > start {
        let _ = map.advise_range(memmap2::Advice::Sequential, start, end - start);
    }
    format.parse(&bytes[start..end]).map_err(|b| parse_error(path, bytes, start + b.at, b.msg))
}

/// Every rank reads the prologue: the lines of `chunk` from `from` on, until the first line
/// of the body, whose start it returns (None: the chunk ends first). `chunk_at_file_start`:
/// `chunk` starts at the start of the file. An error carries the bad line's start.
pub(crate) fn prologue<F: Format>(format: &mut F, chunk: &[u8], from: usize, chunk_at_file_start: bool) -> std::result::Result<Option<usize>, (usize, String)> {
    let mut pos = from;
    while pos < chunk.len() {
        let (line, next) = line_at(chunk, pos);
        match format.is_body(line, chunk_at_file_start && pos == 0) {
            Ok(true) => return Ok(Some(pos)),
            Ok(false) => pos = next,
            Err(msg) => return Err((pos, msg)),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real ranges tile the body and start at line starts.
    #[test]
    fn shares_tile_the_body() {
        let text = b"ab\ncdef\n\ng\nhij";
        for lo in [0usize, 3, 8] {
            for size in 1..=7 {
                let starts: Vec<usize> = (0..=size).map(|k| share_start(text, lo, k, size)).collect();
                assert_eq!(starts[0], lo);
                assert_eq!(starts[size], text.len());
                for w in starts.windows(2) {
                    assert!(w[0] <= w[1]);
                }
                for &s in &starts[..size] {
                    assert!(s == lo || s == text.len() || text[s - 1] == b'\n', "{s}");
                }
            }
        }
    }

    #[test]
    fn bad_part() {
        assert!(matches!(Part::new(2, 2, 0), Err(ReadError::InvalidArgument(_))));
        assert!(matches!(Part::new(0, 0, 0), Err(ReadError::InvalidArgument(_))));
    }
}
