//! Access specifiers: `<file, offset, StrideInfo>` — which bytes of a file a task reads or
//! writes. A specifier is also the program cache's key; equality compares every field
//! exactly (file identity, offset, number of strides, length per stride, stride).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::error::{FlashError, Result};
use crate::file::FlashFile;

/// `n_strides` runs of `stride_len_bytes` bytes, the i-th starting at
/// `offset_bytes + i * stride_bytes`. In memory the runs are packed back to back.
#[derive(Clone)]
pub struct AccessSpec {
    file: Arc<FlashFile>,
    offset_bytes: u64,
    n_strides: u64,
    stride_len_bytes: u64,
    stride_bytes: u64,
}

impl AccessSpec {
    /// One contiguous run of `len_bytes` at `offset_bytes`.
    pub fn contiguous(file: Arc<FlashFile>, offset_bytes: u64, len_bytes: u64) -> Result<AccessSpec> {
        AccessSpec::strided(file, offset_bytes, 1, len_bytes, len_bytes)
    }

    /// `n_strides` runs of `stride_len_bytes`, `stride_bytes` apart. Runs may not overlap
    /// (`stride_bytes >= stride_len_bytes` when there is more than one) and must lie inside
    /// the file. Equivalent descriptions are normalised (back-to-back runs become one run),
    /// so the same bytes always make the same key.
    pub fn strided(file: Arc<FlashFile>, offset_bytes: u64, n_strides: u64, stride_len_bytes: u64, stride_bytes: u64) -> Result<AccessSpec> {
        if n_strides > 1 && stride_bytes < stride_len_bytes {
            return Err(FlashError::invalid(format!("stride of {stride_bytes} bytes is shorter than its run of {stride_len_bytes} bytes")));
        }
        let (n_strides, stride_len_bytes, stride_bytes) = if n_strides == 0 || stride_len_bytes == 0 {
            (0, 0, 0)
        } else if n_strides == 1 || stride_bytes == stride_len_bytes {
            let total = n_strides.checked_mul(stride_len_bytes).ok_or_else(|| FlashError::invalid("access size overflows"))?;
            (1, total, total)
        } else {
            (n_strides, stride_len_bytes, stride_bytes)
        };
        let spec = AccessSpec { file, offset_bytes, n_strides, stride_len_bytes, stride_bytes };
        let (start, end) = spec.span_bytes();
        spec.file.check_range(start, end - start)?;
        Ok(spec)
    }

    /// The file accessed.
    pub fn file(&self) -> &Arc<FlashFile> {
        &self.file
    }

    /// Byte offset of the first run.
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// Number of runs.
    pub fn n_strides(&self) -> u64 {
        self.n_strides
    }

    /// Bytes per run.
    pub fn stride_len_bytes(&self) -> u64 {
        self.stride_len_bytes
    }

    /// Distance between run starts, in bytes.
    pub fn stride_bytes(&self) -> u64 {
        self.stride_bytes
    }

    /// Bytes accessed (the size of the packed in-memory buffer).
    pub fn size_bytes(&self) -> u64 {
        self.n_strides * self.stride_len_bytes
    }

    /// File offset of run `index`.
    pub fn run_offset(&self, index: u64) -> u64 {
        self.offset_bytes + index * self.stride_bytes
    }

    /// `[first byte, one past the last byte)` touched in the file.
    pub fn span_bytes(&self) -> (u64, u64) {
        if self.n_strides == 0 {
            return (self.offset_bytes, self.offset_bytes);
        }
        (self.offset_bytes, self.run_offset(self.n_strides - 1) + self.stride_len_bytes)
    }

    /// True when some byte is accessed by both specifiers (same file, exact test).
    pub fn overlaps(&self, other: &AccessSpec) -> bool {
        if self.file.id() != other.file.id() || self.size_bytes() == 0 || other.size_bytes() == 0 {
            return false;
        }
        let (a0, a1) = self.span_bytes();
        let (b0, b1) = other.span_bytes();
        if a1 <= b0 || b1 <= a0 {
            return false;
        }
        let (few, many) = if self.n_strides <= other.n_strides { (self, other) } else { (other, self) };
        (0..few.n_strides).any(|i| many.overlaps_interval(few.run_offset(i), few.run_offset(i) + few.stride_len_bytes))
    }

    /// True when some run of `self` meets `[start, end)`.
    fn overlaps_interval(&self, start: u64, end: u64) -> bool {
        if self.n_strides == 1 {
            return self.offset_bytes < end && start < self.offset_bytes + self.stride_len_bytes;
        }
        // First run whose end is past `start`: offset + j*stride + len > start.
        let first = if start + 1 > self.offset_bytes + self.stride_len_bytes {
            (start + 1 - self.offset_bytes - self.stride_len_bytes).div_ceil(self.stride_bytes)
        } else {
            0
        };
        first < self.n_strides && self.run_offset(first) < end
    }
}

impl PartialEq for AccessSpec {
    fn eq(&self, other: &Self) -> bool {
        self.file.id() == other.file.id()
            && self.offset_bytes == other.offset_bytes
            && self.n_strides == other.n_strides
            && self.stride_len_bytes == other.stride_len_bytes
            && self.stride_bytes == other.stride_bytes
    }
}

impl Eq for AccessSpec {}

impl Hash for AccessSpec {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.file.id().hash(state);
        self.offset_bytes.hash(state);
        self.n_strides.hash(state);
        self.stride_len_bytes.hash(state);
        self.stride_bytes.hash(state);
    }
}

impl std::fmt::Debug for AccessSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}@{}[{} x {}B / {}B]",
            self.file.path().display(),
            self.offset_bytes,
            self.n_strides,
            self.stride_len_bytes,
            self.stride_bytes
        )
    }
}

/// What a task does with an access: read it, overwrite it whole, or update it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessMode {
    /// Read only; the buffer is prefetched and shared with other readers.
    Read,
    /// Overwritten whole; not prefetched (starts zeroed unless already cached), written back.
    Write,
    /// Read, modified and written back.
    ReadWrite,
}

impl AccessMode {
    /// True when the buffer must hold the file's bytes before the task runs.
    pub fn reads(self) -> bool {
        matches!(self, AccessMode::Read | AccessMode::ReadWrite)
    }

    /// True when the task changes the buffer.
    pub fn writes(self) -> bool {
        matches!(self, AccessMode::Write | AccessMode::ReadWrite)
    }
}

/// One declared input or output of a task.
#[derive(Clone, Debug)]
pub struct Access {
    /// The bytes.
    pub spec: AccessSpec,
    /// What the task does with them.
    pub mode: AccessMode,
}

impl Access {
    /// A read-only input.
    pub fn read(spec: AccessSpec) -> Access {
        Access { spec, mode: AccessMode::Read }
    }

    /// An output overwritten whole.
    pub fn write(spec: AccessSpec) -> Access {
        Access { spec, mode: AccessMode::Write }
    }

    /// An input that is updated in place.
    pub fn read_write(spec: AccessSpec) -> Access {
        Access { spec, mode: AccessMode::ReadWrite }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::{FileOptions, FlashFile};

    fn file(len: u64) -> Arc<FlashFile> {
        FlashFile::scratch(&std::env::temp_dir(), len, &FileOptions::default()).unwrap()
    }

    #[test]
    fn normalisation_makes_equal_keys() {
        let f = file(1 << 16);
        let a = AccessSpec::strided(f.clone(), 0, 4, 100, 100).unwrap();
        let b = AccessSpec::contiguous(f.clone(), 0, 400).unwrap();
        assert_eq!(a, b);
        let c = AccessSpec::strided(f.clone(), 0, 4, 100, 200).unwrap();
        assert_ne!(a, c);
        let other = file(1 << 16);
        assert_ne!(AccessSpec::contiguous(other, 0, 400).unwrap(), b, "same numbers on another file are another key");
    }

    #[test]
    fn bounds_and_stride_checked() {
        let f = file(1000);
        assert!(AccessSpec::contiguous(f.clone(), 900, 101).is_err());
        assert!(AccessSpec::strided(f.clone(), 0, 3, 100, 50).is_err());
        assert!(AccessSpec::strided(f, 0, 3, 100, 450).is_ok());
    }

    #[test]
    fn exact_overlap_of_interleaved_blocks() {
        let f = file(1 << 20);
        // Two column blocks of a row-major matrix with rows of 1000 bytes: interleaved, disjoint.
        let left = AccessSpec::strided(f.clone(), 0, 10, 400, 1000).unwrap();
        let right = AccessSpec::strided(f.clone(), 400, 10, 600, 1000).unwrap();
        assert!(!left.overlaps(&right));
        assert!(!right.overlaps(&left));
        let shifted = AccessSpec::strided(f.clone(), 399, 10, 2, 1000).unwrap();
        assert!(shifted.overlaps(&left) && shifted.overlaps(&right));
        let later_rows = AccessSpec::strided(f.clone(), 9000, 1, 1, 1).unwrap();
        assert!(later_rows.overlaps(&left));
        let past = AccessSpec::contiguous(f, 9400, 100).unwrap();
        assert!(!past.overlaps(&left) && past.overlaps(&right));
    }
}
