//! svmlight / libsvm files, with the syntax of `scalefree.sgd.read_svmlight`: one row per
//! line, `label index:value index:value ...`; everything from the first `#` on is a comment;
//! tokens are separated by ASCII whitespace (Python's `str.split()`); `qid:N` tokens are
//! skipped; labels and values are Python floats, indices Python ints (`1_000`, `+3`, `-0`
//! included). Stricter than the Python reader: a label or value that is NaN or infinite, an
//! index above the caller's bound, a carriage return inside a line (an old Mac line end,
//! which Python would read as a line break) and non-ASCII text outside comments are errors.
//! Indices are returned as written (0- or 1-based is the caller's business). A header line
//! (a first line whose first token is not a number, or any first line with
//! [`crate::Header::Present`]) is skipped, in every part of a part directory alike.

use std::path::{Path, PathBuf};

use crate::dialect::{is_float, Delimiter, Dialect};

use crate::error::{BadLine, Result};
use crate::line::{line_at, not_text, quote};
use crate::number::{parse_py_float, parse_py_int, IdError};
use crate::share::{self, Format, Part};
use crate::ReadOptions;

/// One rank's rows in CSR form: row `k` has `indices[indptr[k]..indptr[k + 1]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct SvmlightShare {
    pub labels: Vec<f64>,
    /// `labels.len() + 1` offsets, from 0.
    pub indptr: Vec<i64>,
    pub indices: Vec<i64>,
    pub values: Vec<f64>,
}

impl Default for SvmlightShare {
    fn default() -> Self {
        SvmlightShare { labels: Vec::new(), indptr: vec![0], indices: Vec::new(), values: Vec::new() }
    }
}

/// Python's whitespace among ASCII bytes.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1f)
}

/// The line before its comment.
fn data(line: &[u8]) -> &[u8] {
    memchr::memchr(b'#', line).map_or(line, |k| &line[..k])
}

pub(crate) struct SvmlightFormat {
    max_index: u64,
    dialect: Dialect,
    pub(crate) out: SvmlightShare,
}

impl SvmlightFormat {
    fn row(&mut self, line: &[u8]) -> std::result::Result<(), String> {
        let d = data(line);
        let mut toks = d.split(|&b| is_space(b)).filter(|t| !t.is_empty());
        let Some(label) = toks.next() else { return Ok(()) };
        if let Some(why) = not_text(d) {
            return Err(why);
        }
        if let Some(&b) = d.iter().find(|b| !b.is_ascii()) {
            return Err(format!("non-ASCII byte 0x{b:02x} outside a comment"));
        }
        if memchr::memchr(b'\r', d).is_some() {
            return Err("carriage return inside a line (old Mac line ends are not supported)".into());
        }
        let y = parse_py_float(label).ok_or_else(|| format!("label {} is not a number", quote(label)))?;
        if !y.is_finite() {
            return Err(format!("label {} is not finite", quote(label)));
        }
        for fv in toks {
            if fv.starts_with(b"qid:") {
                continue;
            }
            let parsed = memchr::memchr(b':', fv).map(|k| (&fv[..k], parse_py_int(&fv[..k], self.max_index), parse_py_float(&fv[k + 1..])));
            let (k, ki, v) = match parsed {
                Some((k, Ok(i), Some(v))) => (k, Ok(i), v),
                Some((k, Err(e), Some(v))) if e != IdError::NotInteger => (k, Err(e), v),
                _ => return Err(format!("{} is not index:value", quote(fv))),
            };
            let ki = ki.map_err(|e| match e {
                IdError::Negative => format!("negative feature index {}", String::from_utf8_lossy(k)),
                _ => format!("feature index {} is larger than the bound {}", String::from_utf8_lossy(k), self.max_index),
            })?;
            if !v.is_finite() {
                return Err(format!("value in {} is not finite", quote(fv)));
            }
            self.out.indices.push(ki as i64);
            self.out.values.push(v);
        }
        self.out.labels.push(y);
        self.out.indptr.push(self.out.indices.len() as i64);
        Ok(())
    }
}

impl Format for SvmlightFormat {
    const NOUN: &'static str = "rows";

    fn start_part(&mut self, path: &Path) {
        self.dialect.start_part(path);
    }

    fn is_body(&mut self, line: &[u8], _at_file_start: bool) -> std::result::Result<bool, String> {
        let d = data(line);
        if !d.iter().any(|&b| !is_space(b)) {
            return Ok(false);
        }
        if self.dialect.is_fresh() {
            return Ok(!self.dialect.first_line(d, false, is_float)?);
        }
        Ok(true)
    }

    fn parse(&mut self, s: &[u8]) -> std::result::Result<(), BadLine> {
        let mut i = 0;
        while i < s.len() {
            let (line, next) = line_at(s, i);
            self.row(line).map_err(|msg| BadLine::new(i, msg))?;
            i = next;
        }
        Ok(())
    }
}

/// Reads rank `part.rank`'s share of the svmlight file `path` (plain or gzip, or a part
/// directory); indices above `max_index` are an error naming the file and line.
pub fn read_svmlight_share(path: &Path, part: Part, max_index: u64, options: &ReadOptions) -> Result<SvmlightShare> {
    read_svmlight_parts(&crate::source::resolve_parts(path)?, part, max_index, options)
}

/// Reads rank `part.rank`'s share of the svmlight rows made of the files `parts`, in order.
pub fn read_svmlight_parts(parts: &[PathBuf], part: Part, max_index: u64, options: &ReadOptions) -> Result<SvmlightShare> {
    let mut f = SvmlightFormat::new(max_index, options);
    share::read(parts, part, options, &mut f)?;
    Ok(f.out)
}

impl SvmlightFormat {
    pub(crate) fn new(max_index: u64, options: &ReadOptions) -> SvmlightFormat {
        // Tokens are separated by whitespace whatever the caller says.
        let dialect = Dialect::new(Some(Delimiter::Blanks), options.header);
        SvmlightFormat { max_index, dialect, out: SvmlightShare::default() }
    }
}
