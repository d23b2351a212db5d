//! Arrow IPC files (Feather v2) through `arrow-ipc`: the footer gives the schema and the
//! blocks of the record batches; the rows of each batch come from its message header (a few
//! bytes per batch), so a rank plans its share without reading any batch body, then reads
//! its batches (only the chosen columns decoded).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type};
use arrow_array::Array;
use arrow_ipc::reader::FileReader;
use arrow_schema::DataType;

use crate::{format_error, io_error, push_ids, push_values, ColumnInfo, Kind, Layout, Limits, Result, Share, Source};

pub(crate) struct IpcSource {
    layout: Layout,
    /// Opened at the first read, with the projection of the chosen columns.
    reader: Option<(Vec<usize>, FileReader<BufReader<File>>)>,
}

fn kind_of(t: &DataType) -> Kind {
    match t {
        DataType::Int8 => Kind::Int { bits: 8, signed: true },
        DataType::Int16 => Kind::Int { bits: 16, signed: true },
        DataType::Int32 => Kind::Int { bits: 32, signed: true },
        DataType::Int64 => Kind::Int { bits: 64, signed: true },
        DataType::UInt8 => Kind::Int { bits: 8, signed: false },
        DataType::UInt16 => Kind::Int { bits: 16, signed: false },
        DataType::UInt32 => Kind::Int { bits: 32, signed: false },
        DataType::UInt64 => Kind::Int { bits: 64, signed: false },
        DataType::Float16 | DataType::Float32 | DataType::Float64 => Kind::Float,
        _ => Kind::Other,
    }
}

fn read_at(file: &mut File, path: &Path, offset: u64, buf: &mut [u8]) -> Result<()> {
    file.seek(SeekFrom::Start(offset)).map_err(|e| io_error(path, e))?;
    file.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => format_error(path, "not a readable Arrow IPC file (truncated)"),
        _ => io_error(path, e),
    })
}

impl IpcSource {
    pub(crate) fn open(path: &Path) -> Result<IpcSource> {
        let bad = |why: String| format_error(path, format!("not a readable Arrow IPC file ({why})"));
        let mut file = File::open(path).map_err(|e| io_error(path, e))?;
        let len = file.metadata().map_err(|e| io_error(path, e))?.len();
        if len < 16 {
            return Err(bad("truncated".into()));
        }
        let mut tail = [0u8; 10];
        read_at(&mut file, path, len - 10, &mut tail)?;
        let footer_len = arrow_ipc::reader::read_footer_length(tail).map_err(|e| bad(e.to_string()))? as u64;
        if footer_len + 10 > len {
            return Err(bad("truncated".into()));
        }
        let mut fb = vec![0u8; footer_len as usize];
        read_at(&mut file, path, len - 10 - footer_len, &mut fb)?;
        let footer = arrow_ipc::root_as_footer(&fb).map_err(|e| bad(format!("footer: {e}")))?;
        let schema = footer.schema().ok_or_else(|| bad("no schema in the footer".into()))?;
        let schema = arrow_ipc::convert::fb_to_schema(schema);
        let columns = schema.fields().iter().map(|f| ColumnInfo { name: f.name().clone(), kind: kind_of(f.data_type()), type_name: f.data_type().to_string() }).collect();
        let mut unit_rows = Vec::new();
        if let Some(blocks) = footer.recordBatches() {
            let mut head = Vec::new();
            for (b, block) in blocks.iter().enumerate() {
                let (offset, meta_len) = (block.offset(), block.metaDataLength());
                if offset < 0 || meta_len < 8 || offset as u64 + meta_len as u64 > len {
                    return Err(bad(format!("record batch {b} lies outside the file")));
                }
                head.resize(meta_len as usize, 0);
                read_at(&mut file, path, offset as u64, &mut head)?;
                // A message: the continuation marker 0xFFFFFFFF and the length, or (before
                // format 0.15) the length alone, then the flatbuffer.
                let skip = if head[..4] == [0xff; 4] { 8 } else { 4 };
                let message = arrow_ipc::root_as_message(&head[skip..]).map_err(|e| bad(format!("record batch {b}: {e}")))?;
                let batch = message.header_as_record_batch().ok_or_else(|| bad(format!("block {b} is not a record batch")))?;
                unit_rows.push(u64::try_from(batch.length()).map_err(|_| bad(format!("record batch {b} has {} rows", batch.length())))?);
            }
        }
        Ok(IpcSource { layout: Layout { path: path.to_path_buf(), columns, unit_rows }, reader: None })
    }
}

macro_rules! ids {
    ($a:expr, $t:ty, $path:expr, $name:expr, $unit:expr, $max:expr, $dst:expr) => {
        push_ids($path, $name, $unit, $a.as_primitive::<$t>().values().iter().copied(), $max, $dst)
    };
}

macro_rules! values {
    ($a:expr, $t:ty, $path:expr, $name:expr, $unit:expr, $dst:expr) => {
        push_values($path, $name, $unit, $a.as_primitive::<$t>().values().iter().map(|&x| f64::from(x)), $dst)
    };
}

impl Source for IpcSource {
    fn layout(&self) -> &Layout {
        &self.layout
    }

    fn read_unit(&mut self, unit: usize, cols: &[usize], limits: &Limits, out: &mut Share) -> Result<()> {
        let path = self.layout.path.clone();
        let path = path.as_path();
        let bad = |e: arrow_schema::ArrowError| format_error(path, format!("record batch {unit}: {e}"));
        if self.reader.as_ref().is_none_or(|(p, _)| p != cols) {
            let file = File::open(path).map_err(|e| io_error(path, e))?;
            let reader = FileReader::try_new_buffered(file, Some(cols.to_vec())).map_err(|e| format_error(path, format!("not a readable Arrow IPC file ({e})")))?;
            self.reader = Some((cols.to_vec(), reader));
        }
        let (_, reader) = self.reader.as_mut().expect("opened above");
        reader.set_index(unit).map_err(bad)?;
        let batch = reader.next().ok_or_else(|| format_error(path, format!("record batch {unit} is missing")))?.map_err(bad)?;
        let where_ = format!("record batch {unit}");
        let unit_name = where_.as_str();
        for (k, &c) in cols.iter().enumerate() {
            let a = batch.column(k);
            let name = self.layout.columns[c].name.as_str();
            if a.null_count() > 0 {
                let at = (0..a.len()).find(|&i| a.is_null(i)).unwrap_or(0);
                return Err(format_error(path, format!("column '{name}', {unit_name}: null at row {at} of the batch (nulls are not allowed)")));
            }
            let max = limits.max_id;
            let done = if k < 2 {
                let dst = &mut out.ids[k];
                match a.data_type() {
                    DataType::Int8 => ids!(a, Int8Type, path, name, unit_name, max, dst),
                    DataType::Int16 => ids!(a, Int16Type, path, name, unit_name, max, dst),
                    DataType::Int32 => ids!(a, Int32Type, path, name, unit_name, max, dst),
                    DataType::Int64 => ids!(a, Int64Type, path, name, unit_name, max, dst),
                    DataType::UInt8 => ids!(a, UInt8Type, path, name, unit_name, max, dst),
                    DataType::UInt16 => ids!(a, UInt16Type, path, name, unit_name, max, dst),
                    DataType::UInt32 => ids!(a, UInt32Type, path, name, unit_name, max, dst),
                    DataType::UInt64 => ids!(a, UInt64Type, path, name, unit_name, max, dst),
                    t => return Err(format_error(path, format!("column '{name}' is {t}, expected an integer type (ids)"))),
                }
            } else {
                let dst = &mut out.values;
                match a.data_type() {
                    DataType::Int8 => values!(a, Int8Type, path, name, unit_name, dst),
                    DataType::Int16 => values!(a, Int16Type, path, name, unit_name, dst),
                    DataType::Int32 => values!(a, Int32Type, path, name, unit_name, dst),
                    DataType::Int64 => push_values(path, name, unit_name, a.as_primitive::<Int64Type>().values().iter().map(|&x| x as f64), dst),
                    DataType::UInt8 => values!(a, UInt8Type, path, name, unit_name, dst),
                    DataType::UInt16 => values!(a, UInt16Type, path, name, unit_name, dst),
                    DataType::UInt32 => values!(a, UInt32Type, path, name, unit_name, dst),
                    DataType::UInt64 => push_values(path, name, unit_name, a.as_primitive::<UInt64Type>().values().iter().map(|&x| x as f64), dst),
                    DataType::Float16 => push_values(path, name, unit_name, a.as_primitive::<Float16Type>().values().iter().map(|&x| x.to_f64()), dst),
                    DataType::Float32 => values!(a, Float32Type, path, name, unit_name, dst),
                    DataType::Float64 => values!(a, Float64Type, path, name, unit_name, dst),
                    t => return Err(format_error(path, format!("column '{name}' is {t}, expected a numeric type (ratings)"))),
                }
            };
            done?;
            if a.len() as u64 != self.layout.unit_rows[unit] {
                return Err(format_error(path, format!("column '{name}', {unit_name}: {} rows, the batch header says {}", a.len(), self.layout.unit_rows[unit])));
            }
        }
        Ok(())
    }
}
