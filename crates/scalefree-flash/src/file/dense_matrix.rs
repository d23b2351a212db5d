//! [`FlashMatrix<T>`]: a dense matrix on flash — a [`FlashPtr`] plus rows, columns, layout
//! and leading dimension — with block access specifiers for tasks.

use std::path::Path;

use super::flash_file::{FileOptions, FlashFile, OpenMode};
use super::flash_ptr::FlashPtr;
use crate::dense::{DenseRef, DenseShape, Layout};
use crate::element::{as_bytes, Element};
use crate::error::{FlashError, Result};
use crate::io::access::AccessSpec;

/// A dense `rows x cols` matrix stored on flash in `layout` with `leading_dim`.
pub struct FlashMatrix<T> {
    data: FlashPtr<T>,
    shape: DenseShape,
}

impl<T> Clone for FlashMatrix<T> {
    fn clone(&self) -> Self {
        FlashMatrix { data: self.data.clone(), shape: self.shape }
    }
}

impl<T: Element> FlashMatrix<T> {
    /// Describes a matrix stored at `data`; checks the storage is long enough.
    pub fn new(data: FlashPtr<T>, rows: usize, cols: usize, layout: Layout, leading_dim: usize) -> Result<Self> {
        let shape = DenseShape { rows, cols, layout, leading_dim };
        shape.validate()?;
        if data.len() < shape.storage_len() as u64 {
            return Err(FlashError::shape(format!(
                "a {layout:?} {rows}x{cols} matrix with leading dimension {leading_dim} needs {} elements, {:?} has {}",
                shape.storage_len(),
                data,
                data.len()
            )));
        }
        Ok(FlashMatrix { data, shape })
    }

    /// A zero-filled packed scratch matrix in `dir`.
    pub fn scratch(dir: &Path, rows: usize, cols: usize, layout: Layout, options: &FileOptions) -> Result<Self> {
        let len = (rows as u64).checked_mul(cols as u64).ok_or_else(|| FlashError::invalid("matrix size overflows"))?;
        let data = FlashPtr::scratch(dir, len, options)?;
        let shape = DenseShape::packed(rows, cols, layout);
        FlashMatrix::new(data, rows, cols, layout, shape.leading_dim)
    }

    /// Copies a packed in-memory matrix (`data` in `layout`) into a new scratch matrix.
    pub fn from_slice(dir: &Path, data: &[T], rows: usize, cols: usize, layout: Layout, options: &FileOptions) -> Result<Self> {
        DenseRef::packed(data, rows, cols, layout)?;
        if data.len() != rows * cols {
            return Err(FlashError::shape(format!("{} elements for a {rows}x{cols} matrix", data.len())));
        }
        let ptr = FlashPtr::from_slice(dir, data, options)?;
        let shape = DenseShape::packed(rows, cols, layout);
        FlashMatrix::new(ptr, rows, cols, layout, shape.leading_dim)
    }

    /// Writes a packed matrix to a new raw file at `path` atomically (temp file, sync,
    /// rename) and returns it opened read-write.
    pub fn create_file(path: &Path, data: &[T], rows: usize, cols: usize, layout: Layout, options: &FileOptions) -> Result<Self> {
        if data.len() != rows * cols {
            return Err(FlashError::shape(format!("{} elements for a {rows}x{cols} matrix", data.len())));
        }
        let file = FlashFile::create_atomic(path, std::mem::size_of_val(data) as u64, options)?;
        file.write_bytes(0, as_bytes(data))?;
        file.publish()?;
        let ptr = FlashPtr::from_file(file, 0, data.len() as u64)?;
        FlashMatrix::new(ptr, rows, cols, layout, DenseShape::packed(rows, cols, layout).leading_dim)
    }

    /// Maps a raw file of packed elements as a `rows x cols` matrix.
    pub fn open(path: &Path, rows: usize, cols: usize, layout: Layout, mode: OpenMode, options: &FileOptions) -> Result<Self> {
        let ptr = FlashPtr::open(path, mode, options)?;
        FlashMatrix::new(ptr, rows, cols, layout, DenseShape::packed(rows, cols, layout).leading_dim)
    }

    /// Shape, layout and leading dimension.
    pub fn shape(&self) -> DenseShape {
        self.shape
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.shape.rows
    }

    /// Number of columns.
    pub fn cols(&self) -> usize {
        self.shape.cols
    }

    /// Storage order.
    pub fn layout(&self) -> Layout {
        self.shape.layout
    }

    /// Leading dimension in elements.
    pub fn leading_dim(&self) -> usize {
        self.shape.leading_dim
    }

    /// The storage.
    pub fn data(&self) -> &FlashPtr<T> {
        &self.data
    }

    /// The transpose as a view of the same storage (layout flipped, no IO).
    pub fn transposed(&self) -> FlashMatrix<T> {
        let shape = DenseShape { rows: self.shape.cols, cols: self.shape.rows, layout: self.shape.layout.flipped(), leading_dim: self.shape.leading_dim };
        FlashMatrix { data: self.data.clone(), shape }
    }

    /// The sub-matrix `rows x cols` starting at `(row0, col0)` as a view (no IO).
    pub fn submatrix(&self, row0: usize, col0: usize, rows: usize, cols: usize) -> Result<FlashMatrix<T>> {
        self.check_block(row0, col0, rows, cols)?;
        let start = if rows == 0 || cols == 0 { 0 } else { self.shape.index(row0, col0) as u64 };
        let data = self.data.offset(start.min(self.data.len()));
        FlashMatrix::new(data, rows, cols, self.shape.layout, self.shape.leading_dim)
    }

    fn check_block(&self, row0: usize, col0: usize, rows: usize, cols: usize) -> Result<()> {
        if row0 + rows > self.shape.rows || col0 + cols > self.shape.cols {
            return Err(FlashError::invalid(format!(
                "block {rows}x{cols} at ({row0}, {col0}) outside a {}x{} matrix",
                self.shape.rows, self.shape.cols
            )));
        }
        Ok(())
    }

    /// Access specifier of a block; its packed buffer is in this matrix's layout with a
    /// leading dimension of `cols` (row-major) or `rows` (column-major).
    pub fn block_access(&self, row0: usize, col0: usize, rows: usize, cols: usize) -> Result<AccessSpec> {
        self.check_block(row0, col0, rows, cols)?;
        if rows == 0 || cols == 0 {
            return self.data.access(0, 0);
        }
        let start = self.shape.index(row0, col0) as u64;
        let ld = self.shape.leading_dim as u64;
        match self.shape.layout {
            Layout::RowMajor => self.data.access_strided(start, rows as u64, cols as u64, ld),
            Layout::ColMajor => self.data.access_strided(start, cols as u64, rows as u64, ld),
        }
    }

    /// Reads a block into a packed vector in this matrix's layout.
    pub fn read_block(&self, row0: usize, col0: usize, rows: usize, cols: usize) -> Result<Vec<T>> {
        let mut out = vec![T::default(); rows * cols];
        self.read_block_into(row0, col0, rows, cols, &mut out)?;
        Ok(out)
    }

    /// Reads a block into `dst`, packed in this matrix's layout (`rows * cols` elements): one
    /// read when the block's runs are contiguous on flash, else one per run.
    pub fn read_block_into(&self, row0: usize, col0: usize, rows: usize, cols: usize, dst: &mut [T]) -> Result<()> {
        self.check_block(row0, col0, rows, cols)?;
        if dst.len() != rows * cols {
            return Err(FlashError::shape(format!("{} elements for a {rows}x{cols} block", dst.len())));
        }
        let block = DenseShape::packed(rows, cols, self.shape.layout);
        let (runs, run_len) = (block.major_count(), block.minor_len());
        if run_len == 0 {
            return Ok(());
        }
        if runs > 0 && self.shape.leading_dim == run_len {
            return self.data.read(self.shape.index(row0, col0) as u64, dst);
        }
        for run in 0..runs {
            let (r, c) = match self.shape.layout {
                Layout::RowMajor => (row0 + run, col0),
                Layout::ColMajor => (row0, col0 + run),
            };
            let at = self.shape.index(r, c) as u64;
            self.data.read(at, &mut dst[run * run_len..(run + 1) * run_len])?;
        }
        Ok(())
    }

    /// Writes a packed block (in this matrix's layout) at `(row0, col0)`.
    pub fn write_block(&self, row0: usize, col0: usize, rows: usize, cols: usize, src: &[T]) -> Result<()> {
        self.check_block(row0, col0, rows, cols)?;
        if src.len() != rows * cols {
            return Err(FlashError::shape(format!("{} elements for a {rows}x{cols} block", src.len())));
        }
        let block = DenseShape::packed(rows, cols, self.shape.layout);
        let (runs, run_len) = (block.major_count(), block.minor_len());
        if run_len == 0 {
            return Ok(());
        }
        if runs > 0 && self.shape.leading_dim == run_len {
            let at = self.shape.index(row0, col0) as u64;
            return self.data.write(at, src);
        }
        for run in 0..runs {
            let (r, c) = match self.shape.layout {
                Layout::RowMajor => (row0 + run, col0),
                Layout::ColMajor => (row0, col0 + run),
            };
            self.data.write(self.shape.index(r, c) as u64, &src[run * run_len..(run + 1) * run_len])?;
        }
        Ok(())
    }

    /// Reads the whole matrix into a packed vector in its layout.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.read_block(0, 0, self.shape.rows, self.shape.cols)
    }
}

impl<T: Element> std::fmt::Debug for FlashMatrix<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FlashMatrix<{}>({}x{} {:?} ld {} in {:?})", T::NAME, self.shape.rows, self.shape.cols, self.shape.layout, self.shape.leading_dim, self.data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        std::env::temp_dir()
    }

    #[test]
    fn blocks_round_trip_both_layouts() {
        for layout in [Layout::RowMajor, Layout::ColMajor] {
            let (rows, cols) = (37, 29);
            let data: Vec<f64> = (0..rows * cols).map(|i| i as f64).collect();
            let m = FlashMatrix::from_slice(&dir(), &data, rows, cols, layout, &FileOptions::default()).unwrap();
            assert_eq!(m.to_vec().unwrap(), data);
            let block = m.read_block(3, 5, 7, 11).unwrap();
            let shape = DenseShape::packed(7, 11, layout);
            for r in 0..7 {
                for c in 0..11 {
                    assert_eq!(block[shape.index(r, c)], data[m.shape().index(3 + r, 5 + c)]);
                }
            }
            let ones = vec![-1.0; 7 * 11];
            m.write_block(3, 5, 7, 11, &ones).unwrap();
            let back = m.to_vec().unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    let inside = (3..10).contains(&r) && (5..16).contains(&c);
                    let want = if inside { -1.0 } else { data[m.shape().index(r, c)] };
                    assert_eq!(back[m.shape().index(r, c)], want, "({r}, {c}) {layout:?}");
                }
            }
        }
    }

    #[test]
    fn leading_dimension_and_views() {
        let ptr = FlashPtr::<f32>::from_slice(&dir(), &(0..100).map(|i| i as f32).collect::<Vec<_>>(), &FileOptions::default()).unwrap();
        let m = FlashMatrix::new(ptr.clone(), 4, 3, Layout::RowMajor, 10).unwrap();
        assert_eq!(m.to_vec().unwrap(), vec![0., 1., 2., 10., 11., 12., 20., 21., 22., 30., 31., 32.]);
        let t = m.transposed();
        assert_eq!((t.rows(), t.cols(), t.layout()), (3, 4, Layout::ColMajor));
        assert_eq!(t.read_block(1, 2, 1, 1).unwrap(), vec![21.0]);
        let sub = m.submatrix(1, 1, 2, 2).unwrap();
        assert_eq!(sub.to_vec().unwrap(), vec![11., 12., 21., 22.]);
        assert!(FlashMatrix::new(ptr.clone(), 4, 3, Layout::RowMajor, 2).is_err());
        assert!(matches!(FlashMatrix::new(ptr, 11, 10, Layout::RowMajor, 10), Err(FlashError::ShapeMismatch(_))));
    }

    #[test]
    fn atomic_file_appears_only_when_published() {
        let path = dir().join(format!("scalefree-flash-dense-{}.bin", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let m = FlashMatrix::create_file(&path, &data, 10, 100, Layout::RowMajor, &FileOptions::default()).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4000);
        assert_eq!(m.to_vec().unwrap(), data);
        let unpublished = FlashFile::create_atomic(&dir().join("never-published.bin"), 100, &FileOptions::default()).unwrap();
        drop(unpublished);
        assert!(!dir().join("never-published.bin").exists());
        let reopened = FlashMatrix::<f32>::open(&path, 10, 100, Layout::RowMajor, OpenMode::ReadOnly, &FileOptions::default()).unwrap();
        assert_eq!(reopened.read_block(9, 99, 1, 1).unwrap(), vec![999.0]);
        std::fs::remove_file(&path).unwrap();
    }
}
