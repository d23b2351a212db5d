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
use std::io::Read;
use std::path::Path;

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

/// Reads `part` of `path` (plain or gzip) into `format`.
pub(crate) fn read<F: Format>(path: &Path, part: Part, options: &ReadOptions, format: &mut F) -> Result<()> {
    let part = Part::new(part.rank, part.size, part.offset)?;
    let mut file = File::open(path).map_err(|e| io_error(path, e))?;
    let mut magic = [0u8; 2];
    let mut got = 0;
    while got < 2 {
        match file.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(path, e)),
        }
    }
    if got == 2 && magic == crate::gz::MAGIC {
        crate::gz::read(path, file, part, options, format)
    } else {
        read_mapped(path, &file, part, format)
    }
}

/// The start of rank `k`'s real range (`k == size`: the end) in a body `[lo, len)` of `bytes`.
pub(crate) fn share_start(bytes: &[u8], lo: usize, k: usize, size: usize) -> usize {
    let len = bytes.len();
    if k >= size {
        return len;
    }
    let nominal = lo + ((k as u128 * (len - lo) as u128) / size as u128) as usize;
    if nominal == lo || bytes[nominal - 1] == b'\n' {
        return nominal;
    }
    memchr::memchr(b'\n', &bytes[nominal..]).map_or(len, |i| nominal + i + 1)
}

fn parse_error(path: &Path, bytes: &[u8], pos: usize, msg: String) -> ReadError {
    ReadError::Parse { path: path.to_path_buf(), line: count_newlines(&bytes[..pos]) + 1, msg }
}

fn read_mapped<F: Format>(path: &Path, file: &File, part: Part, format: &mut F) -> Result<()> {
    let len = file.metadata().map_err(|e| io_error(path, e))?.len();
    if part.offset > len {
        return Err(ReadError::InvalidArgument(format!("offset {} is past the end of {} ({len} bytes)", part.offset, path.display())));
    }
    // SAFETY: the map is read-only and private to this call. If another process truncates
    // the file meanwhile, reading the lost pages raises SIGBUS, as for every mapped reader;
    // input files of a job are not written while the job reads them.
    let map = if len == 0 { None } else { Some(unsafe { memmap2::Mmap::map(file) }.map_err(|e| io_error(path, e))?) };
    let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
    let lo = match prologue(format, bytes, part.offset as usize, true) {
        Ok(Some(lo)) => lo,
        Ok(None) => return Err(no_data::<F>(path)),
        Err((pos, msg)) => return Err(parse_error(path, bytes, pos, msg)),
    };
    let start = share_start(bytes, lo, part.rank, part.size);
    let end = share_start(bytes, lo, part.rank + 1, part.size);
    if let Some(m) = &map {
        if end > start {
            let _ = m.advise_range(memmap2::Advice::Sequential, start, end - start);
        }
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
