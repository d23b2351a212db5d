//! Parquet files through the `parquet` crate's column readers (no Arrow arrays): the footer
//! gives the columns and the rows of every row group; a row group is read column chunk by
//! column chunk, in batches, with the definition levels checked for nulls.

use std::fs::File;
use std::path::Path;

use parquet::basic::{ConvertedType, LogicalType, Type as PhysicalType};
use parquet::column::reader::{get_typed_column_reader, ColumnReader};
use parquet::data_type::{DataType, DoubleType, FloatType, Int32Type, Int64Type};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::ColumnDescriptor;

use parquet::file::reader::RowGroupReader;

use crate::{format_error, io_error, push_ids, push_values, ColumnInfo, EdgeKeys, KeySources, KeyTargets, Kind, Layout, Limits, PutIds, Result, Share, Source};

/// Rows decoded per call of the column reader.
const BATCH_ROWS: usize = 64 * 1024;

pub(crate) struct ParquetSource {
    layout: Layout,
    reader: SerializedFileReader<File>,
}

fn kind_of(c: &ColumnDescriptor) -> (Kind, String) {
    if c.max_rep_level() > 0 || c.path().parts().len() > 1 {
        return (Kind::Other, "a nested column".into());
    }
    let physical = c.physical_type();
    let int = |bits: u8, signed: bool| (Kind::Int { bits, signed }, format!("{}{bits}", if signed { "int" } else { "uint" }));
    match (physical, c.logical_type_ref(), c.converted_type()) {
        (PhysicalType::INT32 | PhysicalType::INT64, Some(LogicalType::Integer { bit_width, is_signed }), _) => int(*bit_width as u8, *is_signed),
        (PhysicalType::INT32 | PhysicalType::INT64, Some(l), _) => (Kind::Other, format!("{l:?} ({physical})")),
        (PhysicalType::INT32 | PhysicalType::INT64, None, ct) => match ct {
            ConvertedType::NONE => int(if physical == PhysicalType::INT32 { 32 } else { 64 }, true),
            ConvertedType::INT_8 => int(8, true),
            ConvertedType::INT_16 => int(16, true),
            ConvertedType::INT_32 => int(32, true),
            ConvertedType::INT_64 => int(64, true),
            ConvertedType::UINT_8 => int(8, false),
            ConvertedType::UINT_16 => int(16, false),
            ConvertedType::UINT_32 => int(32, false),
            ConvertedType::UINT_64 => int(64, false),
            other => (Kind::Other, format!("{other} ({physical})")),
        },
        (PhysicalType::FLOAT, _, _) => (Kind::Float, "float32".into()),
        (PhysicalType::DOUBLE, _, _) => (Kind::Float, "float64".into()),
        (PhysicalType::BYTE_ARRAY, Some(LogicalType::String), _) | (PhysicalType::BYTE_ARRAY, _, ConvertedType::UTF8) => (Kind::Other, "a string column".into()),
        (p, Some(l), _) => (Kind::Other, format!("{l:?} ({p})")),
        (p, None, _) => (Kind::Other, format!("{p}")),
    }
}

impl ParquetSource {
    pub(crate) fn open(path: &Path) -> Result<ParquetSource> {
        let file = File::open(path).map_err(|e| io_error(path, e))?;
        let reader = SerializedFileReader::new(file).map_err(|e| format_error(path, format!("not a readable Parquet file ({e})")))?;
        let meta = reader.metadata();
        let columns = meta
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .map(|c| {
                let (kind, type_name) = kind_of(c);
                ColumnInfo { name: c.path().string(), kind, type_name }
            })
            .collect();
        let mut unit_rows = Vec::with_capacity(meta.num_row_groups());
        for (g, rg) in meta.row_groups().iter().enumerate() {
            let n = u64::try_from(rg.num_rows()).map_err(|_| format_error(path, format!("row group {g} has {} rows", rg.num_rows())))?;
            unit_rows.push(n);
        }
        Ok(ParquetSource { layout: Layout { path: path.to_path_buf(), columns, unit_rows }, reader })
    }

    /// Reads all of a column chunk of physical type `T`, calling `take` on each batch of
    /// values; nulls are an error.
    fn read_column<T: DataType>(&self, reader: ColumnReader, name: &str, group: usize, max_def: i16, mut take: impl FnMut(&[T::T]) -> Result<()>) -> Result<u64>
    where
        T::T: Clone,
    {
        let path = &self.layout.path;
        let mut r = get_typed_column_reader::<T>(reader);
        let mut values: Vec<T::T> = Vec::with_capacity(BATCH_ROWS);
        let mut defs: Vec<i16> = Vec::new();
        let mut rows = 0u64;
        loop {
            values.clear();
            defs.clear();
            let (records, n_values, _levels) = r
                .read_records(BATCH_ROWS, if max_def > 0 { Some(&mut defs) } else { None }, None, &mut values)
                .map_err(|e| format_error(path, format!("column '{name}', row group {group}: {e}")))?;
            if records == 0 {
                break;
            }
            if n_values != records {
                let at = defs.iter().position(|&d| d < max_def).unwrap_or(0) as u64;
                return Err(format_error(path, format!("column '{name}', row group {group}: null at row {} of the group (nulls are not allowed)", rows + at)));
            }
            take(&values[..n_values])?;
            rows += records as u64;
        }
        Ok(rows)
    }
}

impl ParquetSource {
    /// Reads the integer column `c` of row group `unit` into `out`, checking the ids against
    /// `limits`; the rows read.
    fn read_ids(&self, group: &dyn RowGroupReader, c: usize, unit: usize, limits: &Limits, out: &mut impl PutIds) -> Result<u64> {
        let path = self.layout.path.as_path();
        let info = &self.layout.columns[c];
        let name = info.name.as_str();
        let where_ = format!("row group {unit}");
        let max_def = self.reader.metadata().file_metadata().schema_descr().column(c).max_def_level();
        let reader = group.get_column_reader(c).map_err(|e| format_error(path, format!("column '{name}', {where_}: {e}")))?;
        let unsigned = matches!(info.kind, Kind::Int { signed: false, .. });
        match reader {
            ColumnReader::Int32ColumnReader(_) if unsigned => self.read_column::<Int32Type>(reader, name, unit, max_def, |v| push_ids(path, name, &where_, v.iter().map(|&x| x as u32), limits.max_id, out)),
            ColumnReader::Int32ColumnReader(_) => self.read_column::<Int32Type>(reader, name, unit, max_def, |v| push_ids(path, name, &where_, v.iter().copied(), limits.max_id, out)),
            ColumnReader::Int64ColumnReader(_) if unsigned => self.read_column::<Int64Type>(reader, name, unit, max_def, |v| push_ids(path, name, &where_, v.iter().map(|&x| x as u64), limits.max_id, out)),
            ColumnReader::Int64ColumnReader(_) => self.read_column::<Int64Type>(reader, name, unit, max_def, |v| push_ids(path, name, &where_, v.iter().copied(), limits.max_id, out)),
            _ => Err(format_error(path, format!("column '{name}' is {}, expected an integer type (ids)", info.type_name))),
        }
    }

    fn check_rows(&self, c: usize, unit: usize, rows: u64) -> Result<()> {
        let expect = self.layout.unit_rows[unit];
        if rows != expect {
            let name = &self.layout.columns[c].name;
            return Err(format_error(&self.layout.path, format!("column '{name}', row group {unit}: {rows} rows, the footer says {expect} (truncated or corrupt file)")));
        }
        Ok(())
    }
}

impl Source for ParquetSource {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn read_unit(&mut self, unit: usize, cols: &[usize], limits: &Limits, out: &mut Share) -> Result<()> {
        let path = self.layout.path.clone();
        let path = path.as_path();
        let group = self.reader.get_row_group(unit).map_err(|e| format_error(path, format!("row group {unit}: {e}")))?;
        let schema = self.reader.metadata().file_metadata().schema_descr_ptr();
        let where_ = format!("row group {unit}");
        for (k, &c) in cols.iter().enumerate() {
            let rows = if k < 2 {
                self.read_ids(group.as_ref(), c, unit, limits, &mut out.ids[k])?
            } else {
                let info = &self.layout.columns[c];
                let name = info.name.as_str();
                let max_def = schema.column(c).max_def_level();
                let reader = group.get_column_reader(c).map_err(|e| format_error(path, format!("column '{name}', {where_}: {e}")))?;
                let unsigned = matches!(info.kind, Kind::Int { signed: false, .. });
                let dst = &mut out.values;
                match reader {
                    ColumnReader::Int32ColumnReader(_) if unsigned => self.read_column::<Int32Type>(reader, name, unit, max_def, |v| push_values(path, name, &where_, v.iter().map(|&x| x as u32 as f64), dst))?,
                    ColumnReader::Int32ColumnReader(_) => self.read_column::<Int32Type>(reader, name, unit, max_def, |v| push_values(path, name, &where_, v.iter().map(|&x| x as f64), dst))?,
                    ColumnReader::Int64ColumnReader(_) if unsigned => self.read_column::<Int64Type>(reader, name, unit, max_def, |v| push_values(path, name, &where_, v.iter().map(|&x| x as u64 as f64), dst))?,
                    ColumnReader::Int64ColumnReader(_) => self.read_column::<Int64Type>(reader, name, unit, max_def, |v| push_values(path, name, &where_, v.iter().map(|&x| x as f64), dst))?,
                    ColumnReader::FloatColumnReader(_) => self.read_column::<FloatType>(reader, name, unit, max_def, |v| push_values(path, name, &where_, v.iter().map(|&x| x as f64), dst))?,
                    ColumnReader::DoubleColumnReader(_) => self.read_column::<DoubleType>(reader, name, unit, max_def, |v| push_values(path, name, &where_, v.iter().copied(), dst))?,
                    _ => return Err(format_error(path, format!("column '{name}' is {}, expected a numeric type (ratings)", info.type_name))),
                }
            };
            self.check_rows(c, unit, rows)?;
        }
        Ok(())
    }

    fn read_unit_keys(&mut self, unit: usize, cols: &[usize], limits: &Limits, out: &mut EdgeKeys) -> Result<()> {
        let group = self.reader.get_row_group(unit).map_err(|e| format_error(&self.layout.path, format!("row group {unit}: {e}")))?;
        // The sources as the keys' high halves, then the targets or-ed into their low halves.
        let base = out.keys.len();
        let rows = self.read_ids(group.as_ref(), cols[0], unit, limits, &mut KeySources(out))?;
        self.check_rows(cols[0], unit, rows)?;
        if out.wide {
            return Ok(());
        }
        let rows = self.read_ids(group.as_ref(), cols[1], unit, limits, &mut KeyTargets { keys: out, at: base })?;
        self.check_rows(cols[1], unit, rows)
    }
}
