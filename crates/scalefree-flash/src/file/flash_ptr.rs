//! [`FlashPtr<T>`]: a typed pointer to a run of elements in a [`FlashFile`] — the paper's
//! `flash_ptr<T>` with offsets, slicing and synchronous reads and writes.

use std::marker::PhantomData;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::flash_file::{FileOptions, FlashFile, OpenMode};
use crate::element::{as_bytes, as_bytes_mut, Element};
use crate::error::{FlashError, Result};
use crate::io::access::AccessSpec;

/// `len` elements of type `T` starting at byte `offset_bytes` of a file.
pub struct FlashPtr<T> {
    file: Arc<FlashFile>,
    offset_bytes: u64,
    len: u64,
    _element: PhantomData<fn() -> T>,
}

impl<T> Clone for FlashPtr<T> {
    fn clone(&self) -> Self {
        FlashPtr { file: self.file.clone(), offset_bytes: self.offset_bytes, len: self.len, _element: PhantomData }
    }
}

impl<T: Element> FlashPtr<T> {
    const SIZE: u64 = std::mem::size_of::<T>() as u64;

    /// Allocates a zero-filled scratch array of `len` elements in `dir` (`flash::malloc`).
    pub fn scratch(dir: &Path, len: u64, options: &FileOptions) -> Result<FlashPtr<T>> {
        let bytes = len.checked_mul(Self::SIZE).ok_or_else(|| FlashError::invalid("array size overflows"))?;
        FlashPtr::from_file(FlashFile::scratch(dir, bytes, options)?, 0, len)
    }

    /// Copies `data` into a new scratch array in `dir`.
    pub fn from_slice(dir: &Path, data: &[T], options: &FileOptions) -> Result<FlashPtr<T>> {
        let ptr = FlashPtr::scratch(dir, data.len() as u64, options)?;
        ptr.write(0, data)?;
        Ok(ptr)
    }

    /// Maps an existing file of `T`s (`map_file`); its length must be a whole number of `T`.
    pub fn open(path: &Path, mode: OpenMode, options: &FileOptions) -> Result<FlashPtr<T>> {
        let file = FlashFile::open(path, mode, options)?;
        if file.len_bytes() % Self::SIZE != 0 {
            return Err(FlashError::Corrupt {
                path: path.to_path_buf(),
                reason: format!("{} bytes is not a whole number of {}", file.len_bytes(), T::NAME),
            });
        }
        let len = file.len_bytes() / Self::SIZE;
        FlashPtr::from_file(file, 0, len)
    }

    /// `len` elements of `file` starting at `offset_bytes`.
    pub fn from_file(file: Arc<FlashFile>, offset_bytes: u64, len: u64) -> Result<FlashPtr<T>> {
        let bytes = len.checked_mul(Self::SIZE).ok_or_else(|| FlashError::invalid("array size overflows"))?;
        file.check_range(offset_bytes, bytes)?;
        Ok(FlashPtr { file, offset_bytes, len, _element: PhantomData })
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The underlying file.
    pub fn file(&self) -> &Arc<FlashFile> {
        &self.file
    }

    /// Byte offset of element 0 in the file.
    pub fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// Pointer arithmetic: the array starting `count` elements further on.
    /// Panics if `count > len` (misuse).
    pub fn offset(&self, count: u64) -> FlashPtr<T> {
        assert!(count <= self.len, "offset {count} past the end of a {}-element array", self.len);
        FlashPtr { file: self.file.clone(), offset_bytes: self.offset_bytes + count * Self::SIZE, len: self.len - count, _element: PhantomData }
    }

    /// Elements `range` of this array.
    pub fn slice(&self, range: Range<u64>) -> Result<FlashPtr<T>> {
        if range.start > range.end || range.end > self.len {
            return Err(FlashError::invalid(format!("slice {range:?} of a {}-element array", self.len)));
        }
        Ok(FlashPtr { file: self.file.clone(), offset_bytes: self.offset_bytes + range.start * Self::SIZE, len: range.end - range.start, _element: PhantomData })
    }

    /// Reads `dst.len()` elements starting at element `start` (`read_sync`).
    pub fn read(&self, start: u64, dst: &mut [T]) -> Result<()> {
        self.check(start, dst.len() as u64)?;
        self.file.read_bytes(self.offset_bytes + start * Self::SIZE, as_bytes_mut(dst))
    }

    /// Reads the whole array into a vector.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let len = usize::try_from(self.len).map_err(|_| FlashError::invalid("array too large for memory"))?;
        let mut out = vec![T::default(); len];
        self.read(0, &mut out)?;
        Ok(out)
    }

    /// Writes `src` starting at element `start` (`write_sync`).
    pub fn write(&self, start: u64, src: &[T]) -> Result<()> {
        self.check(start, src.len() as u64)?;
        self.file.write_bytes(self.offset_bytes + start * Self::SIZE, as_bytes(src))
    }

    /// Access specifier for elements `start .. start + len` (one contiguous run).
    pub fn access(&self, start: u64, len: u64) -> Result<AccessSpec> {
        self.check(start, len)?;
        AccessSpec::contiguous(self.file.clone(), self.offset_bytes + start * Self::SIZE, len * Self::SIZE)
    }

    /// Access specifier for `n_strides` runs of `len_per_stride` elements, `stride` elements
    /// apart, starting at element `start`.
    pub fn access_strided(&self, start: u64, n_strides: u64, len_per_stride: u64, stride: u64) -> Result<AccessSpec> {
        if n_strides > 0 && len_per_stride > 0 {
            let last_end = (n_strides - 1).checked_mul(stride).and_then(|v| v.checked_add(len_per_stride));
            match last_end {
                Some(extent) => self.check(start, extent)?,
                None => return Err(FlashError::invalid("strided access overflows")),
            }
        }
        AccessSpec::strided(self.file.clone(), self.offset_bytes + start * Self::SIZE, n_strides, len_per_stride * Self::SIZE, stride * Self::SIZE)
    }

    fn check(&self, start: u64, len: u64) -> Result<()> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(FlashError::invalid(format!("elements {start}..{} of a {}-element array in {}", start.saturating_add(len), self.len, self.file.path().display()))),
        }
    }
}

impl<T: Element> std::fmt::Debug for FlashPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FlashPtr<{}>({}@{} x {})", T::NAME, self.file.path().display(), self.offset_bytes, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> std::path::PathBuf {
        std::env::temp_dir()
    }

    #[test]
    fn round_trip_unaligned_ranges() {
        let data: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.5).collect();
        let ptr = FlashPtr::from_slice(&dir(), &data, &FileOptions::default()).unwrap();
        assert_eq!(ptr.to_vec().unwrap(), data);
        let mut part = vec![0f32; 777];
        ptr.read(1234, &mut part).unwrap();
        assert_eq!(part, &data[1234..1234 + 777]);
        ptr.write(3, &[-1.0, -2.0, -3.0]).unwrap();
        let back = ptr.to_vec().unwrap();
        assert_eq!(&back[..7], &[0.0, 0.5, 1.0, -1.0, -2.0, -3.0, 3.0]);
        assert_eq!(&back[7..], &data[7..]);
    }

    #[test]
    fn offsets_and_slices() {
        let data: Vec<u64> = (0..1000).collect();
        let ptr = FlashPtr::from_slice(&dir(), &data, &FileOptions::default()).unwrap();
        let moved = ptr.offset(10);
        assert_eq!(moved.len(), 990);
        let mut one = [0u64; 1];
        moved.read(5, &mut one).unwrap();
        assert_eq!(one[0], 15);
        let piece = ptr.slice(100..110).unwrap();
        assert_eq!(piece.to_vec().unwrap(), (100..110).collect::<Vec<u64>>());
        assert!(ptr.slice(990..1001).is_err());
        assert!(piece.read(5, &mut [0u64; 6]).is_err());
    }

    #[test]
    fn empty_array() {
        let ptr = FlashPtr::<f64>::scratch(&dir(), 0, &FileOptions::default()).unwrap();
        assert!(ptr.is_empty());
        assert!(ptr.to_vec().unwrap().is_empty());
    }

    #[test]
    fn read_only_file_refuses_writes() {
        let path = dir().join(format!("scalefree-flash-ro-{}", std::process::id()));
        std::fs::write(&path, [0u8; 64]).unwrap();
        let ptr = FlashPtr::<u32>::open(&path, OpenMode::ReadOnly, &FileOptions::default()).unwrap();
        assert_eq!(ptr.len(), 16);
        let err = ptr.write(0, &[1]).unwrap_err();
        assert!(err.to_string().contains("read-only"), "{err}");
        std::fs::remove_file(&path).unwrap();
        let missing = FlashPtr::<u32>::open(&path, OpenMode::ReadOnly, &FileOptions::default()).unwrap_err();
        assert!(matches!(&missing, FlashError::Io { path: p, .. } if *p == path), "{missing}");
    }

    #[test]
    fn buffered_mode_works_too() {
        let options = FileOptions { direct_io: false };
        let data: Vec<i32> = (0..5000).collect();
        let ptr = FlashPtr::from_slice(&dir(), &data, &options).unwrap();
        assert!(!ptr.file().is_direct());
        ptr.write(17, &[-5; 100]).unwrap();
        let back = ptr.to_vec().unwrap();
        assert_eq!(&back[17..117], &[-5; 100][..]);
        assert_eq!(back[16], 16);
        assert_eq!(back[117], 117);
    }
}
