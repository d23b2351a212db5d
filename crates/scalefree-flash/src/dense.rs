//! In-memory dense matrix views (the twins of [`crate::FlashMatrix`]) and the closed choices
//! of dense kernels: [`Layout`] and [`Transpose`].

use crate::element::Element;
use crate::error::{FlashError, Result};

/// Storage order of a dense matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Element `(r, c)` at `r * leading_dim + c`.
    RowMajor,
    /// Element `(r, c)` at `c * leading_dim + r`.
    ColMajor,
}

impl Layout {
    /// The other layout (a transposed view of the same storage).
    pub fn flipped(self) -> Layout {
        match self {
            Layout::RowMajor => Layout::ColMajor,
            Layout::ColMajor => Layout::RowMajor,
        }
    }
}

/// Whether a kernel uses an operand or its transpose (`op(X)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transpose {
    /// `op(X) = X`.
    No,
    /// `op(X) = Xᵀ`.
    Yes,
}

/// Shape bookkeeping shared by in-memory and flash matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseShape {
    /// Number of rows.
    pub rows: usize,
    /// Number of columns.
    pub cols: usize,
    /// Storage order.
    pub layout: Layout,
    /// Distance between the starts of consecutive rows (row-major) or columns (column-major),
    /// in elements.
    pub leading_dim: usize,
}

impl DenseShape {
    /// A packed shape (`leading_dim` = row length for row-major, column length for column-major).
    pub fn packed(rows: usize, cols: usize, layout: Layout) -> DenseShape {
        let leading_dim = match layout {
            Layout::RowMajor => cols,
            Layout::ColMajor => rows,
        };
        DenseShape { rows, cols, layout, leading_dim }
    }

    /// Number of rows (row-major) or columns (column-major): the strided dimension.
    pub fn major_count(&self) -> usize {
        match self.layout {
            Layout::RowMajor => self.rows,
            Layout::ColMajor => self.cols,
        }
    }

    /// Length of one row (row-major) or column (column-major).
    pub fn minor_len(&self) -> usize {
        match self.layout {
            Layout::RowMajor => self.cols,
            Layout::ColMajor => self.rows,
        }
    }

    /// Elements spanned in storage: `(major - 1) * leading_dim + minor`, or 0 when empty.
    pub fn storage_len(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.major_count() - 1) * self.leading_dim + self.minor_len()
        }
    }

    /// Checks `leading_dim >= minor_len` (misuse otherwise).
    pub fn validate(&self) -> Result<()> {
        if self.leading_dim < self.minor_len() && self.major_count() > 1 {
            return Err(FlashError::invalid(format!(
                "leading dimension {} is smaller than the {} {} of a {:?} {}x{} matrix",
                self.leading_dim,
                self.minor_len(),
                if self.layout == Layout::RowMajor { "columns" } else { "rows" },
                self.layout,
                self.rows,
                self.cols
            )));
        }
        Ok(())
    }

    /// Storage distance between rows, then between columns, in elements.
    pub fn strides(&self) -> (isize, isize) {
        match self.layout {
            Layout::RowMajor => (self.leading_dim as isize, 1),
            Layout::ColMajor => (1, self.leading_dim as isize),
        }
    }

    /// Storage index of element `(row, col)`.
    pub fn index(&self, row: usize, col: usize) -> usize {
        match self.layout {
            Layout::RowMajor => row * self.leading_dim + col,
            Layout::ColMajor => col * self.leading_dim + row,
        }
    }

    /// The shape of `op(self)`: rows and columns swapped for `Transpose::Yes`.
    pub fn op_dims(&self, transpose: Transpose) -> (usize, usize) {
        match transpose {
            Transpose::No => (self.rows, self.cols),
            Transpose::Yes => (self.cols, self.rows),
        }
    }
}

/// A read-only dense matrix in memory.
#[derive(Clone, Copy, Debug)]
pub struct DenseRef<'a, T> {
    data: &'a [T],
    shape: DenseShape,
}

/// A mutable dense matrix in memory.
#[derive(Debug)]
pub struct DenseMut<'a, T> {
    data: &'a mut [T],
    shape: DenseShape,
}

fn check_storage(len: usize, shape: &DenseShape) -> Result<()> {
    shape.validate()?;
    if len < shape.storage_len() {
        return Err(FlashError::shape(format!(
            "a {:?} {}x{} matrix with leading dimension {} needs {} elements, the slice has {}",
            shape.layout,
            shape.rows,
            shape.cols,
            shape.leading_dim,
            shape.storage_len(),
            len
        )));
    }
    Ok(())
}

impl<'a, T: Element> DenseRef<'a, T> {
    /// A view with an explicit leading dimension.
    pub fn new(data: &'a [T], rows: usize, cols: usize, layout: Layout, leading_dim: usize) -> Result<Self> {
        let shape = DenseShape { rows, cols, layout, leading_dim };
        check_storage(data.len(), &shape)?;
        Ok(DenseRef { data, shape })
    }

    /// A packed view.
    pub fn packed(data: &'a [T], rows: usize, cols: usize, layout: Layout) -> Result<Self> {
        let shape = DenseShape::packed(rows, cols, layout);
        DenseRef::new(data, rows, cols, layout, shape.leading_dim)
    }

    /// Shape, layout and leading dimension.
    pub fn shape(&self) -> DenseShape {
        self.shape
    }

    /// The storage.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// Element `(row, col)`.
    pub fn get(&self, row: usize, col: usize) -> T {
        self.data[self.shape.index(row, col)]
    }
}

impl<'a, T: Element> DenseMut<'a, T> {
    /// A mutable view with an explicit leading dimension.
    pub fn new(data: &'a mut [T], rows: usize, cols: usize, layout: Layout, leading_dim: usize) -> Result<Self> {
        let shape = DenseShape { rows, cols, layout, leading_dim };
        check_storage(data.len(), &shape)?;
        Ok(DenseMut { data, shape })
    }

    /// A packed mutable view.
    pub fn packed(data: &'a mut [T], rows: usize, cols: usize, layout: Layout) -> Result<Self> {
        let shape = DenseShape::packed(rows, cols, layout);
        DenseMut::new(data, rows, cols, layout, shape.leading_dim)
    }

    /// Shape, layout and leading dimension.
    pub fn shape(&self) -> DenseShape {
        self.shape
    }

    /// The storage.
    pub fn data(&mut self) -> &mut [T] {
        self.data
    }

    /// A read-only view of the same matrix.
    pub fn as_ref(&self) -> DenseRef<'_, T> {
        DenseRef { data: self.data, shape: self.shape }
    }

    /// A shorter-lived mutable view of the same matrix.
    pub fn reborrow(&mut self) -> DenseMut<'_, T> {
        DenseMut { data: self.data, shape: self.shape }
    }

    /// Element `(row, col)`.
    pub fn get(&self, row: usize, col: usize) -> T {
        self.data[self.shape.index(row, col)]
    }

    /// Sets element `(row, col)`.
    pub fn set(&mut self, row: usize, col: usize, value: T) {
        let at = self.shape.index(row, col);
        self.data[at] = value;
    }
}
