//! Edge lists: SNAP style, two non-negative integer vertex ids per line (`from to`),
//! separated by spaces or tabs, or by commas or semicolons (CSV), with an optional header
//! line (see [`crate::dialect`]); optionally more fields after them, which are counted but not
//! read (Matrix Market bodies: `row col [value...]`). Blank lines and lines whose first
//! non-blank byte is `#` or `%` are skipped; CRLF line ends are fine. A Matrix Market file
//! read from offset 0 has its banner and size line skipped.
//!
//! The common line (`digits blanks digits`, ids of at most 18 digits) is parsed in one pass
//! over its bytes without allocating; every other line goes through a careful second parse
//! that accepts what is valid (`+7`, long runs of leading zeros, extra fields) and words
//! the error otherwise.

use std::path::{Path, PathBuf};

use crate::dialect::{is_float, Delimiter, Dialect};
use crate::error::{BadLine, ReadError, Result};
use crate::line::{is_blank, is_blank_line, is_comment, line_at, not_text, quote};
use crate::matrix_market::MatrixMarket;
use crate::number::{parse_id, IdError};
use crate::share::{self, Format, Part};
use crate::ReadOptions;

/// The largest vertex id: 2^62 - 1 (larger ids are an error).
pub const MAX_VERTEX_ID: u64 = (1 << 62) - 1;

/// How many fields a line may have: `min_fields..=max_fields`, both at least 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EdgeOptions {
    pub min_fields: usize,
    pub max_fields: usize,
}

impl Default for EdgeOptions {
    fn default() -> Self {
        EdgeOptions { min_fields: 2, max_fields: 2 }
    }
}

/// One rank's edges, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Edges {
    pub src: Vec<i64>,
    pub dst: Vec<i64>,
}

/// Where a reader puts the edges it parses, in file order.
pub trait EdgeSink: Default {
    /// Room for about `n` more edges.
    fn reserve(&mut self, n: usize);
    /// One edge; both ids are at most [`MAX_VERTEX_ID`].
    fn push(&mut self, src: u64, dst: u64);
}

impl EdgeSink for Edges {
    fn reserve(&mut self, n: usize) {
        self.src.reserve(n);
        self.dst.reserve(n);
    }
    #[inline(always)]
    fn push(&mut self, src: u64, dst: u64) {
        self.src.push(src as i64);
        self.dst.push(dst as i64);
    }
}

/// One rank's edges, in file order, each packed into one `u64` key `src << 32 | dst` (the
/// form a graph load exchanges and sorts: the keys sort as the edges do by (src, dst)), half
/// the bytes of [`Edges`]. Only ids below 2^32 pack: the first larger id sets [`EdgeKeys::wide`]
/// and the keys stop growing (the caller reads the input again as [`Edges`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EdgeKeys {
    pub keys: Vec<u64>,
    /// Some id was 2^32 or larger: `keys` is incomplete.
    pub wide: bool,
}

impl EdgeKeys {
    /// The key of edge `(src, dst)`, or None when an id is 2^32 or larger.
    #[inline(always)]
    pub fn key(src: u64, dst: u64) -> Option<u64> {
        ((src | dst) >> 32 == 0).then_some(src << 32 | dst)
    }
}

impl EdgeSink for EdgeKeys {
    fn reserve(&mut self, n: usize) {
        if !self.wide {
            self.keys.reserve(n);
        }
    }
    #[inline(always)]
    fn push(&mut self, src: u64, dst: u64) {
        match EdgeKeys::key(src, dst) {
            Some(k) if !self.wide => self.keys.push(k),
            Some(_) => {}
            None => {
                self.wide = true;
                self.keys = Vec::new();
            }
        }
    }
}

pub(crate) struct EdgeFormat<S: EdgeSink = Edges> {
    options: EdgeOptions,
    mm: MatrixMarket,
    dialect: Dialect,
    /// The delimiter byte (`,` or `;`) once decided; None for blanks.
    sep: Option<u8>,
    pub(crate) out: S,
}

/// Up to 18 ASCII digits at `i` (so the value is below 2^62 without a check), and their end.
#[inline(always)]
fn short_id(s: &[u8], i: usize) -> Option<(u64, usize)> {
    let mut v = 0u64;
    let mut j = i;
    while j < s.len() {
        let d = s[j].wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        v = v.wrapping_mul(10).wrapping_add(d as u64);
        j += 1;
    }
    if j == i || j - i > 18 {
        None
    } else {
        Some((v, j))
    }
}

/// The common line at `i`: `[blanks] id blanks id [blanks] [\r] (\n | end)` (with a
/// delimiter byte `sep`: `[blanks] id [blanks] sep [blanks] id ...`); the two ids and the
/// start of the next line, or None for anything else.
#[inline(always)]
fn two_ids(s: &[u8], mut i: usize, sep: Option<u8>) -> Option<(u64, u64, usize)> {
    let n = s.len();
    while i < n && is_blank(s[i]) {
        i += 1;
    }
    let (a, j) = short_id(s, i)?;
    i = j;
    match sep {
        None => {
            if i >= n || !is_blank(s[i]) {
                return None;
            }
        }
        Some(c) => {
            while i < n && is_blank(s[i]) {
                i += 1;
            }
            if i >= n || s[i] != c {
                return None;
            }
            i += 1;
        }
    }
    while i < n && is_blank(s[i]) {
        i += 1;
    }
    let (b, j) = short_id(s, i)?;
    i = j;
    while i < n && is_blank(s[i]) {
        i += 1;
    }
    if i < n && s[i] == b'\r' {
        i += 1;
    }
    if i >= n {
        Some((a, b, n))
    } else if s[i] == b'\n' {
        Some((a, b, i + 1))
    } else {
        None
    }
}

fn vertex_id(tok: &[u8]) -> std::result::Result<u64, String> {
    parse_id(tok, MAX_VERTEX_ID).map_err(|e| match e {
        IdError::NotInteger => format!("{} is not an integer vertex id", quote(tok)),
        IdError::Negative => format!("negative vertex id {}", quote(tok)),
        IdError::TooLarge => format!("vertex id {} is too large (at most 2^62 - 1)", quote(tok)),
    })
}

impl<S: EdgeSink> EdgeFormat<S> {
    /// Any line (without its line end) the fast path did not take.
    fn careful_line(&mut self, line: &[u8]) -> std::result::Result<(), String> {
        if is_blank_line(line) || is_comment(line) {
            return Ok(());
        }
        if let Some(why) = not_text(line) {
            return Err(why);
        }
        let delimiter = self.dialect.delimiter.unwrap_or(Delimiter::Blanks);
        let found = delimiter.fields(line).count();
        let mut fields = delimiter.fields(line);
        let EdgeOptions { min_fields, max_fields } = self.options;
        if found < min_fields || found > max_fields {
            let want = if min_fields == max_fields { min_fields.to_string() } else { format!("{min_fields} to {max_fields}") };
            let names = if max_fields == 2 { "from to" } else { "from to, then fields not read" };
            return Err(format!("expected {want} fields ({names}), found {found}: {}", quote(line)));
        }
        let (a, b) = (fields.next().unwrap_or_default(), fields.next().unwrap_or_default());
        let (a, b) = (vertex_id(a)?, vertex_id(b)?);
        self.out.push(a, b);
        Ok(())
    }
}

impl<S: EdgeSink> Format for EdgeFormat<S> {
    const NOUN: &'static str = "edges";

    fn start_part(&mut self, path: &Path) {
        self.dialect.start_part(path);
        self.mm = MatrixMarket::default();
    }

    fn is_body(&mut self, line: &[u8], at_file_start: bool) -> std::result::Result<bool, String> {
        if at_file_start {
            if let Ok(t) = std::str::from_utf8(line) {
                if self.mm.banner(t.trim(), true, "edges")? {
                    self.dialect.settle();
                    return Ok(false);
                }
            }
        }
        if is_blank_line(line) || is_comment(line) {
            return Ok(false);
        }
        let Ok(t) = std::str::from_utf8(line) else {
            return Ok(true); // the owner of the line words the error
        };
        if self.mm.size_line(t.trim())? {
            return Ok(false);
        }
        if self.dialect.is_fresh() {
            let header = self.dialect.first_line(line, false, is_float)?;
            self.sep = self.dialect.delimiter.and_then(Delimiter::byte);
            return Ok(!header);
        }
        Ok(true)
    }

    fn parse(&mut self, s: &[u8]) -> std::result::Result<(), BadLine> {
        // About 16 bytes per edge line; the vectors grow past this when lines are shorter.
        self.out.reserve(s.len() / 16);
        let fast = self.options.min_fields == 2;
        let mut i = 0;
        while i < s.len() {
            if fast {
                if let Some((a, b, next)) = two_ids(s, i, self.sep) {
                    self.out.push(a, b);
                    i = next;
                    continue;
                }
            }
            let (line, next) = line_at(s, i);
            self.careful_line(line).map_err(|msg| BadLine::new(i, msg))?;
            i = next;
        }
        Ok(())
    }
}

/// Reads rank `part.rank`'s share of the edge list `path` (a file, plain or gzip, or a part
/// directory: [`crate::source::resolve_parts`]).
pub fn read_edges_share(path: &Path, part: Part, edge_options: &EdgeOptions, options: &ReadOptions) -> Result<Edges> {
    check_fields(edge_options)?;
    read_edges_parts(&crate::source::resolve_parts(path)?, part, edge_options, options)
}

/// Reads rank `part.rank`'s share of the edge list made of the files `parts`, in order (one
/// body split by bytes; each part has the header of the first, if any).
pub fn read_edges_parts(parts: &[PathBuf], part: Part, edge_options: &EdgeOptions, options: &ReadOptions) -> Result<Edges> {
    read_edges_into(parts, part, edge_options, options)
}

/// [`read_edges_parts`] into packed keys ([`EdgeKeys`]: check `wide`).
pub fn read_edge_keys_parts(parts: &[PathBuf], part: Part, edge_options: &EdgeOptions, options: &ReadOptions) -> Result<EdgeKeys> {
    read_edges_into(parts, part, edge_options, options)
}

fn read_edges_into<S: EdgeSink>(parts: &[PathBuf], part: Part, edge_options: &EdgeOptions, options: &ReadOptions) -> Result<S> {
    let mut f = EdgeFormat::<S>::new(edge_options, options)?;
    share::read(parts, part, options, &mut f)?;
    Ok(f.out)
}

impl<S: EdgeSink> EdgeFormat<S> {
    pub(crate) fn new(edge_options: &EdgeOptions, options: &ReadOptions) -> Result<EdgeFormat<S>> {
        check_fields(edge_options)?;
        let dialect = Dialect::new(options.delimiter, options.header);
        Ok(EdgeFormat { options: *edge_options, mm: MatrixMarket::default(), dialect, sep: None, out: S::default() })
    }
}

fn check_fields(edge_options: &EdgeOptions) -> Result<()> {
    let EdgeOptions { min_fields, max_fields } = *edge_options;
    if min_fields < 2 || max_fields < min_fields {
        return Err(ReadError::InvalidArgument(format!("need 2 <= min_fields <= max_fields, got {min_fields} and {max_fields}")));
    }
    Ok(())
}
