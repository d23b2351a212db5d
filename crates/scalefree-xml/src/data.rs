//! Points to score, read as a stream of batches.
//!
//! Text input is the Extreme Classification Repository's format — a header `N F L`, then one
//! point per line, `l1,l2,... f:v f:v ...` — or the same lines without the header (multi-label
//! svmlight). Labels may be absent (a line starting with a feature); feature ids are taken as
//! written (0-based in the repository's files); `#` starts a comment (a line that is only a
//! comment is no point; an empty line is a point with nothing). Lines are read one batch
//! at a time: memory is one batch, whatever the file's size. Errors name the file and line.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use scalefree_flash::{Element, FlashCsrMatrix, FlashError, Result};

/// A batch of points in CSR form, with their true labels when the input has them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// Index of its first point in the input.
    pub first_point: u64,
    pub indptr: Vec<u64>,
    pub indices: Vec<u32>,
    pub values: Vec<f32>,
    /// `label_ptr[i]..label_ptr[i+1]` are point i's labels (empty when the input has none).
    pub label_ptr: Vec<u64>,
    pub labels: Vec<u32>,
}

impl Batch {
    /// An empty batch starting at point `first_point`.
    pub fn new(first_point: u64) -> Batch {
        Batch { first_point, indptr: vec![0], label_ptr: vec![0], ..Batch::default() }
    }

    /// Points in the batch.
    pub fn len(&self) -> usize {
        self.indptr.len() - 1
    }

    /// True when it holds no point.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Point i's true labels.
    pub fn point_labels(&self, i: usize) -> &[u32] {
        if self.label_ptr.len() <= i + 1 {
            return &[];
        }
        &self.labels[self.label_ptr[i] as usize..self.label_ptr[i + 1] as usize]
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> u64 {
        (8 * (self.indptr.len() + self.label_ptr.len()) + 8 * self.indices.len() + 4 * self.labels.len()) as u64
    }
}

fn bad_line(path: &Path, line: u64, why: impl std::fmt::Display) -> FlashError {
    FlashError::invalid(format!("{}:{line}: {why}", path.display()))
}

/// Reads a text file of points batch by batch.
pub struct TextReader {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    line_no: u64,
    points_read: u64,
    declared_points: Option<u64>,
    n_features: u64,
    batch_points: usize,
    pending: Option<String>,
    saw_labels: bool,
    done: bool,
    features: Vec<(u32, f32)>,
}

fn is_header(line: &str) -> Option<[u64; 3]> {
    let toks: Vec<&str> = line.split_ascii_whitespace().collect();
    if toks.len() != 3 {
        return None;
    }
    let mut out = [0u64; 3];
    for (o, t) in out.iter_mut().zip(&toks) {
        *o = t.parse().ok()?;
    }
    Some(out)
}

impl TextReader {
    /// Opens `path`; feature ids must lie below `n_features` (the model's).
    pub fn open(path: &Path, n_features: u64, batch_points: usize) -> Result<TextReader> {
        let file = File::open(path).map_err(|e| FlashError::io(path, e))?;
        let mut reader = TextReader {
            path: path.to_path_buf(),
            reader: Box::new(BufReader::with_capacity(1 << 20, file)),
            line_no: 0,
            points_read: 0,
            declared_points: None,
            n_features,
            batch_points: batch_points.max(1),
            pending: None,
            saw_labels: false,
            done: false,
            features: Vec::new(),
        };
        // The first data or header line decides the format.
        loop {
            let Some(line) = reader.next_line()? else {
                return Err(FlashError::invalid(format!("{}: no data points (empty file)", path.display())));
            };
            let body = line.split('#').next().unwrap_or("").trim();
            if body.is_empty() {
                continue;
            }
            if let Some([points, features, _labels]) = is_header(body) {
                reader.declared_points = Some(points);
                if features > n_features {
                    return Err(bad_line(path, reader.line_no, format!("the data has {features} features, the model {n_features}")));
                }
                if points == 0 {
                    return Err(bad_line(path, reader.line_no, "the header declares no data points"));
                }
            } else {
                reader.pending = Some(line);
            }
            break;
        }
        Ok(reader)
    }

    fn next_line(&mut self) -> Result<Option<String>> {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).map_err(|e| FlashError::invalid(format!("{}:{}: {e}", self.path.display(), self.line_no + 1)))?;
        if n == 0 {
            return Ok(None);
        }
        self.line_no += 1;
        Ok(Some(line))
    }

    /// Whether any line so far had labels.
    pub fn has_labels(&self) -> bool {
        self.saw_labels
    }

    fn parse_into(&mut self, line: &str, batch: &mut Batch) -> Result<bool> {
        if line.trim_start().starts_with('#') {
            return Ok(false);
        }
        let body = line.split('#').next().unwrap_or("");
        let mut toks = body.split_ascii_whitespace().peekable();
        let at = self.line_no;
        // An empty line is a point without labels or features (as omikuji reads it).
        let first = toks.peek().copied().unwrap_or("");
        if !first.is_empty() && !first.contains(':') {
            toks.next();
            for label in first.split(',').filter(|s| !s.is_empty()) {
                let id: u32 = label.parse().map_err(|_| bad_line(&self.path, at, format!("label {label:?} is not a non-negative integer")))?;
                batch.labels.push(id);
                self.saw_labels = true;
            }
        }
        self.features.clear();
        for tok in toks {
            let (f, v) = tok.split_once(':').ok_or_else(|| bad_line(&self.path, at, format!("{tok:?} is not feature:value")))?;
            let f: u64 = f.parse().map_err(|_| bad_line(&self.path, at, format!("feature id {f:?} is not a non-negative integer")))?;
            let v: f32 = v.parse().map_err(|_| bad_line(&self.path, at, format!("value {v:?} is not a number")))?;
            if f >= self.n_features {
                return Err(bad_line(&self.path, at, format!("feature id {f} is past the model's {} features", self.n_features)));
            }
            if !v.is_finite() {
                return Err(bad_line(&self.path, at, format!("value {v} is not finite")));
            }
            self.features.push((f as u32, v));
        }
        self.features.sort_unstable_by_key(|&(f, _)| f);
        if self.features.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(bad_line(&self.path, at, "a feature id appears twice"));
        }
        for &(f, v) in &self.features {
            batch.indices.push(f);
            batch.values.push(v);
        }
        batch.indptr.push(batch.indices.len() as u64);
        batch.label_ptr.push(batch.labels.len() as u64);
        Ok(true)
    }

    /// The next batch, or `None` at the end of the file.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        if self.done {
            return Ok(None);
        }
        let mut batch = Batch::new(self.points_read);
        while batch.len() < self.batch_points {
            let line = match self.pending.take() {
                Some(l) => l,
                None => match self.next_line()? {
                    Some(l) => l,
                    None => {
                        self.done = true;
                        break;
                    }
                },
            };
            if self.parse_into(&line, &mut batch)? {
                self.points_read += 1;
            }
        }
        if self.done {
            if self.points_read == 0 {
                return Err(FlashError::invalid(format!("{}: no data points", self.path.display())));
            }
            if let Some(n) = self.declared_points {
                if n != self.points_read {
                    return Err(FlashError::invalid(format!("{}: the header declares {n} points but the file holds {} (truncated?)", self.path.display(), self.points_read)));
                }
            }
        }
        Ok((!batch.is_empty()).then_some(batch))
    }
}

impl Iterator for TextReader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        match self.next_batch() {
            Ok(Some(b)) => Some(Ok(b)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Appends rows of a CSR block to `batch`: `indptr` relative to `indices` / `values` (its first
/// entry need not be 0), rows numbered from `first_row` in messages. Each row's entries are
/// sorted by feature; a feature id at or past `n_features`, a negative one or a duplicate is
/// an error naming the row.
pub fn push_csr_rows<I, V>(batch: &mut Batch, first_row: u64, indptr: &[I], indices: &[i64], values: &[V], n_features: u64, row: &mut Vec<(u32, f32)>) -> Result<()>
where
    I: Copy + Into<i64>,
    V: Copy + Into<f64>,
{
    let base: i64 = indptr.first().map_or(0, |&x| x.into());
    for r in 0..indptr.len().saturating_sub(1) {
        let (a, b) = ((indptr[r].into() - base) as usize, (indptr[r + 1].into() - base) as usize);
        row.clear();
        for k in a..b {
            let f = indices[k];
            if f < 0 || f as u64 >= n_features {
                return Err(FlashError::invalid(format!("row {}: feature id {f} is past the model's {n_features} features", first_row + r as u64)));
            }
            let v = values[k].into() as f32;
            if !v.is_finite() {
                return Err(FlashError::invalid(format!("row {}: value {v} is not finite", first_row + r as u64)));
            }
            row.push((f as u32, v));
        }
        row.sort_unstable_by_key(|&(f, _)| f);
        if row.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(FlashError::invalid(format!("row {}: a feature id appears twice (sum duplicates first)", first_row + r as u64)));
        }
        for &(f, v) in row.iter() {
            batch.indices.push(f);
            batch.values.push(v);
        }
        batch.indptr.push(batch.indices.len() as u64);
        batch.label_ptr.push(0);
    }
    Ok(())
}

/// Batches of an in-memory CSR matrix (copied batch by batch).
pub struct CsrBatches<'a> {
    pub indptr: &'a [i64],
    pub indices: &'a [i32],
    pub values: &'a [f32],
    pub n_features: u64,
    pub batch_points: usize,
    pub next_row: usize,
}

impl Iterator for CsrBatches<'_> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let n_rows = self.indptr.len().saturating_sub(1);
        if self.next_row >= n_rows {
            return None;
        }
        let end = (self.next_row + self.batch_points.max(1)).min(n_rows);
        let mut batch = Batch::new(self.next_row as u64);
        let (a, b) = (self.indptr[self.next_row] as usize, self.indptr[end] as usize);
        let indices: Vec<i64> = self.indices[a..b].iter().map(|&f| f as i64).collect();
        let result = push_csr_rows(&mut batch, self.next_row as u64, &self.indptr[self.next_row..=end], &indices, &self.values[a..b], self.n_features, &mut Vec::new());
        self.next_row = if result.is_ok() { end } else { n_rows };
        Some(result.map(|()| batch))
    }
}

/// Batches of a CSR matrix on flash (`scalefree.flash.Csr`), read a batch of rows at a time:
/// memory is one batch, whatever the matrix's size.
pub struct FlashCsrBatches<'a, T: Element + Into<f64>> {
    matrix: &'a FlashCsrMatrix<T>,
    n_features: u64,
    batch_points: usize,
    next_row: usize,
    indptr: Vec<u64>,
    indices: Vec<u64>,
    values: Vec<T>,
    wide: Vec<i64>,
    row: Vec<(u32, f32)>,
}

impl<'a, T: Element + Into<f64>> FlashCsrBatches<'a, T> {
    /// Batches of `batch_points` rows of `matrix`; feature ids must lie below `n_features`.
    pub fn new(matrix: &'a FlashCsrMatrix<T>, n_features: u64, batch_points: usize) -> Result<Self> {
        if matrix.rows() == 0 {
            return Err(FlashError::invalid("no data points (the matrix has no rows)"));
        }
        Ok(FlashCsrBatches { matrix, n_features, batch_points: batch_points.max(1), next_row: 0, indptr: Vec::new(), indices: Vec::new(), values: Vec::new(), wide: Vec::new(), row: Vec::new() })
    }

    fn read_batch(&mut self, end: usize) -> Result<Batch> {
        let m = self.matrix;
        let start = self.next_row;
        self.indptr.resize(end - start + 1, 0);
        m.indptr().read(start as u64, &mut self.indptr)?;
        let (a, b) = (self.indptr[0], self.indptr[end - start]);
        if a > b || b > m.nnz() {
            return Err(FlashError::invalid(format!("rows {start}..{end}: indptr out of order")));
        }
        let nnz = (b - a) as usize;
        self.indices.resize(nnz, 0);
        self.values.resize(nnz, T::default());
        m.indices().read_u64(a, &mut self.indices)?;
        m.values().read(a, &mut self.values)?;
        self.wide.clear();
        self.wide.extend(self.indices.iter().map(|&f| f as i64));
        let indptr: Vec<i64> = self.indptr.iter().map(|&x| x as i64).collect();
        let mut batch = Batch::new(start as u64);
        push_csr_rows(&mut batch, start as u64, &indptr, &self.wide, &self.values, self.n_features, &mut self.row)?;
        Ok(batch)
    }
}

impl<T: Element + Into<f64>> Iterator for FlashCsrBatches<'_, T> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let n_rows = self.matrix.rows();
        if self.next_row >= n_rows {
            return None;
        }
        let end = (self.next_row + self.batch_points).min(n_rows);
        let result = self.read_batch(end);
        self.next_row = if result.is_ok() { end } else { n_rows };
        Some(result)
    }
}
