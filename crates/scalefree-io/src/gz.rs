//! Shares of gzip parts. Three cases, decided alike on every rank from the compressed bytes:
//!
//! - **BGZF** (`bgzip`, htslib; every member carries its size in a `BC` extra field): the
//!   block starts are found by walking the headers, without decompressing.
//! - **Several members** (`cat a.gz b.gz`, writers that start a member per chunk such as
//!   `scalefree graph convert`): a member start at or after a byte
//!   offset is found by scanning for the gzip magic and checking the candidate: a header
//!   with the reserved flags clear that decompresses without error for
//!   [`VALIDATE_BYTES`] of output or to a good end (CRC and length checked).
//! - **One member**: cannot be split (see below).
//!
//! A splittable part is cut like a plain file, by compressed bytes: rank `r`'s nominal range
//! is moved to the next member (block) start at or after each end, so rank `r` decompresses
//! only the members `[c_r, c_{r+1})`, decompressed bytes `[d_r, d_{r+1})`. It owns the lines
//! that start in `(d_r, d_{r+1}]` (the first rank of the part: from the body start on): it
//! skips its data through the first `\n`, and reads on past `c_{r+1}` to the end of the line
//! holding or starting at `d_{r+1}`. Line numbers in errors are absolute: on the error path
//! the members before `c_r` are decompressed to count their lines.
//!
//! A single-member stream is decompressed whole by each of the ranks that share the part,
//! cut into chunks of about [`ReadOptions::gzip_chunk_bytes`] at line ends, and each parses
//! the chunks `i` with `i % n == its index` (chunk 0 holds the first line of the body). A
//! rank holds one chunk plus its share in memory; the decompression is paid by each.
//!
//! Chunk boundaries depend only on the decompressed bytes and the chunk size, never on how
//! much a `read` call returns, so every rank cuts the same chunks.

use std::io::{BufRead, ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flate2::bufread::{GzDecoder, MultiGzDecoder};

use crate::error::{ReadError, Result};
use crate::line::count_newlines;
use crate::share::{io_error, prologue, Format};
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

/// Decompressed bytes a candidate member start must yield without error (or end well
/// before) to count as a member start.
pub const VALIDATE_BYTES: usize = 1 << 20;

/// Whether a gzip member starts at `pos` of `data` (module doc).
pub fn is_member_start(data: &[u8], pos: usize) -> bool {
    let h = &data[pos.min(data.len())..];
    if h.len() < 18 || h[..3] != [0x1f, 0x8b, 8] || h[3] & 0xe0 != 0 {
        return false;
    }
    let mut dec = GzDecoder::new(h);
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0;
    loop {
        match dec.read(&mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                got += n;
                if got >= VALIDATE_BYTES {
                    return true;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// The first member start at or after `from` (`data.len()` if none).
pub fn next_member_start(data: &[u8], from: usize) -> usize {
    let finder = memchr::memmem::Finder::new(&[0x1f, 0x8b, 8]);
    let mut at = from;
    while at < data.len() {
        match finder.find(&data[at..]) {
            Some(k) if is_member_start(data, at + k) => return at + k,
            Some(k) => at += k + 1,
            None => break,
        }
    }
    data.len()
}

/// The size of the BGZF block starting at `pos`, if a BGZF header starts there.
fn bgzf_block_len(data: &[u8], pos: usize) -> Option<usize> {
    let h = data.get(pos..pos + 12)?;
    if h[..4] != [0x1f, 0x8b, 8, 4] {
        return None;
    }
    let xlen = u16::from_le_bytes([h[10], h[11]]) as usize;
    let extra = data.get(pos + 12..pos + 12 + xlen)?;
    let mut i = 0;
    while i + 4 <= extra.len() {
        let slen = u16::from_le_bytes([extra[i + 2], extra[i + 3]]) as usize;
        if extra[i] == b'B' && extra[i + 1] == b'C' && slen == 2 && i + 6 <= extra.len() {
            return Some(u16::from_le_bytes([extra[i + 4], extra[i + 5]]) as usize + 1);
        }
        i += 4 + slen;
    }
    None
}

/// The block starts of a BGZF file, or None if it is not BGZF throughout.
fn bgzf_blocks(data: &[u8]) -> Option<Vec<usize>> {
    let mut blocks = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let n = bgzf_block_len(data, pos)?;
        blocks.push(pos);
        pos += n;
    }
    (pos == data.len()).then_some(blocks)
}

/// Reads `r` to its end or up to and including its first `\n`.
struct UntilNewline<R: Read> {
    inner: R,
    done: bool,
}

impl<R: Read> Read for UntilNewline<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.done || out.is_empty() {
            return Ok(0);
        }
        // One byte at a time would be slow; read a block and keep up to the newline. The
        // rest is dropped (this reader is used once, for the tail of a share's last line).
        let n = self.inner.read(out)?;
        if let Some(k) = memchr::memchr(b'\n', &out[..n]) {
            self.done = true;
            return Ok(k + 1);
        }
        Ok(n)
    }
}

/// How a gzip part is split.
enum Split {
    Bgzf(Vec<usize>),
    Members,
    /// One member from the body on.
    Whole,
}

/// A gzip part after its prologue.
pub(crate) struct GzPart {
    map: Arc<memmap2::Mmap>,
    /// Compressed offset of the member holding the first byte of the body.
    body_member: usize,
    /// Decompressed bytes from that member's start to the body.
    skip: u64,
    /// Newlines before the body.
    lines_before: u64,
    /// Decided when first needed (a rank that reads none of the part never scans it).
    split: std::sync::OnceLock<Split>,
}

impl GzPart {
    /// Reads the prologue of the gzip part `path` (mapped as `map`) from decompressed offset
    /// `offset` on. None: the part holds no body.
    pub(crate) fn open<F: Format>(path: &Path, map: memmap2::Mmap, offset: u64, options: &ReadOptions, format: &mut F) -> Result<Option<GzPart>> {
        let data: &[u8] = &map;
        // Members decoded so far: (compressed start, decompressed start).
        let mut members: Vec<(usize, u64)> = Vec::new();
        let mut pending: Vec<u8> = Vec::new(); // decompressed bytes not yet looked at
        let mut pending_at = 0u64; // decompressed offset of pending[0]
        let mut lines = 0u64;
        let mut to_skip = offset;
        let mut at_file_start = offset == 0;
        let mut pos = 0usize;
        let mut decoded = 0u64;
        let mut buf = vec![0u8; options.gzip_chunk_bytes.clamp(1 << 12, 1 << 20)];
        let mut found: Option<u64> = None;
        'members: while pos < data.len() {
            members.push((pos, decoded));
            let mut dec = GzDecoder::new(&data[pos..]);
            let mut eof = false;
            while !eof {
                let n = loop {
                    match dec.read(&mut buf) {
                        Ok(n) => break n,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(gzip_error(path, e)),
                    }
                };
                eof = n == 0;
                decoded += n as u64;
                let mut fresh = &buf[..n];
                if to_skip > 0 {
                    let k = (to_skip.min(n as u64)) as usize;
                    lines += count_newlines(&fresh[..k]);
                    to_skip -= k as u64;
                    pending_at += k as u64;
                    fresh = &fresh[k..];
                }
                pending.extend_from_slice(fresh);
                let last_member_end = eof && pos + (data.len() - pos - dec.get_ref().len()) >= data.len();
                // Whole lines only, unless the data ends here.
                let upto = if last_member_end { pending.len() } else { memchr::memrchr(b'\n', &pending).map_or(0, |k| k + 1) };
                match prologue(format, &pending[..upto], 0, at_file_start && pending_at == 0) {
                    Ok(Some(p)) => {
                        lines += count_newlines(&pending[..p]);
                        found = Some(pending_at + p as u64);
                        break 'members;
                    }
                    Ok(None) => {
                        if upto > 0 {
                            at_file_start = false;
                        }
                        lines += count_newlines(&pending[..upto]);
                        pending.drain(..upto);
                        pending_at += upto as u64;
                    }
                    Err((p, msg)) => {
                        return Err(ReadError::Parse { path: path.to_path_buf(), line: lines + count_newlines(&pending[..p]) + 1, msg });
                    }
                }
            }
            let rest = dec.get_ref().len();
            let used = data.len() - pos - rest;
            if used == 0 {
                break;
            }
            pos += used;
        }
        if to_skip > 0 {
            return Err(ReadError::InvalidArgument(format!("offset {offset} is past the end of the decompressed data of {}", path.display())));
        }
        let Some(body_at) = found else { return Ok(None) };
        let &(body_member, member_at) = members.iter().rev().find(|&&(_, d)| d <= body_at).unwrap_or(&(0, 0));
        Ok(Some(GzPart { body_member, skip: body_at - member_at, lines_before: lines, split: std::sync::OnceLock::new(), map: Arc::new(map) }))
    }

    /// How the part is split (module doc).
    fn split(&self) -> &Split {
        self.split.get_or_init(|| {
            let data: &[u8] = &self.map;
            if let Some(blocks) = bgzf_blocks(data) {
                Split::Bgzf(blocks)
            } else if next_member_start(data, self.body_member + 1) < data.len() {
                Split::Members
            } else {
                Split::Whole
            }
        })
    }

    /// Whether the body is one gzip stream that cannot be split by members.
    pub(crate) fn is_single_stream(&self) -> bool {
        matches!(self.split(), Split::Whole)
    }

    /// The decompressed body in chunks cut at line ends (for one rank that hands them out).
    pub(crate) fn body_chunks(&self, path: &Path, chunk_bytes: usize) -> Result<BodyChunks> {
        let mut src = MultiGzDecoder::new(MapReader { map: Arc::clone(&self.map), pos: self.body_member });
        skip_bytes(&mut src, self.skip).map_err(|e| gzip_error(path, e))?;
        Ok(BodyChunks { path: path.to_path_buf(), chunks: Chunker::new(src, chunk_bytes), lines_before: self.lines_before })
    }

    /// The compressed bytes of the body, which the split of the job divides.
    pub(crate) fn weight(&self) -> u64 {
        (self.map.len() - self.body_member) as u64
    }

    /// The compressed offset where the share starting at local offset `x` of the body starts.
    fn cut(&self, x: u64) -> usize {
        let data: &[u8] = &self.map;
        if x == 0 {
            return self.body_member;
        }
        let at = self.body_member + x as usize;
        if at >= data.len() {
            return data.len();
        }
        match self.split() {
            Split::Bgzf(blocks) => blocks.get(blocks.partition_point(|&b| b < at)).copied().unwrap_or(data.len()),
            Split::Members => next_member_start(data, at),
            Split::Whole => data.len(),
        }
    }

    /// Parses this rank's share `[a, b)` (local compressed offsets of the body) of the part;
    /// `index` of `sharing` ranks share the part (for a single-member stream).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_range<F: Format>(&self, path: &Path, a: u64, b: u64, index: usize, sharing: usize, options: &ReadOptions, format: &mut F) -> Result<()> {
        if let Split::Whole = self.split() {
            return self.read_chunks(path, index, sharing.max(1), options, format);
        }
        let data: &[u8] = &self.map;
        let (ca, cb) = (self.cut(a), self.cut(b));
        if ca >= cb {
            return Ok(());
        }
        let first = ca == self.body_member;
        let mut region = MultiGzDecoder::new(&data[ca..cb]);
        if first {
            skip_bytes(&mut region, self.skip).map_err(|e| gzip_error(path, e))?;
        } else {
            // The line holding d_r belongs to the rank before.
            let mut block = [0u8; 1 << 12];
            loop {
                let n = read_some(&mut region, &mut block).map_err(|e| gzip_error(path, e))?;
                if n == 0 {
                    return Ok(()); // no line starts in this share
                }
                if let Some(k) = memchr::memchr(b'\n', &block[..n]) {
                    let rest = std::io::Cursor::new(block[k + 1..n].to_vec());
                    return self.parse_stream(path, rest.chain(region), cb, ca, false, options, format);
                }
            }
        }
        self.parse_stream(path, region, cb, ca, true, options, format)
    }

    /// Parses `owned` (the rank's decompressed data after its skip) followed by the rest of
    /// its last line from `cb` on. `first`: the share starts at the body start (else one
    /// line was skipped, for the line numbers of errors).
    #[allow(clippy::too_many_arguments)]
    fn parse_stream<F: Format, R: Read>(&self, path: &Path, owned: R, cb: usize, ca: usize, first: bool, options: &ReadOptions, format: &mut F) -> Result<()> {
        let data: &[u8] = &self.map;
        let tail = UntilNewline { inner: MultiGzDecoder::new(&data[cb..]), done: cb >= data.len() };
        let mut chunks = Chunker::new(owned.chain(tail), options.gzip_chunk_bytes);
        let mut lines_in = 0u64;
        while let Some(chunk) = chunks.next_chunk().map_err(|e| gzip_error(path, e))? {
            if let Err(bad) = format.parse(chunk) {
                let before = if first { self.lines_before } else { lines_before_offset(path, data, ca)? + 1 };
                return Err(ReadError::Parse { path: path.to_path_buf(), line: before + lines_in + count_newlines(&chunk[..bad.at]) + 1, msg: bad.msg });
            }
            lines_in += count_newlines(chunk);
        }
        Ok(())
    }

    /// A single-member stream: decompress from the body on, parse the chunks `i % sharing ==
    /// index`.
    fn read_chunks<F: Format>(&self, path: &Path, index: usize, sharing: usize, options: &ReadOptions, format: &mut F) -> Result<()> {
        let data: &[u8] = &self.map;
        let mut src = MultiGzDecoder::new(&data[self.body_member..]);
        skip_bytes(&mut src, self.skip).map_err(|e| gzip_error(path, e))?;
        let mut chunks = Chunker::new(src, options.gzip_chunk_bytes);
        let mut lines_before = self.lines_before;
        let mut i = 0usize;
        while let Some(chunk) = chunks.next_chunk().map_err(|e| gzip_error(path, e))? {
            if i % sharing == index {
                format.parse(chunk).map_err(|bad| ReadError::Parse {
                    path: path.to_path_buf(),
                    line: lines_before + count_newlines(&chunk[..bad.at]) + 1,
                    msg: bad.msg,
                })?;
            }
            i += 1;
            lines_before += count_newlines(chunk);
        }
        Ok(())
    }
}

/// The mapped file from a position on, as a `BufRead` that owns its map.
struct MapReader {
    map: Arc<memmap2::Mmap>,
    pos: usize,
}

impl Read for MapReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = out.len().min(self.map.len() - self.pos);
        out[..n].copy_from_slice(&self.map[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl BufRead for MapReader {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        Ok(&self.map[self.pos..])
    }
    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.map.len());
    }
}

/// The decompressed body of a single-stream gzip part in chunks cut at line ends, each with
/// the number of lines before it: what one rank reads and hands to the ranks that parse
/// ([`crate::stream::TextStream`]).
pub struct BodyChunks {
    path: PathBuf,
    chunks: Chunker<MultiGzDecoder<MapReader>>,
    lines_before: u64,
}

impl BodyChunks {
    /// The next chunk and the lines of the file before it; None at the end.
    pub fn next_chunk(&mut self) -> Result<Option<(u64, &[u8])>> {
        let path = &self.path;
        match self.chunks.next_chunk().map_err(|e| gzip_error(path, e))? {
            None => Ok(None),
            Some(c) => {
                let before = self.lines_before;
                self.lines_before += count_newlines(c);
                Ok(Some((before, c)))
            }
        }
    }
}

/// Newlines in the decompressed data of the members before compressed offset `at` (on the
/// error path).
fn lines_before_offset(path: &Path, data: &[u8], at: usize) -> Result<u64> {
    let mut dec = MultiGzDecoder::new(&data[..at]);
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let got = read_some(&mut dec, &mut buf).map_err(|e| gzip_error(path, e))?;
        if got == 0 {
            return Ok(n);
        }
        n += count_newlines(&buf[..got]);
    }
}

fn read_some<R: Read>(r: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Reads and drops `n` bytes of `r` (fewer at its end).
fn skip_bytes<R: Read>(r: &mut R, n: u64) -> std::io::Result<()> {
    std::io::copy(&mut r.take(n), &mut std::io::sink()).map(|_| ())
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
