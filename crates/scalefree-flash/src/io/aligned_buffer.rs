//! Heap buffers aligned to the IO sector, as O_DIRECT requires.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment of every IO buffer and of every O_DIRECT offset and length, in bytes.
/// 4096 satisfies both 512-byte and 4 KiB logical-sector devices.
pub const SECTOR_BYTES: usize = 4096;

/// Rounds `value` down to a multiple of [`SECTOR_BYTES`].
pub fn align_down(value: u64) -> u64 {
    value & !(SECTOR_BYTES as u64 - 1)
}

/// Rounds `value` up to a multiple of [`SECTOR_BYTES`].
pub fn align_up(value: u64) -> u64 {
    (value + SECTOR_BYTES as u64 - 1) & !(SECTOR_BYTES as u64 - 1)
}

/// Buffers at least this large are anonymous mappings rather than heap blocks.
pub const MAP_THRESHOLD_BYTES: usize = 1 << 20;

/// A zero-initialised byte buffer whose start is aligned to [`SECTOR_BYTES`] and whose
/// allocation is rounded up to whole sectors (so aligned IO may use the slack).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len_bytes: usize,
    capacity_bytes: usize,
    /// An anonymous mapping (freed with munmap) rather than a heap block.
    mapped: bool,
}

// SAFETY: the buffer owns its allocation exclusively; shared access follows `&`/`&mut` rules.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `len_bytes` zeroed bytes (the allocation is rounded up to whole sectors).
    /// Buffers of [`MAP_THRESHOLD_BYTES`] or more are fresh anonymous mappings: their zero
    /// pages appear on first touch (by the IO or the task that fills them), so allocating
    /// costs the caller — the scheduler thread — nothing. From the heap, a large calloc may
    /// clear megabytes of recycled memory on the spot.
    pub fn zeroed(len_bytes: usize) -> Self {
        let capacity_bytes = (align_up(len_bytes as u64) as usize).max(SECTOR_BYTES);
        if capacity_bytes >= MAP_THRESHOLD_BYTES {
            // SAFETY: an anonymous private mapping of a positive length; checked below.
            let raw = unsafe { libc::mmap(std::ptr::null_mut(), capacity_bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
            if raw != libc::MAP_FAILED {
                let ptr = NonNull::new(raw.cast::<u8>()).expect("mmap returned null");
                return AlignedBuf { ptr, len_bytes, capacity_bytes, mapped: true };
            }
        }
        let layout = Layout::from_size_align(capacity_bytes, SECTOR_BYTES).expect("buffer size overflows");
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len_bytes, capacity_bytes, mapped: false }
    }

    /// Length in bytes (as requested).
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    /// True when the length is zero.
    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    /// Allocated bytes (a whole number of sectors, at least one).
    pub fn capacity(&self) -> usize {
        self.capacity_bytes
    }

    /// The requested bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation holds `capacity >= len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The requested bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The whole allocation, including slack past `len`, mutably (for sector-rounded IO).
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity_bytes) }
    }

    /// Raw pointer to the first byte.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Raw mutable pointer to the first byte.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Makes sure the allocation holds at least `len_bytes`, reallocating (zeroed) if not,
    /// and sets the length.
    pub fn ensure_len(&mut self, len_bytes: usize) {
        if len_bytes > self.capacity_bytes {
            *self = AlignedBuf::zeroed(len_bytes);
        }
        self.len_bytes = len_bytes;
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: mapped in `zeroed` with this length.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.capacity_bytes) };
            return;
        }
        let layout = Layout::from_size_align(self.capacity_bytes, SECTOR_BYTES).expect("layout was valid at allocation");
        // SAFETY: allocated with the same layout in `zeroed`.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        let buf = AlignedBuf::zeroed(10_000);
        assert_eq!(buf.as_ptr() as usize % SECTOR_BYTES, 0);
        assert_eq!(buf.len(), 10_000);
        assert_eq!(buf.capacity(), 3 * SECTOR_BYTES);
        assert!(buf.as_slice().iter().all(|&b| b == 0));
        assert_eq!(AlignedBuf::zeroed(0).capacity(), SECTOR_BYTES);
        let mut big = AlignedBuf::zeroed(MAP_THRESHOLD_BYTES + 5);
        assert_eq!(big.as_ptr() as usize % SECTOR_BYTES, 0);
        assert!(big.as_slice().iter().all(|&b| b == 0));
        big.as_mut_slice()[MAP_THRESHOLD_BYTES + 4] = 7;
        assert_eq!(big.as_slice()[MAP_THRESHOLD_BYTES + 4], 7);
    }

    #[test]
    fn rounding() {
        assert_eq!(align_down(4097), 4096);
        assert_eq!(align_up(4097), 8192);
        assert_eq!(align_up(4096), 4096);
        assert_eq!(align_up(0), 0);
    }
}
