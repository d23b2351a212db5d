//! Sparse matrices from text files: Matrix Market coordinate files (`.mtx`) and UCI
//! bag-of-words `docword` files, plain or gzip-compressed (detected by the gzip magic, not the
//! name). Each bad line is reported with the file and its 1-based line number.
//!
//! The entries are gathered as triplets in memory (16 bytes per stored entry), sorted by row
//! and column, duplicates summed (as scipy's COO→CSR does), and then written to flash as a
//! CSR matrix by the caller. The triplets of a file larger than memory would need an
//! out-of-core sort; the files this reads in practice (docword sets, SuiteSparse matrices)
//! hold at most some hundred million entries.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use scalefree_io::{Delimiter, Header, Part, ReadOptions};

use crate::element::Real;
use crate::error::{FlashError, Result};
use crate::sparse::CsrMatrix;
use super::{FileOptions, FlashCsrMatrix, FlashPtr};

/// Line-numbered reader over a plain or gzip file.
struct Lines {
    path: PathBuf,
    reader: Box<dyn BufRead>,
    line_no: usize,
    buf: String,
}

impl Lines {
    fn open(path: &Path) -> Result<Lines> {
        let io = |source| FlashError::Io { path: path.to_path_buf(), source };
        let mut file = File::open(path).map_err(io)?;
        let mut magic = [0u8; 2];
        let got = file.read(&mut magic).map_err(io)?;
        let file = File::open(path).map_err(io)?;
        let reader: Box<dyn BufRead> = if got == 2 && magic == [0x1f, 0x8b] {
            Box::new(BufReader::with_capacity(1 << 20, flate2::read::MultiGzDecoder::new(file)))
        } else {
            Box::new(BufReader::with_capacity(1 << 20, file))
        };
        Ok(Lines { path: path.to_path_buf(), reader, line_no: 0, buf: String::new() })
    }

    /// The next line without its end, or None at the end of the file.
    fn next_line(&mut self) -> Result<Option<String>> {
        self.buf.clear();
        let n = self.reader.read_line(&mut self.buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                self.error(format!("not text or not valid gzip ({e})"))
            } else {
                FlashError::Io { path: self.path.clone(), source: e }
            }
        })?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        Ok(Some(self.buf.trim().to_string()))
    }

    /// An error naming the file and the current line.
    fn error(&self, reason: impl std::fmt::Display) -> FlashError {
        FlashError::Corrupt { path: self.path.clone(), reason: format!("line {}: {reason}", self.line_no) }
    }

    fn end_error(&self, reason: impl std::fmt::Display) -> FlashError {
        FlashError::Corrupt { path: self.path.clone(), reason: format!("at the end (line {}): {reason}", self.line_no) }
    }
}

fn parse<V: std::str::FromStr>(lines: &Lines, field: Option<&str>, what: &str) -> Result<V> {
    let text = field.ok_or_else(|| lines.error(format!("missing {what}")))?;
    text.parse().map_err(|_| lines.error(format!("cannot read {what} from {text:?}")))
}

/// A value that must be finite (a NaN or an infinity would poison every result silently).
fn finite(lines: &Lines, field: Option<&str>, what: &str) -> Result<f64> {
    let v: f64 = parse(lines, field, what)?;
    if !v.is_finite() {
        return Err(lines.error(format!("{what} {v} is not finite")));
    }
    Ok(v)
}

/// A 1-based index checked against its bound, returned 0-based.
fn index(lines: &Lines, field: Option<&str>, what: &str, bound: usize) -> Result<usize> {
    let i: usize = parse(lines, field, what)?;
    if i == 0 || i > bound {
        return Err(lines.error(format!("{what} {i} is outside 1..={bound}")));
    }
    Ok(i - 1)
}

/// Sorts triplets by (row, col), sums duplicates and builds the CSR arrays.
fn triplets_to_csr<T: Real>(rows: usize, cols: usize, mut t: Vec<(u32, u32, f64)>) -> CsrMatrix<T> {
    t.sort_unstable_by_key(|&(r, c, _)| ((r as u64) << 32) | c as u64);
    let mut indptr = vec![0u64; rows + 1];
    let mut indices = Vec::with_capacity(t.len());
    let mut values: Vec<T> = Vec::with_capacity(t.len());
    let mut last: Option<(u32, u32)> = None;
    for (r, c, v) in t {
        if last == Some((r, c)) {
            let at = values.len() - 1;
            values[at] = T::from_f64(values[at].to_f64() + v);
            continue;
        }
        last = Some((r, c));
        indptr[r as usize + 1] += 1;
        indices.push(c);
        values.push(T::from_f64(v));
    }
    for r in 0..rows {
        indptr[r + 1] += indptr[r];
    }
    CsrMatrix { rows, cols, indptr, indices, values }
}

/// The in-memory docword reader's bounds: ids past 2^32 − 1 (documents or words) are read
/// as 64-bit triplets and mapped ([`wide_triplets_to_text`]); the streamed reader maps a
/// wide vocabulary itself (two passes) and wide documents as they come.
fn is_wide(n: usize) -> bool {
    n > u32::MAX as usize
}

/// A matrix read from a text file whose row or column ids may need more than 32 bits: where
/// `row_ids` (`col_ids`) is Some, the stored matrix has a row (column) per id that occurs,
/// in ascending id order, and `rows` (`cols`) is the whole id space.
#[derive(Debug, PartialEq)]
pub struct TextMatrix<T> {
    pub matrix: CsrMatrix<T>,
    /// The row count of the file's size line (the id space).
    pub rows: usize,
    /// The column count of the file's size line (the id space).
    pub cols: usize,
    /// The sorted 0-based ids of the rows that hold entries, when `rows` exceeds 2^32 − 1.
    pub row_ids: Option<Vec<u64>>,
    /// The sorted 0-based ids of the columns that hold entries, when `cols` exceeds 2^32 − 1.
    pub col_ids: Option<Vec<u64>>,
}

/// The sorted distinct values of `ids`, refused past 2^32 of them (positions are 32-bit).
fn used_ids(mut ids: Vec<u64>, what: &str) -> std::result::Result<Vec<u64>, String> {
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > u32::MAX as usize + 1 {
        return Err(format!("{} distinct {what}s: more than 2^32 used {what}s (positions among them are 32-bit)", ids.len()));
    }
    Ok(ids)
}

/// Reads a Matrix Market `coordinate` file (`real`, `integer` or `pattern`; `general`,
/// `symmetric` or `skew-symmetric`) into CSR. Symmetric files are expanded to both triangles.
///
/// A row or column count past 2^32 − 1 (up to 2^64 − 1) is a sparse id space: the matrix
/// gets a row (column) per id that occurs and the ids in [`TextMatrix::row_ids`]
/// ([`TextMatrix::col_ids`]); nothing is allocated per id of the space. Such a file holds its
/// triplets as 64-bit ids while reading (24 bytes per entry, then 16 per entry for the
/// positions), the others 16 bytes per entry.
pub fn read_matrix_market<T: Real>(path: &Path) -> Result<TextMatrix<T>> {
    let mut lines = Lines::open(path)?;
    let Some(header) = lines.next_line()? else { return Err(lines.end_error("empty file, expected a %%MatrixMarket header")) };
    let header = header.to_ascii_lowercase();
    let words: Vec<&str> = header.split_whitespace().collect();
    if words.len() != 5 || words[0] != "%%matrixmarket" || words[1] != "matrix" {
        return Err(lines.error(format!("expected '%%MatrixMarket matrix <format> <field> <symmetry>', got {header:?}")));
    }
    if words[2] != "coordinate" {
        return Err(lines.error(format!("format {:?} is not supported: only sparse 'coordinate' files open as flash CSR matrices (load a dense 'array' file with scipy.io.mmread)", words[2])));
    }
    let pattern = match words[3] {
        "real" | "integer" | "double" => false,
        "pattern" => true,
        f => return Err(lines.error(format!("field {f:?} is not supported (real, integer or pattern)"))),
    };
    let mirror: Option<f64> = match words[4] {
        "general" => None,
        "symmetric" => Some(1.0),
        "skew-symmetric" => Some(-1.0),
        s => return Err(lines.error(format!("symmetry {s:?} is not supported (general, symmetric or skew-symmetric)"))),
    };
    // Comments, then the size line.
    let (rows, cols, nnz) = loop {
        let Some(line) = lines.next_line()? else { return Err(lines.end_error("no size line")) };
        if line.is_empty() || line.starts_with('%') {
            continue;
        }
        let mut f = line.split_whitespace();
        let rows: usize = parse(&lines, f.next(), "the row count")?;
        let cols: usize = parse(&lines, f.next(), "the column count")?;
        let nnz: usize = parse(&lines, f.next(), "the entry count")?;
        if f.next().is_some() {
            return Err(lines.error("the size line has more than 3 numbers"));
        }
        break (rows, cols, nnz);
    };
    let (map_rows, map_cols) = (is_wide(rows), is_wide(cols));
    let per_entry = if mirror.is_some() { 2 } else { 1 };
    let mut narrow: Vec<(u32, u32, f64)> = Vec::new();
    let mut wide: Vec<(u64, u64, f64)> = Vec::new();
    if map_rows || map_cols {
        wide.reserve(nnz.min(1 << 28) * per_entry);
    } else {
        narrow.reserve(nnz.min(1 << 28) * per_entry);
    }
    let mut push = |r: usize, c: usize, v: f64| {
        if map_rows || map_cols {
            wide.push((r as u64, c as u64, v));
        } else {
            narrow.push((r as u32, c as u32, v)); // both below 2^32 − 1 (checked above)
        }
    };
    let mut seen = 0usize;
    while let Some(line) = lines.next_line()? {
        if line.is_empty() || line.starts_with('%') {
            continue;
        }
        if seen == nnz {
            return Err(lines.error(format!("more entries than the {nnz} the size line announced")));
        }
        let mut f = line.split_whitespace();
        let r = index(&lines, f.next(), "row", rows)?;
        let c = index(&lines, f.next(), "column", cols)?;
        let v: f64 = if pattern { 1.0 } else { finite(&lines, f.next(), "the value")? };
        if f.next().is_some() {
            return Err(lines.error(format!("too many fields in {line:?}")));
        }
        push(r, c, v);
        if let Some(sign) = mirror {
            if r != c {
                if c >= rows || r >= cols {
                    return Err(lines.error(format!("entry ({}, {}) has no mirror in a {rows}x{cols} symmetric matrix", r + 1, c + 1)));
                }
                push(c, r, sign * v);
            }
        }
        seen += 1;
    }
    if seen != nnz {
        return Err(lines.end_error(format!("{seen} entries but the size line announced {nnz}")));
    }
    if !(map_rows || map_cols) {
        return Ok(TextMatrix { matrix: triplets_to_csr(rows, cols, narrow), rows, cols, row_ids: None, col_ids: None });
    }
    wide_triplets_to_text(rows, cols, wide, ["row", "column"]).map_err(|e| lines.end_error(e))
}

/// A [`TextMatrix`] of `rows` x `cols` from 64-bit triplets: a side past 2^32 − 1 ids gets
/// a row (column) per id that occurs and its id map, the other side stays dense. Errors
/// (without the file) when more than 2^32 distinct ids of a side occur (`what`: the nouns of
/// the two sides).
fn wide_triplets_to_text<T: Real>(rows: usize, cols: usize, wide: Vec<(u64, u64, f64)>, what: [&str; 2]) -> std::result::Result<TextMatrix<T>, String> {
    let (map_rows, map_cols) = (is_wide(rows), is_wide(cols));
    let row_ids = if map_rows { Some(used_ids(wide.iter().map(|t| t.0).collect(), what[0])?) } else { None };
    let col_ids = if map_cols { Some(used_ids(wide.iter().map(|t| t.1).collect(), what[1])?) } else { None };
    let at = |ids: &Option<Vec<u64>>, x: u64| match ids {
        Some(ids) => ids.binary_search(&x).expect("every id is in its map") as u32,
        None => x as u32, // not mapped: below 2^32 − 1
    };
    let narrow: Vec<(u32, u32, f64)> = wide.into_iter().map(|(r, c, v)| (at(&row_ids, r), at(&col_ids, c), v)).collect();
    let stored_rows = row_ids.as_ref().map_or(rows, Vec::len);
    let stored_cols = col_ids.as_ref().map_or(cols, Vec::len);
    Ok(TextMatrix { matrix: triplets_to_csr(stored_rows, stored_cols, narrow), rows, cols, row_ids, col_ids })
}

/// Reads a UCI bag-of-words `docword` file — three header lines D (documents), W (words),
/// NNZ, then `docID wordID count` lines, 1-based — into a D x W CSR matrix of counts.
/// D or W past 2^32 − 1 (any u64) is a sparse id space: that side gets a row (column) per id
/// that occurs and its id map ([`TextMatrix::row_ids`], [`TextMatrix::col_ids`]); the
/// triplets are then held as 64-bit ids (24 bytes per entry), else 16.
pub fn read_docword<T: Real>(path: &Path) -> Result<TextMatrix<T>> {
    let mut lines = Lines::open(path)?;
    let (rows, cols, nnz) = docword_header(&mut lines)?;
    let wide = is_wide(rows) || is_wide(cols);
    let (mut narrow, mut triplets) = (Vec::new(), Vec::new());
    if wide {
        triplets.reserve(nnz.min(1 << 28));
    } else {
        narrow.reserve(nnz.min(1 << 28));
    }
    let mut seen = 0usize;
    while let Some(line) = lines.next_line()? {
        if line.is_empty() {
            continue;
        }
        if seen == nnz {
            return Err(lines.error(format!("more entries than the NNZ = {nnz} of line 3")));
        }
        let (r, c, v) = docword_entry(&lines, &line, rows, cols)?;
        if wide {
            triplets.push((r as u64, c as u64, v));
        } else {
            narrow.push((r as u32, c as u32, v)); // both below 2^32 − 1
        }
        seen += 1;
    }
    if seen != nnz {
        return Err(lines.end_error(format!("{seen} entries but line 3 announced NNZ = {nnz}")));
    }
    if !wide {
        return Ok(TextMatrix { matrix: triplets_to_csr(rows, cols, narrow), rows, cols, row_ids: None, col_ids: None });
    }
    wide_triplets_to_text(rows, cols, triplets, ["document", "word"]).map_err(|e| lines.end_error(e))
}

/// Entries per write of [`docword_to_flash`] (a multiple of 1024, so that every write but
/// the last starts on a 4096-byte boundary of the arrays: whole-sector direct writes).
pub const DOCWORD_CHUNK_ENTRIES: usize = 1 << 16;

/// Reads the three header lines of a docword file: (D, W, NNZ).
fn docword_header(lines: &mut Lines) -> Result<(usize, usize, usize)> {
    let mut header = [0usize; 3];
    for (h, what) in header.iter_mut().zip(["the document count D", "the vocabulary size W", "the entry count NNZ"]) {
        let Some(line) = lines.next_line()? else { return Err(lines.end_error(format!("missing {what}"))) };
        let mut f = line.split_whitespace();
        *h = parse(lines, f.next(), what)?;
        if f.next().is_some() {
            return Err(lines.error(format!("expected only {what}, got {line:?}")));
        }
    }
    let [rows, cols, nnz] = header;
    Ok((rows, cols, nnz))
}

/// One `docID wordID count` line, 0-based ids.
fn docword_entry(lines: &Lines, line: &str, rows: usize, cols: usize) -> Result<(usize, usize, f64)> {
    let mut f = line.split_whitespace();
    let r = index(lines, f.next(), "docID", rows)?;
    let c = index(lines, f.next(), "wordID", cols)?;
    let v: f64 = finite(lines, f.next(), "the count")?;
    if f.next().is_some() {
        return Err(lines.error(format!("too many fields in {line:?} (expected docID wordID count)")));
    }
    Ok((r, c, v))
}

/// A docword file on flash: the matrix and, for a vocabulary (a document count) of 2^32 or
/// more, the sorted ids of the words (documents) that occur: the matrix's columns (rows) are
/// positions in them.
pub struct FlashDocword<T> {
    /// Used documents (or D when `doc_ids` is None) x used words (or W when `word_ids` is None).
    pub matrix: FlashCsrMatrix<T>,
    /// The 0-based id of each row, when the document count needs more than 32 bits.
    pub doc_ids: Option<Vec<u64>>,
    /// The 0-based id of each column, when the vocabulary needs more than 32 bits.
    pub word_ids: Option<Vec<u64>>,
    /// The document count D of the header.
    pub documents: usize,
    /// The vocabulary size W of the header.
    pub words: usize,
}

impl<T: Real> FlashDocword<T> {
    fn from_text(dir: &Path, t: TextMatrix<T>, options: &FileOptions) -> Result<Self> {
        let matrix = FlashCsrMatrix::from_csr(dir, t.matrix.view(), options)?;
        Ok(FlashDocword { matrix, doc_ids: t.row_ids, word_ids: t.col_ids, documents: t.rows, words: t.cols })
    }
}

/// Streams a UCI docword file straight to a flash CSR matrix in `dir`, with bounded memory:
/// the row starts (8 bytes per document), the entries of the current document, and one
/// chunk of `chunk_entries` entries (rounded up to a multiple of 1024) on their way to flash.
/// The result equals [`read_docword`]'s (each document's words sorted, duplicates summed).
///
/// Needs the entries grouped by document in ascending docID order, as UCI files are; a file
/// whose docIDs go back is read again by [`read_docword`] (in memory, 16 bytes per entry,
/// 24 with ids past 32 bits). A vocabulary W of 2^32 words or more is read twice: first the
/// ids of the words that occur (memory per used word, not per id), then the entries as
/// positions among them. A document count D of 2^32 or more keeps a row per document that
/// occurs (8 bytes for its start, 8 for its id), none per id of the space.
pub fn docword_to_flash<T: Real>(path: &Path, dir: &Path, options: &FileOptions, chunk_entries: usize) -> Result<FlashDocword<T>> {
    match stream_docword(path, dir, options, chunk_entries)? {
        Some(d) => Ok(d),
        None => FlashDocword::from_text(dir, read_docword::<T>(path)?, options),
    }
}

/// A docword input in any form `scalefree_io::docword` reads: a UCI file, or `doc word
/// count` triples without the UCI lines (delimiter detected or `delimiter`, an optional
/// header line, `header`), one file or a part directory, plain or gzip. Read in memory (16
/// bytes per entry) into a D x W CSR matrix of counts (duplicates summed); without UCI lines
/// D and W are the largest ids. D or W past 2^32 − 1 maps that side as [`read_docword`]
/// does. Errors name the file and line.
pub fn read_docword_input<T: Real>(path: &Path, delimiter: Option<Delimiter>, header: Header) -> Result<TextMatrix<T>> {
    let options = ReadOptions { delimiter, header, ..ReadOptions::default() };
    let s = scalefree_io::read_docword_share(path, Part::whole(), &options).map_err(read_error)?;
    let n = s.docs.len();
    let (rows, cols) = match s.declared {
        Some([d, w, nnz]) => {
            if nnz != n as u64 {
                return Err(FlashError::Corrupt { path: path.to_path_buf(), reason: format!("{n} entries but line 3 announced NNZ = {nnz}") });
            }
            (d, w)
        }
        None => (s.docs.iter().max().map_or(0, |&d| d + 1), s.words.iter().max().map_or(0, |&w| w + 1)),
    };
    let (rows, cols) = (usize::try_from(rows).unwrap_or(usize::MAX), usize::try_from(cols).unwrap_or(usize::MAX));
    if !(is_wide(rows) || is_wide(cols)) {
        let triplets = s.docs.iter().zip(&s.words).zip(&s.counts).map(|((&d, &w), &c)| (d as u32, w as u32, c)).collect();
        return Ok(TextMatrix { matrix: triplets_to_csr(rows, cols, triplets), rows, cols, row_ids: None, col_ids: None });
    }
    let triplets = s.docs.iter().zip(&s.words).zip(&s.counts).map(|((&d, &w), &c)| (d, w, c)).collect();
    wide_triplets_to_text(rows, cols, triplets, ["document", "word"]).map_err(|reason| FlashError::Corrupt { path: path.to_path_buf(), reason })
}

/// The flash error of a reader error (the same one line).
fn read_error(e: scalefree_io::ReadError) -> FlashError {
    match e {
        scalefree_io::ReadError::Io { path, source } => FlashError::Io { path, source },
        scalefree_io::ReadError::Parse { path, line, msg } => FlashError::Corrupt { path, reason: format!("line {line}: {msg}") },
        scalefree_io::ReadError::Format { path, msg } => FlashError::Corrupt { path, reason: msg },
        scalefree_io::ReadError::InvalidArgument(msg) => FlashError::invalid(msg),
    }
}

/// Whether `path` is one file whose first non-blank line is one integer (a UCI docword file,
/// which [`docword_to_flash`] streams).
fn is_uci_file(path: &Path) -> Result<bool> {
    if !path.is_file() {
        return Ok(false);
    }
    let mut lines = Lines::open(path)?;
    while let Some(line) = lines.next_line()? {
        if !line.is_empty() {
            return Ok(line.parse::<u64>().is_ok());
        }
    }
    Ok(true)
}

/// [`docword_to_flash`] for a UCI file in the default dialect (streamed, bounded memory);
/// any other docword input (a part directory, CSV triples, a given delimiter or header rule)
/// is read by [`read_docword_input`] and written to flash.
pub fn docword_input_to_flash<T: Real>(path: &Path, dir: &Path, options: &FileOptions, chunk_entries: usize, delimiter: Option<Delimiter>, header: Header) -> Result<FlashDocword<T>> {
    if delimiter.is_none() && header == Header::Auto && is_uci_file(path)? {
        return docword_to_flash(path, dir, options, chunk_entries);
    }
    FlashDocword::from_text(dir, read_docword_input::<T>(path, delimiter, header)?, options)
}

/// The sorted 0-based ids of the words that occur in a docword file (its first pass when
/// W needs more than 32 bits).
fn docword_word_ids(path: &Path) -> Result<Vec<u64>> {
    let mut lines = Lines::open(path)?;
    let (rows, cols, _) = docword_header(&mut lines)?;
    let mut ids = std::collections::BTreeSet::new();
    while let Some(line) = lines.next_line()? {
        if !line.is_empty() {
            ids.insert(docword_entry(&lines, &line, rows, cols)?.1 as u64);
        }
    }
    if ids.len() > u32::MAX as usize + 1 {
        return Err(lines.end_error(format!("{} distinct words: more than 2^32 used words", ids.len())));
    }
    Ok(ids.into_iter().collect())
}

/// [`docword_to_flash`]'s stream, or None when a docID goes back.
fn stream_docword<T: Real>(path: &Path, dir: &Path, options: &FileOptions, chunk_entries: usize) -> Result<Option<FlashDocword<T>>> {
    let chunk = chunk_entries.max(1).div_ceil(1024) * 1024;
    let mut lines = Lines::open(path)?;
    let (rows, cols, nnz) = docword_header(&mut lines)?;
    let word_ids = if is_wide(cols) { Some(docword_word_ids(path)?) } else { None };
    // D past 32 bits: a row per document that occurs (its id in doc_ids), none per id.
    let mut doc_ids: Option<Vec<u64>> = if is_wide(rows) { Some(Vec::new()) } else { None };
    // NNZ is an upper bound of the stored entries (duplicates merge); checked as lines come.
    let indices = FlashPtr::<u32>::scratch(dir, nnz as u64, options)?;
    let values = FlashPtr::<T>::scratch(dir, nnz as u64, options)?;
    // Entries per stored row, then (in place) the row starts.
    let mut indptr = if doc_ids.is_some() { vec![0u64] } else { vec![0u64; rows + 1] };
    let (mut buf_i, mut buf_v): (Vec<u32>, Vec<T>) = (Vec::with_capacity(chunk), Vec::with_capacity(chunk));
    let mut written = 0u64; // entries already on flash
    let mut row: Vec<(u32, f64)> = Vec::new(); // the current document's (word, count)
    let mut current: Option<usize> = None; // the current document
    let mut seen = 0usize; // entry lines read
    // Sorts the current document, sums duplicates, appends it to the chunk and writes every
    // full chunk out; returns the document's entry count.
    let finish_row = |row: &mut Vec<(u32, f64)>, buf_i: &mut Vec<u32>, buf_v: &mut Vec<T>, written: &mut u64| -> Result<u64> {
        row.sort_by_key(|&(c, _)| c);
        row.dedup_by(|next, kept| {
            let same = next.0 == kept.0;
            if same {
                kept.1 += next.1;
            }
            same
        });
        for &(c, v) in row.iter() {
            buf_i.push(c);
            buf_v.push(T::from_f64(v));
            if buf_i.len() == chunk {
                indices.write(*written, buf_i)?;
                values.write(*written, buf_v)?;
                *written += chunk as u64;
                buf_i.clear();
                buf_v.clear();
            }
        }
        let count = row.len() as u64;
        row.clear();
        Ok(count)
    };
    let mut store = |doc: usize, count: u64, indptr: &mut Vec<u64>| match doc_ids.as_mut() {
        Some(ids) => {
            ids.push(doc as u64);
            indptr.push(count);
        }
        None => indptr[doc + 1] = count,
    };
    while let Some(line) = lines.next_line()? {
        if line.is_empty() {
            continue;
        }
        if seen == nnz {
            return Err(lines.error(format!("more entries than the NNZ = {nnz} of line 3")));
        }
        let (r, c, v) = docword_entry(&lines, &line, rows, cols)?;
        seen += 1;
        if current != Some(r) {
            if let Some(doc) = current {
                if r < doc {
                    return Ok(None); // read in memory instead
                }
                let count = finish_row(&mut row, &mut buf_i, &mut buf_v, &mut written)?;
                store(doc, count, &mut indptr);
            }
            current = Some(r);
        }
        let c = match &word_ids {
            Some(ids) => ids.binary_search(&(c as u64)).expect("every word was seen by the first pass"),
            None => c,
        };
        row.push((c as u32, v));
    }
    if seen != nnz {
        return Err(lines.end_error(format!("{seen} entries but line 3 announced NNZ = {nnz}")));
    }
    if let Some(doc) = current {
        let count = finish_row(&mut row, &mut buf_i, &mut buf_v, &mut written)?;
        store(doc, count, &mut indptr);
    }
    drop(store);
    indices.write(written, &buf_i)?;
    values.write(written, &buf_v)?;
    let stored = written + buf_i.len() as u64;
    let stored_rows = indptr.len() - 1;
    for r in 0..stored_rows {
        indptr[r + 1] += indptr[r];
    }
    debug_assert_eq!(indptr[stored_rows], stored);
    let indptr = FlashPtr::from_slice(dir, &indptr, options)?;
    let stored_cols = word_ids.as_ref().map_or(cols, Vec::len);
    let matrix = FlashCsrMatrix::from_parts(stored_rows, stored_cols, indptr, indices.slice(0..stored)?, values.slice(0..stored)?)?;
    Ok(Some(FlashDocword { matrix, doc_ids, word_ids, documents: rows, words: cols }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn dense(m: &CsrMatrix<f64>) -> Vec<Vec<f64>> {
        let mut d = vec![vec![0.0; m.cols]; m.rows];
        for r in 0..m.rows {
            for k in m.indptr[r] as usize..m.indptr[r + 1] as usize {
                d[r][m.indices[k] as usize] += m.values[k];
            }
        }
        d
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("scalefree-text-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn matrix_market_general_symmetric_pattern() {
        let d = tmp("mm");
        let p = write(&d, "g.mtx", "%%MatrixMarket matrix coordinate real general\n% c\n3 4 4\n1 1 1.5\n3 4 -2\n1 1 0.5\n2 3 7e0\n");
        let m = read_matrix_market::<f64>(&p).unwrap().matrix;
        assert_eq!(dense(&m), vec![vec![2.0, 0.0, 0.0, 0.0], vec![0.0, 0.0, 7.0, 0.0], vec![0.0, 0.0, 0.0, -2.0]]);
        assert_eq!(m.values.len(), 3, "duplicates are summed");
        m.view().validate().unwrap();
        let p = write(&d, "s.mtx", "%%MatrixMarket matrix coordinate integer symmetric\n2 2 2\n1 1 3\n2 1 4\n");
        assert_eq!(dense(&read_matrix_market::<f64>(&p).unwrap().matrix), vec![vec![3.0, 4.0], vec![4.0, 0.0]]);
        let p = write(&d, "k.mtx", "%%MatrixMarket matrix coordinate real skew-symmetric\n2 2 1\n2 1 4\n");
        assert_eq!(dense(&read_matrix_market::<f64>(&p).unwrap().matrix), vec![vec![0.0, -4.0], vec![4.0, 0.0]]);
        let p = write(&d, "p.mtx", "%%MatrixMarket matrix coordinate pattern general\n2 3 2\n1 3\n2 1\n");
        assert_eq!(dense(&read_matrix_market::<f64>(&p).unwrap().matrix), vec![vec![0.0, 0.0, 1.0], vec![1.0, 0.0, 0.0]]);
        let p = write(&d, "e.mtx", "%%MatrixMarket matrix coordinate real general\n0 0 0\n");
        let m = read_matrix_market::<f32>(&p).unwrap().matrix;
        assert_eq!((m.rows, m.cols, m.values.len()), (0, 0, 0));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn matrix_market_with_ids_past_32_bits() {
        let d = tmp("mmwide");
        let (b, w) = (1u64 << 32, 1u64 << 40);
        // Columns past 2^32 − 1 only: the rows stay dense, the used columns are mapped.
        let p = write(&d, "c.mtx", &format!("%%MatrixMarket matrix coordinate real general\n3 {w} 4\n1 {} 2\n3 {w} 5\n1 4 1\n3 4 -1\n", b + 8));
        let t = read_matrix_market::<f64>(&p).unwrap();
        assert_eq!((t.rows, t.cols), (3, w as usize));
        assert_eq!(t.row_ids, None);
        assert_eq!(t.col_ids, Some(vec![3, b + 7, w - 1]));
        assert_eq!((t.matrix.rows, t.matrix.cols), (3, 3));
        assert_eq!(dense(&t.matrix), vec![vec![1.0, 2.0, 0.0], vec![0.0; 3], vec![-1.0, 0.0, 5.0]]);
        // Rows and columns past 2^32 − 1 (up to 2^64 − 1), symmetric: both triangles, both maps.
        let n = u64::MAX;
        let p = write(&d, "s.mtx", &format!("%%MatrixMarket matrix coordinate integer symmetric\n{n} {n} 3\n{} 2 7\n{n} {n} 1\n2 2 3\n", b + 1));
        let t = read_matrix_market::<f64>(&p).unwrap();
        assert_eq!((t.rows, t.cols), (n as usize, n as usize));
        assert_eq!(t.row_ids, Some(vec![1, b, n - 1]));
        assert_eq!(t.col_ids, t.row_ids);
        assert_eq!(dense(&t.matrix), vec![vec![3.0, 7.0, 0.0], vec![7.0, 0.0, 0.0], vec![0.0, 0.0, 1.0]]);
        t.matrix.view().validate().unwrap();
        // Rows past 2^32 − 1 only; an id past the size line is still an error naming the line.
        let p = write(&d, "r.mtx", &format!("%%MatrixMarket matrix coordinate pattern general\n{w} 2 2\n{w} 1\n{} 2\n", b + 1));
        let t = read_matrix_market::<f32>(&p).unwrap();
        assert_eq!((t.row_ids, t.col_ids), (Some(vec![b, w - 1]), None));
        assert_eq!((t.matrix.indptr, t.matrix.indices), (vec![0, 1, 2], vec![1, 0]));
        let p = write(&d, "x.mtx", &format!("%%MatrixMarket matrix coordinate real general\n{w} 2 1\n{} 1 1\n", w + 1));
        let msg = read_matrix_market::<f64>(&p).unwrap_err().to_string();
        assert!(msg.contains("x.mtx") && msg.contains(&format!("line 3: row {} is outside 1..={w}", w + 1)), "{msg}");
        // A symmetric entry whose mirror falls outside a non-square matrix: an error, not a panic.
        let p = write(&d, "m.mtx", "%%MatrixMarket matrix coordinate real symmetric\n2 3 1\n1 3 1\n");
        let msg = read_matrix_market::<f64>(&p).unwrap_err().to_string();
        assert!(msg.contains("line 3: entry (1, 3) has no mirror"), "{msg}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn errors_name_file_and_line() {
        let d = tmp("err");
        let cases = [
            ("a.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n3 1 1\n", "line 4: row 3 is outside 1..=2"),
            ("b.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 x 1\n", "line 3: cannot read column from \"x\""),
            ("c.mtx", "%%MatrixMarket matrix array real general\n2 2\n", "line 1: format \"array\""),
            ("d.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 3\n1 1 1\n", "1 entries but the size line announced 3"),
            ("e.mtx", "hello\n", "line 1: expected '%%MatrixMarket"),
            ("f.txt", "2\n3\n2\n1 1 4\n1 4 1\n", "line 5: wordID 4 is outside 1..=3"),
            ("g.txt", "2\n3\n1\n1 1 4\n2 2 2\n", "line 5: more entries than the NNZ = 1"),
            ("h.txt", "2\n", "missing the vocabulary size W"),
            ("i.txt", "2\n3\n2\n1 1 4\n2 2 nan\n", "line 5: the count NaN is not finite"),
            ("j.mtx", "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 1 inf\n", "line 3: the value inf is not finite"),
        ];
        for (name, text, want) in cases {
            let p = write(&d, name, text);
            let e = if name.ends_with(".mtx") { read_matrix_market::<f64>(&p).unwrap_err() } else { read_docword::<f64>(&p).unwrap_err() };
            let msg = e.to_string();
            assert!(msg.contains(name) && msg.contains(want), "{name}: {msg}");
        }
        let missing = read_docword::<f64>(&d.join("missing.txt")).unwrap_err();
        assert!(matches!(missing, FlashError::Io { .. }));
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn docword_plain_and_gzip_agree() {
        let d = tmp("dw");
        let text = "3\n4\n4\n1 2 3\n1 4 1\n3 1 2\n3 2 5\n";
        let p = write(&d, "docword.t.txt", text);
        let m = read_docword::<f32>(&p).unwrap().matrix;
        assert_eq!(m.indptr, vec![0, 2, 2, 4]);
        assert_eq!(m.indices, vec![1, 3, 0, 1]);
        assert_eq!(m.values, vec![3.0, 1.0, 2.0, 5.0]);
        let gz = d.join("docword.t.txt.gz");
        let mut enc = flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::fast());
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap();
        assert_eq!(read_docword::<f32>(&gz).unwrap().matrix, m);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn docword_streams_to_flash_across_chunks() {
        let d = tmp("stream");
        // 900 documents (some empty, one word repeated within a document), ~6000 entries
        // written in chunks of 1024: the flash matrix equals the in-memory reader's.
        let mut text = String::new();
        let mut entries = Vec::new();
        for doc in 1..=900usize {
            if doc % 7 == 0 {
                continue;
            }
            for k in 0..(doc * 13 % 11) {
                let word = (doc * 31 + k * 17) % 50 + 1;
                entries.push(format!("{doc} {word} {}", k + 1));
                if k == 3 {
                    entries.push(format!("{doc} {word} 2"));
                }
            }
        }
        text.push_str(&format!("902\n50\n{}\n", entries.len()));
        for e in &entries {
            text.push_str(e);
            text.push('\n');
        }
        let p = write(&d, "docword.s.txt", &text);
        let want = read_docword::<f32>(&p).unwrap().matrix;
        assert!(want.values.len() > 3 * 1024);
        let o = FileOptions::default();
        for chunk in [1, 1024, 4096, 1 << 20] {
            let got = docword_to_flash::<f32>(&p, &d, &o, chunk).unwrap().matrix;
            assert!(stream_docword::<f32>(&p, &d, &o, chunk).unwrap().is_some(), "streamed, not the fallback");
            assert_eq!(got.to_csr().unwrap(), want, "chunk {chunk}");
            got.validate().unwrap();
        }
        // docIDs going back: not streamable, read in memory instead, same result
        let p = write(&d, "docword.u.txt", "3\n4\n4\n3 1 2\n1 2 3\n1 4 1\n3 2 5\n");
        assert!(stream_docword::<f64>(&p, &d, &o, 1024).unwrap().is_none());
        assert_eq!(docword_to_flash::<f64>(&p, &d, &o, 1024).unwrap().matrix.to_csr().unwrap(), read_docword::<f64>(&p).unwrap().matrix);
        // empty corpus, and the errors of the in-memory reader
        let p = write(&d, "docword.e.txt", "0\n0\n0\n");
        assert_eq!(docword_to_flash::<f64>(&p, &d, &o, 1024).unwrap().matrix.nnz(), 0);
        for (name, text, want) in [
            ("f.txt", "2\n3\n2\n1 1 4\n1 4 1\n", "line 5: wordID 4 is outside 1..=3"),
            ("g.txt", "2\n3\n1\n1 1 4\n2 2 2\n", "line 5: more entries than the NNZ = 1"),
            ("k.txt", "2\n3\n3\n1 1 4\n2 2 2\n", "2 entries but line 3 announced NNZ = 3"),
        ] {
            let p = write(&d, name, text);
            let msg = docword_to_flash::<f64>(&p, &d, &o, 1024).err().unwrap().to_string();
            assert!(msg.contains(name) && msg.contains(want), "{name}: {msg}");
        }
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn docword_inputs_as_exported_agree() {
        let d = tmp("exported");
        let o = FileOptions::default();
        let uci = write(&d, "docword.x.txt", "3\n4\n5\n1 2 3\n1 4 1\n3 1 2\n3 2 5\n1 2 1\n");
        let want = read_docword::<f64>(&uci).unwrap().matrix;
        let csv = write(&d, "bow.csv", "doc,word,count\n1,2,3\n1,4,1\n3,1,2\n3,2,5\n1,2,1\n");
        assert_eq!(read_docword_input::<f64>(&csv, None, Header::Auto).unwrap().matrix, want);
        assert_eq!(read_docword_input::<f64>(&uci, None, Header::Auto).unwrap().matrix, want);
        let parts = d.join("parts");
        std::fs::create_dir_all(&parts).unwrap();
        write(&parts, "part-00000.tsv", "1\t2\t3\n1\t4\t1\n");
        write(&parts, "part-00001.tsv", "3\t1\t2\n3\t2\t5\n1\t2\t1\n");
        write(&parts, "_SUCCESS", "");
        let got = docword_input_to_flash::<f64>(&parts, &d, &o, 1024, None, Header::Auto).unwrap();
        assert_eq!(got.matrix.to_csr().unwrap(), want);
        let got = docword_input_to_flash::<f64>(&csv, &d, &o, 1024, Some(Delimiter::Comma), Header::Present).unwrap();
        assert_eq!(got.matrix.to_csr().unwrap(), want);
        // The UCI file streams as before.
        assert_eq!(docword_input_to_flash::<f64>(&uci, &d, &o, 1024, None, Header::Auto).unwrap().matrix.to_csr().unwrap(), want);
        let bad = write(&d, "docword.b.txt", "3\n4\n9\n1 2 3\n");
        let msg = read_docword_input::<f64>(&bad, None, Header::Auto).unwrap_err().to_string();
        assert!(msg.contains("docword.b.txt") && msg.contains("1 entries but line 3 announced NNZ = 9"), "{msg}");
        let bad = write(&d, "b.csv", "doc,word,count\n1,2,3\n1,x,1\n");
        let msg = docword_input_to_flash::<f64>(&bad, &d, &o, 1024, None, Header::Auto).err().unwrap().to_string();
        assert!(msg.contains("b.csv") && msg.contains("line 3: wordID 'x' is not a positive integer"), "{msg}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn docword_with_word_ids_past_32_bits() {
        let d = tmp("wide");
        let o = FileOptions::default();
        let w = 1u64 << 40;
        let text = format!("3\n{w}\n5\n1 {} 2\n1 4 1\n1 {} 3\n3 {w} 5\n3 4 1\n", (1u64 << 32) + 2, (1u64 << 32) + 2);
        let p = write(&d, "docword.w.txt", &text);
        let got = docword_to_flash::<f64>(&p, &d, &o, 1024).unwrap();
        assert_eq!(got.words, w as usize);
        assert_eq!(got.word_ids, Some(vec![3, 1 << 32 | 1, w - 1]));
        let m = got.matrix.to_csr().unwrap();
        assert_eq!((m.rows, m.cols), (3, 3));
        assert_eq!(m.indptr, vec![0, 2, 2, 4]);
        assert_eq!(m.indices, vec![0, 1, 0, 2]);
        assert_eq!(m.values, vec![1.0, 5.0, 1.0, 5.0]);
        // docIDs going back: read in memory (64-bit triplets), the same matrix as streamed
        let back = format!("3\n{w}\n5\n3 {w} 5\n1 4 1\n1 {} 2\n3 4 1\n1 {} 3\n", (1u64 << 32) + 2, (1u64 << 32) + 2);
        let p = write(&d, "docword.wu.txt", &back);
        let got = docword_to_flash::<f64>(&p, &d, &o, 1024).unwrap();
        assert_eq!(got.word_ids, Some(vec![3, 1 << 32 | 1, w - 1]));
        assert_eq!(got.matrix.to_csr().unwrap(), m);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn docword_with_document_ids_past_32_bits() {
        // D = 2^34 documents, a handful used (ids like 2^33 + k): a row per used document and
        // its id, nothing per id of the space; streamed, in memory (docIDs going back) and as
        // exported triples without the UCI lines, all alike.
        let d = tmp("widedocs");
        let o = FileOptions::default();
        let (big, b) = (1u64 << 34, 1u64 << 33);
        let lines = [(5, 2, 1.0), (b + 1, 3, 2.0), (b + 1, 1, 4.0), (b + 1, 3, 1.0), (b + 7, 2, 5.0), (big, 1, 6.0)];
        let body: String = lines.iter().map(|(doc, word, c)| format!("{doc} {word} {c}\n")).collect();
        let p = write(&d, "docword.d.txt", &format!("{big}\n3\n{}\n{body}", lines.len()));
        let want_ids = vec![4, b, b + 6, big - 1];
        let want = CsrMatrix::<f64> { rows: 4, cols: 3, indptr: vec![0, 1, 3, 4, 5], indices: vec![1, 0, 2, 1, 0], values: vec![1.0, 4.0, 3.0, 5.0, 6.0] };
        let streamed = stream_docword::<f64>(&p, &d, &o, 1024).unwrap().expect("ascending: streamed");
        assert_eq!((streamed.doc_ids.as_ref(), streamed.word_ids.as_ref(), streamed.documents, streamed.words), (Some(&want_ids), None, big as usize, 3));
        assert_eq!(streamed.matrix.to_csr().unwrap(), want);
        streamed.matrix.validate().unwrap();
        let t = read_docword::<f64>(&p).unwrap();
        assert_eq!((t.row_ids.as_ref(), t.col_ids.as_ref(), t.rows), (Some(&want_ids), None, big as usize));
        assert_eq!(t.matrix, want);
        let mut back = lines;
        back.swap(0, 5);
        let body: String = back.iter().map(|(doc, word, c)| format!("{doc} {word} {c}\n")).collect();
        let p = write(&d, "docword.db.txt", &format!("{big}\n3\n{}\n{body}", lines.len()));
        assert!(stream_docword::<f64>(&p, &d, &o, 1024).unwrap().is_none());
        let got = docword_to_flash::<f64>(&p, &d, &o, 1024).unwrap();
        assert_eq!(got.doc_ids.as_ref(), Some(&want_ids));
        assert_eq!(got.matrix.to_csr().unwrap(), want);
        let csv: String = back.iter().map(|(doc, word, c)| format!("{doc},{word},{c}\n")).collect();
        let p = write(&d, "bow.csv", &format!("doc,word,count\n{csv}"));
        let got = docword_input_to_flash::<f64>(&p, &d, &o, 1024, None, Header::Auto).unwrap();
        assert_eq!((got.doc_ids.as_ref(), got.documents), (Some(&want_ids), big as usize));
        assert_eq!(got.matrix.to_csr().unwrap(), want);
        // Ids past the header's D are still an error naming the line.
        let p = write(&d, "docword.dx.txt", &format!("{big}\n3\n1\n{} 1 1\n", big + 1));
        let msg = docword_to_flash::<f64>(&p, &d, &o, 1024).err().unwrap().to_string();
        assert!(msg.contains("line 4: docID") && msg.contains("outside"), "{msg}");
        std::fs::remove_dir_all(d).unwrap();
    }
}
