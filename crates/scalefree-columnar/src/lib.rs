//! Partitioned columnar input: rank `r` of `P` reads only its share of the rows of a Parquet
//! file or an Arrow IPC file (Feather v2), or of a part directory of such files.
//!
//! - The unit of a share is a row group (Parquet) or a record batch (Arrow IPC). Every rank
//!   reads the footers of all files (and, for Arrow IPC, the small header of every record
//!   batch) to learn the rows of every unit; the units, in file order and then unit order,
//!   are given to the ranks by rows: unit `u` starting at row `s_u` with `n_u` rows goes to
//!   rank `floor((s_u + n_u / 2) * P / N)` of a total of `N` rows. The shares are contiguous
//!   and together hold every row once, in file order; a rank with no unit gets nothing (a
//!   file of fewer row groups than ranks). A rank then reads its units' column chunks only.
//! - Columns are chosen by name ([`Columns::Named`]) or by default: the first two integer
//!   columns of the first file (edges), or those and the first numeric column after them
//!   (ratings). The parts of a directory must have the chosen columns, of integer type (ids)
//!   or numeric type (ratings).
//! - Ids are integers of any width, signed or unsigned, non-negative and at most the caller's
//!   bound; ratings are any integer or floating point type, finite, returned as `f32`.
//! - Errors are one line naming the file, and the column and row group or batch where there
//!   is one: nulls, a wrong type, a missing column, a truncated or corrupt file.
//!
//! The formats are told apart by their magic bytes ([`sniff`]): `PAR1` at both ends (Parquet),
//! `ARROW1` (Arrow IPC file, Feather v2).

mod ipc;
mod parquet_file;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

pub use scalefree_io::{EdgeKeys, ReadError, Result};

/// A columnar format, from the first bytes of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Parquet,
    ArrowIpc,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Parquet => "Parquet",
            Format::ArrowIpc => "Arrow IPC",
        }
    }
}

/// The columnar format of `path` by its magic bytes, or None for any other file (text,
/// gzip, ...). An unreadable file is an error.
pub fn sniff(path: &Path) -> Result<Option<Format>> {
    let mut f = File::open(path).map_err(|e| io_error(path, e))?;
    let mut head = [0u8; 6];
    let mut got = 0;
    while got < head.len() {
        match f.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(path, e)),
        }
    }
    Ok(if got >= 4 && &head[..4] == b"PAR1" {
        Some(Format::Parquet)
    } else if got == 6 && &head == b"ARROW1" {
        Some(Format::ArrowIpc)
    } else {
        None
    })
}

/// What a share holds: two id columns, and for ratings a third, numeric one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// `src dst`: two integer columns.
    Edges,
    /// `user item rating`: two integer columns and a numeric one.
    Ratings,
}

impl Table {
    fn width(self) -> usize {
        match self {
            Table::Edges => 2,
            Table::Ratings => 3,
        }
    }
    fn option_example(self) -> &'static str {
        match self {
            Table::Edges => "--columns src,dst",
            Table::Ratings => "--columns user,item,rating",
        }
    }
}

/// Which columns to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Columns {
    /// The first two integer columns (and for ratings the first numeric column after them).
    Default,
    /// By name, as many as the table has columns.
    Named(Vec<String>),
}

/// One rank's rows, in file order: `ids[0]`, `ids[1]` (src/dst or user/item) as written,
/// and `values` (ratings; empty for edges).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Share {
    pub ids: [Vec<i64>; 2],
    pub values: Vec<f32>,
}

/// The type of a column as far as the readers care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An integer of `bits` bits, signed or not.
    Int { bits: u8, signed: bool },
    Float,
    /// Anything else (strings, decimals, dates, nested): named in the error.
    Other,
}

/// A column of a file: its name, type and a description of the type for errors.
#[derive(Clone, Debug)]
pub(crate) struct ColumnInfo {
    pub name: String,
    pub kind: Kind,
    pub type_name: String,
}

/// What every rank learns of a file from its footer (and batch headers): its columns and the
/// rows of each unit.
pub(crate) struct Layout {
    pub path: PathBuf,
    pub columns: Vec<ColumnInfo>,
    pub unit_rows: Vec<u64>,
}

/// One file opened for reading.
pub(crate) trait Source {
    fn layout(&self) -> &Layout;
    /// Reads unit `unit` of the columns `cols` (indices into [`Layout::columns`]) and
    /// appends them to `out` (the last one as values when `table` is ratings).
    fn read_unit(&mut self, unit: usize, cols: &[usize], limits: &Limits, out: &mut Share) -> Result<()>;

    /// Reads unit `unit` of the two id columns `cols` and appends its edges to `out` as
    /// packed keys (by default through [`Source::read_unit`]).
    fn read_unit_keys(&mut self, unit: usize, cols: &[usize], limits: &Limits, out: &mut EdgeKeys) -> Result<()> {
        let mut share = Share::default();
        self.read_unit(unit, cols, limits, &mut share)?;
        for (&s, &d) in share.ids[0].iter().zip(&share.ids[1]) {
            scalefree_io::EdgeSink::push(out, s as u64, d as u64);
        }
        Ok(())
    }
}

/// The bounds a share's values are checked against.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The largest id accepted.
    pub max_id: u64,
}

pub(crate) fn io_error(path: &Path, source: std::io::Error) -> ReadError {
    ReadError::Io { path: path.to_path_buf(), source }
}

pub(crate) fn format_error(path: &Path, msg: impl Into<String>) -> ReadError {
    // One line: the libraries' messages may hold line ends.
    let msg: String = msg.into().split_whitespace().collect::<Vec<_>>().join(" ");
    ReadError::Format { path: path.to_path_buf(), msg }
}

fn open(path: &Path) -> Result<Box<dyn Source>> {
    match sniff(path)? {
        Some(Format::Parquet) => Ok(Box::new(parquet_file::ParquetSource::open(path)?)),
        Some(Format::ArrowIpc) => Ok(Box::new(ipc::IpcSource::open(path)?)),
        None => Err(format_error(path, "not a Parquet or Arrow IPC file (no PAR1 or ARROW1 magic bytes)")),
    }
}

/// The columns of `source` named `names` (ids first, then the rating), checked for their types.
fn choose_columns(path: &Path, source: &dyn Source, names: &[String]) -> Result<Vec<usize>> {
    let cols = &source.layout().columns;
    let list = || cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ");
    let mut out = Vec::with_capacity(names.len());
    for (k, name) in names.iter().enumerate() {
        let Some(i) = cols.iter().position(|c| &c.name == name) else {
            return Err(format_error(path, format!("no column '{name}' (columns: {})", list())));
        };
        let c = &cols[i];
        let want_int = k < 2;
        let ok = match c.kind {
            Kind::Int { .. } => true,
            Kind::Float => !want_int,
            Kind::Other => false,
        };
        if !ok {
            let want = if want_int { "an integer type (ids)" } else { "a numeric type (ratings)" };
            return Err(format_error(path, format!("column '{name}' is {}, expected {want}", c.type_name)));
        }
        out.push(i);
    }
    Ok(out)
}

/// The default column names of `table` in `source`: the first two integer columns (and
/// for ratings the first numeric column after the second).
fn default_names(path: &Path, source: &dyn Source, table: Table) -> Result<Vec<String>> {
    let cols = &source.layout().columns;
    let ints: Vec<usize> = cols.iter().enumerate().filter(|(_, c)| matches!(c.kind, Kind::Int { .. })).map(|(i, _)| i).take(2).collect();
    let described = || cols.iter().map(|c| format!("{} {}", c.name, c.type_name)).collect::<Vec<_>>().join(", ");
    if ints.len() < 2 {
        return Err(format_error(path, format!("expected two integer id columns, found columns: {} (choose them with {})", described(), table.option_example())));
    }
    let mut names: Vec<String> = ints.iter().map(|&i| cols[i].name.clone()).collect();
    if table == Table::Ratings {
        let Some(c) = cols[ints[1] + 1..].iter().find(|c| !matches!(c.kind, Kind::Other)) else {
            return Err(format_error(path, format!("expected a numeric rating column after the id columns '{}' and '{}', found columns: {} (choose them with {})", names[0], names[1], described(), table.option_example())));
        };
        names.push(c.name.clone());
    }
    Ok(names)
}

/// The rank each unit goes to: the unit starting at row `s` with `n` rows of `total` goes to
/// rank `floor((s + n / 2) * size / total)`.
pub fn unit_owners(unit_rows: &[u64], size: usize) -> Vec<usize> {
    let total: u64 = unit_rows.iter().sum();
    let mut start = 0u64;
    unit_rows
        .iter()
        .map(|&n| {
            let mid = start as u128 * 2 + n as u128;
            start += n;
            if total == 0 {
                0
            } else {
                ((mid * size as u128) / (2 * total as u128)).min(size as u128 - 1) as usize
            }
        })
        .collect()
}

/// The files of a share, opened: each source, its chosen columns, and which rank reads
/// each unit (all units of all files, in order).
struct Opened {
    sources: Vec<Box<dyn Source>>,
    chosen: Vec<Vec<usize>>,
    owners: Vec<usize>,
    /// Rows of the caller's units.
    mine: u64,
}

impl Opened {
    /// Calls `read(source, unit, cols)` on the caller's units, in order.
    fn each_unit(&mut self, rank: usize, mut read: impl FnMut(&mut dyn Source, usize, &[usize]) -> Result<bool>) -> Result<()> {
        let mut k = 0;
        for (source, cols) in self.sources.iter_mut().zip(&self.chosen) {
            for unit in 0..source.layout().unit_rows.len() {
                if self.owners[k] == rank && !read(source.as_mut(), unit, cols)? {
                    return Ok(());
                }
                k += 1;
            }
        }
        Ok(())
    }
}

fn open_share(paths: &[PathBuf], rank: usize, size: usize, table: Table, columns: &Columns) -> Result<Opened> {
    if size == 0 || rank >= size {
        return Err(ReadError::InvalidArgument(format!("rank {rank} is not in 0..{size}")));
    }
    let Some(first_path) = paths.first() else {
        return Err(ReadError::InvalidArgument("no input files".into()));
    };
    if let Columns::Named(n) = columns {
        if n.len() != table.width() {
            return Err(ReadError::InvalidArgument(format!("expected {} column names ({}), got {}: {}", table.width(), table.option_example(), n.len(), n.join(","))));
        }
    }
    let mut sources = Vec::with_capacity(paths.len());
    let mut names: Option<Vec<String>> = match columns {
        Columns::Named(n) => Some(n.clone()),
        Columns::Default => None,
    };
    let mut chosen = Vec::with_capacity(paths.len());
    let mut first_format: Option<Format> = None;
    for path in paths {
        let format = sniff(path)?;
        match (first_format, format) {
            (None, None) => return Err(format_error(path, "not a Parquet or Arrow IPC file (no PAR1 or ARROW1 magic bytes)")),
            (Some(a), None) => return Err(format_error(path, format!("not a {} file (no magic bytes), but the first part {} is", a.name(), first_path.display()))),
            (None, Some(f)) => first_format = Some(f),
            (Some(a), Some(b)) if a != b => return Err(format_error(path, format!("an {} file, but the first part {} is {}", b.name(), first_path.display(), a.name()))),
            _ => {}
        }
        let source = open(path)?;
        let names = match &names {
            Some(n) => n.clone(),
            None => {
                let n = default_names(path, source.as_ref(), table)?;
                names = Some(n.clone());
                n
            }
        };
        let cols = choose_columns(path, source.as_ref(), &names).map_err(|e| match (e, path == first_path) {
            (ReadError::Format { path, msg }, false) => ReadError::Format { path, msg: format!("{msg}; the parts must share the columns of {}", first_path.display()) },
            (e, _) => e,
        })?;
        chosen.push(cols);
        sources.push(source);
    }
    let all_rows: Vec<u64> = sources.iter().flat_map(|s| s.layout().unit_rows.iter().copied()).collect();
    let owners = unit_owners(&all_rows, size);
    let mine: u64 = all_rows.iter().zip(&owners).filter(|(_, &o)| o == rank).map(|(&n, _)| n).sum();
    Ok(Opened { sources, chosen, owners, mine })
}

/// Reads rank `rank` of `size`'s share of the files `paths` (one file, or the parts of a
/// directory in name order), each Parquet or Arrow IPC.
pub fn read_share(paths: &[PathBuf], rank: usize, size: usize, table: Table, columns: &Columns, limits: &Limits) -> Result<Share> {
    let mut opened = open_share(paths, rank, size, table, columns)?;
    let mut out = Share::default();
    let n = usize::try_from(opened.mine).unwrap_or(usize::MAX);
    out.ids[0].reserve_exact(n);
    out.ids[1].reserve_exact(n);
    if table == Table::Ratings {
        out.values.reserve_exact(n);
    }
    opened.each_unit(rank, |source, unit, cols| source.read_unit(unit, cols, limits, &mut out).map(|()| true))?;
    Ok(out)
}

/// [`read_share`] of an edge table into packed keys (see [`EdgeKeys`]): the same edges in
/// the same order, half the memory; stops at the first id of 2^32 or more (`wide` set; the
/// caller reads the share again with [`read_share`]).
pub fn read_edge_keys(paths: &[PathBuf], rank: usize, size: usize, columns: &Columns, limits: &Limits) -> Result<EdgeKeys> {
    let mut opened = open_share(paths, rank, size, Table::Edges, columns)?;
    let mut out = EdgeKeys::default();
    out.keys.reserve_exact(usize::try_from(opened.mine).unwrap_or(usize::MAX));
    opened.each_unit(rank, |source, unit, cols| {
        source.read_unit_keys(unit, cols, limits, &mut out)?;
        Ok(!out.wide)
    })?;
    if out.wide {
        out.keys = Vec::new();
    }
    Ok(out)
}

/// Where [`push_ids`] puts the ids it checked.
pub(crate) trait PutIds {
    fn put(&mut self, id: u64);
}

impl PutIds for Vec<i64> {
    #[inline(always)]
    fn put(&mut self, id: u64) {
        self.push(id as i64);
    }
}

/// The source column of packed keys: appends `id << 32`.
pub(crate) struct KeySources<'a>(pub &'a mut EdgeKeys);

impl PutIds for KeySources<'_> {
    #[inline(always)]
    fn put(&mut self, id: u64) {
        if id >> 32 != 0 {
            self.0.wide = true;
        } else {
            self.0.keys.push(id << 32);
        }
    }
}

/// The target column of packed keys: ors `id` into the keys from `at` on (rows past the
/// end are counted, not written: the caller checks the row counts).
pub(crate) struct KeyTargets<'a> {
    pub keys: &'a mut EdgeKeys,
    pub at: usize,
}

impl PutIds for KeyTargets<'_> {
    #[inline(always)]
    fn put(&mut self, id: u64) {
        if id >> 32 != 0 {
            self.keys.wide = true;
        } else if let Some(k) = self.keys.keys.get_mut(self.at) {
            *k |= id;
        }
        self.at += 1;
    }
}

/// Converts the integer ids of one unit, checking the bounds.
pub(crate) fn push_ids<T: Copy + TryInto<i64> + std::fmt::Display>(path: &Path, column: &str, unit: &str, values: impl IntoIterator<Item = T>, max_id: u64, out: &mut impl PutIds) -> Result<()> {
    for v in values {
        match v.try_into() {
            Ok(x) if x >= 0 && x as u64 <= max_id => out.put(x as u64),
            _ => return Err(bad_id(path, column, unit, &v.to_string(), max_id)),
        }
    }
    Ok(())
}

pub(crate) fn bad_id(path: &Path, column: &str, unit: &str, value: &str, max_id: u64) -> ReadError {
    let why = if value.starts_with('-') { "negative id".to_string() } else { format!("id larger than {max_id}") };
    format_error(path, format!("column '{column}', {unit}: {why} {value}"))
}

pub(crate) fn push_values(path: &Path, column: &str, unit: &str, values: impl Iterator<Item = f64>, out: &mut Vec<f32>) -> Result<()> {
    for v in values {
        if !v.is_finite() {
            return Err(format_error(path, format!("column '{column}', {unit}: rating {v} is not finite")));
        }
        out.push(v as f32);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_tile_in_order() {
        for units in [vec![], vec![0], vec![5], vec![3, 3, 3], vec![1, 100, 1, 7, 0, 9], vec![10; 17]] {
            for size in 1..=6 {
                let o = unit_owners(&units, size);
                assert_eq!(o.len(), units.len());
                assert!(o.windows(2).all(|w| w[0] <= w[1]), "{units:?} {size} {o:?}");
                assert!(o.iter().all(|&r| r < size));
            }
        }
        // Equal units, as many as ranks: one each.
        assert_eq!(unit_owners(&[4, 4, 4, 4], 4), vec![0, 1, 2, 3]);
        // Two units, five ranks: ranks 1 and 3 (midpoints).
        assert_eq!(unit_owners(&[4, 4], 5), vec![1, 3]);
    }
}
