//! Shares of a gzip file. A gzip stream cannot be split, so every rank decompresses all of
//! it (multi-member streams too) in chunks of about [`ReadOptions::gzip_chunk_bytes`] cut at
//! line ends, and parses only the chunks `i` with `i % P == r` (chunk 0 is the one holding
//! the first line of the body). A rank holds one chunk plus its share in memory; the CPU of
//! the decompression is spent by every rank. Line numbers stay absolute: the newlines of
//! every chunk are counted, parsed or not.
//!
//! Chunk boundaries depend only on the decompressed bytes and the chunk size, never on how
//! much a `read` call returns, so every rank cuts the same chunks.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::{ReadError, Result};
use crate::line::count_newlines;
use crate::share::{io_error, no_data, prologue, Format, Part};
use crate::ReadOptions;

/// The first two bytes of every gzip member.
pub const MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Decompressed data cut into chunks that end at line ends.
pub struct Chunker<R: Read> {
    src: R,
    buf: Vec<u8>,
    /// Valid bytes in `buf`.
    filled: usize,
    /// Start in `buf` of the data not yet handed out.
    next: usize,
    eof: bool,
    chunk_bytes: usize,
}

impl<R: Read> Chunker<R> {
    pub fn new(src: R, chunk_bytes: usize) -> Self {
        let chunk_bytes = chunk_bytes.max(1);
        Chunker { src, buf: Vec::new(), filled: 0, next: 0, eof: false, chunk_bytes }
    }

    /// Reads until `want` bytes are buffered after `next`, or the end.
    fn fill(&mut self, want: usize) -> std::io::Result<()> {
        while !self.eof && self.filled - self.next < want {
            if self.buf.len() < self.next + want {
                self.buf.resize(self.next + want, 0);
            }
            match self.src.read(&mut self.buf[self.filled..]) {
                Ok(0) => self.eof = true,
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The next chunk: whole lines (the last line of the data may lack its `\n`) up to the
    /// last line end within `chunk_bytes`, or up to the first line end after it when a
    /// line is longer. None at the end of the data.
    pub fn next_chunk(&mut self) -> std::io::Result<Option<&[u8]>> {
        // Move the rest of the previous fill to the front (less than one chunk).
        self.buf.copy_within(self.next..self.filled, 0);
        self.filled -= self.next;
        self.next = 0;
        self.fill(self.chunk_bytes)?;
        if self.filled == 0 {
            return Ok(None);
        }
        // Less than a chunk left means the end of the data (`fill` stops short only there).
        let cut = if self.filled < self.chunk_bytes {
            self.filled
        } else if let Some(k) = memchr::memrchr(b'\n', &self.buf[..self.chunk_bytes]) {
            k + 1
        } else {
            // A line longer than a chunk: read on to its end.
            let mut from = self.chunk_bytes;
            loop {
                if let Some(k) = memchr::memchr(b'\n', &self.buf[from..self.filled]) {
                    break from + k + 1;
                }
                if self.eof {
                    break self.filled;
                }
                from = self.filled;
                let have = self.filled;
                self.fill(have + self.chunk_bytes)?;
            }
        };
        self.next = cut;
        Ok(Some(&self.buf[..cut]))
    }
}

fn gzip_error(path: &Path, e: std::io::Error) -> ReadError {
    match e.kind() {
        ErrorKind::InvalidInput | ErrorKind::InvalidData | ErrorKind::UnexpectedEof => {
            ReadError::Format { path: path.to_path_buf(), msg: format!("corrupt gzip data ({e})") }
        }
        _ => io_error(path, e),
    }
}

/// Reads `part` of the gzip file `path` (opened as `file`, any position) into `format`.
pub(crate) fn read<F: Format>(path: &Path, file: File, part: Part, options: &ReadOptions, format: &mut F) -> Result<()> {
    let mut file = file;
    std::io::Seek::rewind(&mut file).map_err(|e| io_error(path, e))?;
    let mut chunks = Chunker::new(MultiGzDecoder::new(std::io::BufReader::with_capacity(1 << 16, file)), options.gzip_chunk_bytes);
    let mut lines_before = 0u64; // newlines before the current chunk
    let mut skip = part.offset; // decompressed bytes before the caller's offset
    let mut at_file_start = true;
    let mut in_prologue = true;
    let mut index = 0usize; // chunks of the body so far
    let line_error = |lines_before: u64, chunk: &[u8], pos: usize, msg: String| ReadError::Parse {
        path: path.to_path_buf(),
        line: lines_before + count_newlines(&chunk[..pos]) + 1,
        msg,
    };
    while let Some(chunk) = chunks.next_chunk().map_err(|e| gzip_error(path, e))? {
        let mut start = 0;
        if skip > 0 {
            if skip >= chunk.len() as u64 {
                skip -= chunk.len() as u64;
                lines_before += count_newlines(chunk);
                at_file_start = false;
                continue;
            }
            start = skip as usize;
            skip = 0;
        }
        if in_prologue {
            match prologue(format, chunk, start, at_file_start && start == 0) {
                Ok(Some(p)) => {
                    in_prologue = false;
                    start = p;
                }
                Ok(None) => start = chunk.len(),
                Err((pos, msg)) => return Err(line_error(lines_before, chunk, pos, msg)),
            }
        }
        at_file_start = false;
        if !in_prologue && start < chunk.len() {
            if index % part.size == part.rank {
                let body = &chunk[start..];
                format.parse(body).map_err(|b| line_error(lines_before, chunk, start + b.at, b.msg))?;
            }
            index += 1;
        }
        lines_before += count_newlines(chunk);
    }
    if part.offset > 0 && skip > 0 {
        return Err(ReadError::InvalidArgument(format!("offset {} is past the end of the decompressed data of {}", part.offset, path.display())));
    }
    if in_prologue {
        return Err(no_data::<F>(path));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that returns at most `step` bytes per call, to show that chunks do not
    /// depend on how reads are cut.
    struct Trickle<'a>(&'a [u8], usize);
    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.len().min(self.1).min(out.len());
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    fn chunks(data: &[u8], size: usize, step: usize) -> Vec<Vec<u8>> {
        let mut c = Chunker::new(Trickle(data, step), size);
        let mut out = Vec::new();
        while let Some(x) = c.next_chunk().unwrap() {
            out.push(x.to_vec());
        }
        out
    }

    #[test]
    fn chunks_end_at_lines_and_do_not_depend_on_reads() {
        let data = b"a\nbb\nccc\n\ndddddddd\ne\nff";
        for size in 1..30 {
            let want = chunks(data, size, 1000);
            assert_eq!(want.concat(), data);
            for c in &want[..want.len() - 1] {
                assert_eq!(c.last(), Some(&b'\n'));
            }
            for c in &want {
                // at most one chunk's bytes unless one line is longer
                assert!(c.len() <= size || c.iter().filter(|&&b| b == b'\n').count() <= 1, "{size} {c:?}");
            }
            for step in 1..7 {
                assert_eq!(chunks(data, size, step), want, "size {size} step {step}");
            }
        }
        assert!(chunks(b"", 4, 1).is_empty());
    }
}
