//! [`FlashCsrMatrix<T>`]: a CSR matrix on flash — three arrays (row starts as `u64`, column
//! indices as `u32`, or as `u64` when the matrix has more than 2^32 columns, values as `T`),
//! either in three files or in one container file.
//!
//! Container layout (little-endian, sections aligned to 4096 bytes):
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | magic `SFCSR\0\0\x01` (32-bit column indices) or `SFCSR\0\0\x02` (64-bit) |
//! | 8..16 | value type name, NUL-padded (`f32`, `f64`, ...) |
//! | 16..24 | rows · 24..32 cols · 32..40 nnz |
//! | 40..48 | indptr offset · 48..56 indices offset · 56..64 values offset |
//! | 64..72 | file length · 72..80 FNV-1a-64 checksum of bytes 0..72 |
//!
//! The index width is picked per matrix: 64-bit only past 2^32 columns, so every other
//! matrix keeps 4-byte indices (and files written before 64-bit indices existed read as
//! before).

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::flash_file::{FileOptions, FlashFile, OpenMode};
use super::flash_ptr::FlashPtr;
use crate::element::{as_bytes, Element};
use crate::error::{FlashError, Result};
use crate::io::aligned_buffer::align_up;
use crate::io::AccessSpec;
use crate::sparse::{needs_wide_indices, ColIndex, CsrMatrix, CsrRef};

const MAGIC: &[u8; 8] = b"SFCSR\0\0\x01";
const MAGIC_WIDE: &[u8; 8] = b"SFCSR\0\0\x02";
const HEADER_BYTES: u64 = 4096;
const HEADER_USED_BYTES: usize = 80;

/// The column indices of a [`FlashCsrMatrix`]: 32-bit unless the matrix has more than 2^32
/// columns.
#[derive(Clone, Debug)]
pub enum FlashIndices {
    /// 4-byte indices (at most 2^32 columns).
    U32(FlashPtr<u32>),
    /// 8-byte indices.
    U64(FlashPtr<u64>),
}

impl From<FlashPtr<u32>> for FlashIndices {
    fn from(p: FlashPtr<u32>) -> Self {
        FlashIndices::U32(p)
    }
}

impl From<FlashPtr<u64>> for FlashIndices {
    fn from(p: FlashPtr<u64>) -> Self {
        FlashIndices::U64(p)
    }
}

impl FlashIndices {
    /// Number of indices.
    pub fn len(&self) -> u64 {
        match self {
            FlashIndices::U32(p) => p.len(),
            FlashIndices::U64(p) => p.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the indices are 64-bit.
    pub fn is_wide(&self) -> bool {
        matches!(self, FlashIndices::U64(_))
    }

    /// Bytes per index (4 or 8).
    pub fn width_bytes(&self) -> u64 {
        if self.is_wide() {
            8
        } else {
            4
        }
    }

    /// Access specifier for indices `start .. start + len` (task buffers hold `u32` or `u64`
    /// as [`FlashIndices::is_wide`] says).
    pub fn access(&self, start: u64, len: u64) -> Result<AccessSpec> {
        match self {
            FlashIndices::U32(p) => p.access(start, len),
            FlashIndices::U64(p) => p.access(start, len),
        }
    }

    /// Indices `range`.
    pub fn slice(&self, range: Range<u64>) -> Result<Self> {
        Ok(match self {
            FlashIndices::U32(p) => FlashIndices::U32(p.slice(range)?),
            FlashIndices::U64(p) => FlashIndices::U64(p.slice(range)?),
        })
    }

    /// Reads `dst.len()` indices from `start`, widened to `u64` when they are 32-bit.
    pub fn read_u64(&self, start: u64, dst: &mut [u64]) -> Result<()> {
        match self {
            FlashIndices::U64(p) => p.read(start, dst),
            FlashIndices::U32(p) => {
                let mut narrow = vec![0u32; dst.len()];
                p.read(start, &mut narrow)?;
                for (d, &c) in dst.iter_mut().zip(&narrow) {
                    *d = c as u64;
                }
                Ok(())
            }
        }
    }

    /// Reads `dst.len()` indices from `start` into 32-bit slots; an error for 64-bit indices.
    pub fn read_u32(&self, start: u64, dst: &mut [u32]) -> Result<()> {
        match self {
            FlashIndices::U32(p) => p.read(start, dst),
            FlashIndices::U64(_) => Err(FlashError::invalid("the matrix has 64-bit column indices (more than 2^32 columns): read them as 64-bit")),
        }
    }
}

/// A `rows x cols` CSR matrix on flash.
pub struct FlashCsrMatrix<T> {
    rows: usize,
    cols: usize,
    indptr: FlashPtr<u64>,
    indices: FlashIndices,
    values: FlashPtr<T>,
}

impl<T> Clone for FlashCsrMatrix<T> {
    fn clone(&self) -> Self {
        FlashCsrMatrix { rows: self.rows, cols: self.cols, indptr: self.indptr.clone(), indices: self.indices.clone(), values: self.values.clone() }
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

struct ContainerLayout {
    indptr_offset: u64,
    indices_offset: u64,
    values_offset: u64,
    file_len: u64,
}

fn container_layout<T: Element>(rows: usize, nnz: usize, wide: bool) -> ContainerLayout {
    let indptr_offset = HEADER_BYTES;
    let indices_offset = align_up(indptr_offset + (rows as u64 + 1) * 8);
    let values_offset = align_up(indices_offset + nnz as u64 * if wide { 8 } else { 4 });
    let file_len = values_offset + nnz as u64 * std::mem::size_of::<T>() as u64;
    ContainerLayout { indptr_offset, indices_offset, values_offset, file_len }
}

fn encode_header<T: Element>(rows: usize, cols: usize, nnz: usize, wide: bool, layout: &ContainerLayout) -> [u8; HEADER_USED_BYTES] {
    let mut header = [0u8; HEADER_USED_BYTES];
    header[0..8].copy_from_slice(if wide { MAGIC_WIDE } else { MAGIC });
    let name = T::NAME.as_bytes();
    header[8..8 + name.len().min(8)].copy_from_slice(&name[..name.len().min(8)]);
    let fields = [rows as u64, cols as u64, nnz as u64, layout.indptr_offset, layout.indices_offset, layout.values_offset, layout.file_len];
    for (i, v) in fields.iter().enumerate() {
        header[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    let sum = fnv1a64(&header[..72]);
    header[72..80].copy_from_slice(&sum.to_le_bytes());
    header
}

impl<T: Element> FlashCsrMatrix<T> {
    /// Assembles a matrix from three arrays (e.g. three files); the indices are a
    /// `FlashPtr<u32>` or `FlashPtr<u64>`. Checks lengths only; call
    /// [`FlashCsrMatrix::validate`] to check the contents.
    pub fn from_parts(rows: usize, cols: usize, indptr: FlashPtr<u64>, indices: impl Into<FlashIndices>, values: FlashPtr<T>) -> Result<Self> {
        let indices = indices.into();
        if indptr.len() != rows as u64 + 1 {
            return Err(FlashError::shape(format!("indptr has {} entries for {rows} rows (needs rows + 1)", indptr.len())));
        }
        if indices.len() != values.len() {
            return Err(FlashError::shape(format!("{} column indices but {} values", indices.len(), values.len())));
        }
        if !indices.is_wide() && needs_wide_indices(cols) {
            return Err(FlashError::invalid(format!("{cols} columns do not fit 32-bit column indices")));
        }
        Ok(FlashCsrMatrix { rows, cols, indptr, indices, values })
    }

    /// Copies an in-memory CSR matrix (32- or 64-bit column indices) into a new scratch
    /// container in `dir`; the container's indices are 64-bit only past 2^32 columns.
    pub fn from_csr<I: ColIndex>(dir: &Path, csr: CsrRef<'_, T, I>, options: &FileOptions) -> Result<Self> {
        csr.validate()?;
        let wide = needs_wide_indices(csr.cols);
        let layout = container_layout::<T>(csr.rows, csr.nnz(), wide);
        let file = FlashFile::scratch(dir, layout.file_len, options)?;
        Self::fill_container(file, csr, wide, &layout)
    }

    /// Writes an in-memory CSR matrix to a container file at `path` atomically (temp file,
    /// data, checksummed header, sync, rename) and returns it opened read-write.
    pub fn create_file<I: ColIndex>(path: &Path, csr: CsrRef<'_, T, I>, options: &FileOptions) -> Result<Self> {
        csr.validate()?;
        let wide = needs_wide_indices(csr.cols);
        let layout = container_layout::<T>(csr.rows, csr.nnz(), wide);
        let file = FlashFile::create_atomic(path, layout.file_len, options)?;
        let matrix = Self::fill_container(file.clone(), csr, wide, &layout)?;
        file.publish()?;
        Ok(matrix)
    }

    fn fill_container<I: ColIndex>(file: Arc<FlashFile>, csr: CsrRef<'_, T, I>, wide: bool, layout: &ContainerLayout) -> Result<Self> {
        file.write_bytes(layout.indptr_offset, as_bytes(csr.indptr))?;
        if wide == I::WIDE {
            file.write_bytes(layout.indices_offset, as_bytes(csr.indices))?;
        } else {
            // 64-bit indices in memory, at most 2^32 columns: stored as 32-bit, a chunk at a time.
            for (k, chunk) in csr.indices.chunks(1 << 20).enumerate() {
                let narrow: Vec<u32> = chunk.iter().map(|&c| c.col() as u32).collect();
                file.write_bytes(layout.indices_offset + (k as u64) * (4 << 20), as_bytes(&narrow))?;
            }
        }
        file.write_bytes(layout.values_offset, as_bytes(csr.values))?;
        file.write_bytes(0, &encode_header::<T>(csr.rows, csr.cols, csr.nnz(), wide, layout))?;
        Self::from_container(file, csr.rows, csr.cols, csr.nnz(), wide, layout)
    }

    fn from_container(file: Arc<FlashFile>, rows: usize, cols: usize, nnz: usize, wide: bool, layout: &ContainerLayout) -> Result<Self> {
        let indptr = FlashPtr::from_file(file.clone(), layout.indptr_offset, rows as u64 + 1)?;
        let indices = if wide {
            FlashIndices::U64(FlashPtr::from_file(file.clone(), layout.indices_offset, nnz as u64)?)
        } else {
            FlashIndices::U32(FlashPtr::from_file(file.clone(), layout.indices_offset, nnz as u64)?)
        };
        let values = FlashPtr::from_file(file, layout.values_offset, nnz as u64)?;
        FlashCsrMatrix::from_parts(rows, cols, indptr, indices, values)
    }

    /// Opens a container file written by [`FlashCsrMatrix::create_file`], checking its magic,
    /// checksum, value type and length.
    pub fn open(path: &Path, mode: OpenMode, options: &FileOptions) -> Result<Self> {
        let file = FlashFile::open(path, mode, options)?;
        let corrupt = |reason: String| FlashError::Corrupt { path: PathBuf::from(path), reason };
        if file.len_bytes() < HEADER_BYTES {
            return Err(corrupt(format!("{} bytes is too short for a CSR container", file.len_bytes())));
        }
        let mut header = [0u8; HEADER_USED_BYTES];
        file.read_bytes(0, &mut header)?;
        let wide = match &header[0..8] {
            m if m == MAGIC => false,
            m if m == MAGIC_WIDE => true,
            _ => return Err(corrupt("not a scalefree CSR container (bad magic)".into())),
        };
        let stored_sum = u64::from_le_bytes(header[72..80].try_into().expect("8 bytes"));
        if fnv1a64(&header[..72]) != stored_sum {
            return Err(corrupt("header checksum mismatch".into()));
        }
        let name_len = header[8..16].iter().position(|&b| b == 0).unwrap_or(8);
        let name = String::from_utf8_lossy(&header[8..8 + name_len]).into_owned();
        if name != T::NAME {
            return Err(corrupt(format!("values are {name}, expected {}", T::NAME)));
        }
        let field = |i: usize| u64::from_le_bytes(header[16 + 8 * i..24 + 8 * i].try_into().expect("8 bytes"));
        let (rows, cols, nnz) = (field(0) as usize, field(1) as usize, field(2) as usize);
        let layout = ContainerLayout { indptr_offset: field(3), indices_offset: field(4), values_offset: field(5), file_len: field(6) };
        let expected = container_layout::<T>(rows, nnz, wide);
        if (layout.indptr_offset, layout.indices_offset, layout.values_offset, layout.file_len) != (expected.indptr_offset, expected.indices_offset, expected.values_offset, expected.file_len) {
            return Err(corrupt("section offsets disagree with the shape".into()));
        }
        if file.len_bytes() != layout.file_len {
            return Err(corrupt(format!("file has {} bytes, header says {}", file.len_bytes(), layout.file_len)));
        }
        if !wide && needs_wide_indices(cols) {
            return Err(corrupt(format!("{cols} columns in a container of 32-bit column indices")));
        }
        Self::from_container(file, rows, cols, nnz, wide, &layout)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Number of stored entries.
    pub fn nnz(&self) -> u64 {
        self.values.len()
    }

    /// Row starts on flash.
    pub fn indptr(&self) -> &FlashPtr<u64> {
        &self.indptr
    }

    /// Column indices on flash (32- or 64-bit).
    pub fn indices(&self) -> &FlashIndices {
        &self.indices
    }

    /// Values on flash.
    pub fn values(&self) -> &FlashPtr<T> {
        &self.values
    }

    /// Bytes on flash (all three arrays).
    pub fn size_bytes(&self) -> u64 {
        (self.rows as u64 + 1) * 8 + self.nnz() * (self.indices.width_bytes() + std::mem::size_of::<T>() as u64)
    }

    /// Reads the whole matrix into memory (32-bit column indices; an error for a matrix of
    /// more than 2^32 columns: use [`FlashCsrMatrix::to_csr_wide`]).
    pub fn to_csr(&self) -> Result<CsrMatrix<T>> {
        let len = usize::try_from(self.nnz()).map_err(|_| FlashError::invalid("array too large for memory"))?;
        let mut indices = vec![0u32; len];
        self.indices.read_u32(0, &mut indices)?;
        Ok(CsrMatrix { rows: self.rows, cols: self.cols, indptr: self.indptr.to_vec()?, indices, values: self.values.to_vec()? })
    }

    /// Reads the whole matrix into memory with 64-bit column indices (any width on flash).
    pub fn to_csr_wide(&self) -> Result<CsrMatrix<T, u64>> {
        let len = usize::try_from(self.nnz()).map_err(|_| FlashError::invalid("array too large for memory"))?;
        let mut indices = vec![0u64; len];
        self.indices.read_u64(0, &mut indices)?;
        Ok(CsrMatrix { rows: self.rows, cols: self.cols, indptr: self.indptr.to_vec()?, indices, values: self.values.to_vec()? })
    }

    /// Reads the row starts and checks them; then streams the column indices and checks them
    /// against `cols`.
    pub fn validate(&self) -> Result<()> {
        let indptr = self.indptr.to_vec()?;
        if indptr[0] != 0 || indptr[self.rows] != self.nnz() {
            return Err(FlashError::invalid(format!("indptr must run from 0 to nnz = {}", self.nnz())));
        }
        if let Some(r) = indptr.windows(2).position(|w| w[0] > w[1]) {
            return Err(FlashError::invalid(format!("indptr decreases at row {r}")));
        }
        let chunk = 1u64 << 20;
        let mut buf = vec![0u64; chunk as usize];
        let mut start = 0;
        while start < self.nnz() {
            let n = chunk.min(self.nnz() - start) as usize;
            self.indices.read_u64(start, &mut buf[..n])?;
            if let Some(at) = buf[..n].iter().position(|&c| c >= self.cols as u64) {
                return Err(FlashError::invalid(format!("entry {} has column {} of {}", start + at as u64, buf[at], self.cols)));
            }
            start += n as u64;
        }
        Ok(())
    }
}

impl<T: Element> std::fmt::Debug for FlashCsrMatrix<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FlashCsrMatrix<{}>({}x{}, {} non-zeros)", T::NAME, self.rows, self.cols, self.nnz())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CsrMatrix<f32> {
        CsrMatrix::from_triplets(4, 6, &[(0, 1, 1.0), (0, 5, 2.0), (2, 0, 3.0), (3, 3, 4.0), (3, 4, 5.0)]).unwrap()
    }

    #[test]
    fn scratch_container_round_trip() {
        let csr = sample();
        let flash = FlashCsrMatrix::from_csr(&std::env::temp_dir(), csr.view(), &FileOptions::default()).unwrap();
        assert_eq!(flash.nnz(), 5);
        assert_eq!(flash.to_csr().unwrap(), csr);
        flash.validate().unwrap();
    }

    #[test]
    fn container_file_checks_header() {
        let path = std::env::temp_dir().join(format!("scalefree-flash-csr-{}.sfcsr", std::process::id()));
        let csr = sample();
        FlashCsrMatrix::create_file(&path, csr.view(), &FileOptions::default()).unwrap();
        let opened = FlashCsrMatrix::<f32>::open(&path, OpenMode::ReadOnly, &FileOptions::default()).unwrap();
        assert_eq!(opened.to_csr().unwrap(), csr);
        let wrong_type = FlashCsrMatrix::<f64>::open(&path, OpenMode::ReadOnly, &FileOptions::default()).unwrap_err();
        assert!(matches!(wrong_type, FlashError::Corrupt { .. }), "{wrong_type}");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = FlashCsrMatrix::<f32>::open(&path, OpenMode::ReadOnly, &FileOptions::default()).unwrap_err();
        assert!(err.to_string().contains("checksum") && err.to_string().contains(&*path.to_string_lossy()), "{err}");
        std::fs::write(&path, b"hello").unwrap();
        assert!(matches!(FlashCsrMatrix::<f32>::open(&path, OpenMode::ReadOnly, &FileOptions::default()), Err(FlashError::Corrupt { .. })));
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn three_files() {
        let csr = sample();
        let dir = std::env::temp_dir();
        let o = FileOptions::default();
        let m = FlashCsrMatrix::from_parts(
            4,
            6,
            FlashPtr::from_slice(&dir, &csr.indptr, &o).unwrap(),
            FlashPtr::from_slice(&dir, &csr.indices, &o).unwrap(),
            FlashPtr::from_slice(&dir, &csr.values, &o).unwrap(),
        )
        .unwrap();
        assert_eq!(m.to_csr().unwrap(), csr);
        assert!(FlashCsrMatrix::from_parts(5, 6, m.indptr().clone(), m.indices().clone(), m.values().clone()).is_err());
    }
}
