//! A cache buffer shared by the tasks that reference it.

use std::cell::UnsafeCell;

use crate::io::AlignedBuf;

/// One program-cache buffer. Readers share it; a writer has it alone. The program cache
/// enforces that discipline (an entry with an active writer gets no other reference), which
/// is what makes the unsafe accessors sound.
pub(crate) struct BufferCell(UnsafeCell<AlignedBuf>);

// SAFETY: access is governed by the program cache's reader/writer counts (see above).
unsafe impl Sync for BufferCell {}
// SAFETY: `AlignedBuf` is `Send`.
unsafe impl Send for BufferCell {}

impl BufferCell {
    pub(crate) fn new(buffer: AlignedBuf) -> BufferCell {
        BufferCell(UnsafeCell::new(buffer))
    }

    /// # Safety
    /// No writer may hold the buffer for the lifetime of the returned slice.
    pub(crate) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: per the contract.
        unsafe { (*self.0.get()).as_slice() }
    }

    /// # Safety
    /// The caller must be the only holder of the buffer for the lifetime of the slice.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: per the contract.
        unsafe { (*self.0.get()).as_mut_slice() }
    }

    pub(crate) fn into_inner(self) -> AlignedBuf {
        self.0.into_inner()
    }
}
