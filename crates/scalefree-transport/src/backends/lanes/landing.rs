//! Direct landing (see [`crate::backends::DirectLanding`]): while windows are set, a lane
//! write into a window of the region they name goes to the caller's memory instead of the
//! region, copied there, or read in cache-sized parts and reduced into it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::backends::{Reducer, Window};

/// The windows in force, and the readers inside one right now.
#[derive(Default)]
pub(crate) struct Landing {
    direct: Mutex<Option<Direct>>,
    /// Lane readers writing into a direct window right now.
    busy: AtomicU32,
    /// Bytes received by direct landing so far, copied and reduced (for tests and reports).
    copied: AtomicU64,
    reduced: AtomicU64,
}

/// Windows of one region whose lane writes land elsewhere.
struct Direct {
    key: u64,
    windows: Vec<Window>,
    /// The flag word of a write's note word is this many bytes after it.
    flag_delta: usize,
}

// The windows' pointers are the caller's, valid until `clear` returns (see `set`).
unsafe impl Send for Direct {}

impl Landing {
    /// Until [`Landing::clear`], lane writes into region `key` that fall whole inside a
    /// window are received into the window's `dst` instead: copied there, or, for a window
    /// with a reducer, read in cache-sized parts and reduced into it part by part (the bytes
    /// never pass through the region, nor through memory: the owner has nothing left to
    /// reduce). A write that landed so also stores its note's value into the 32-bit word
    /// `flag_delta` bytes after its note word (before raising the note), so the owner can
    /// tell, per write, where its bytes are: writes over UCX, or not whole inside a window,
    /// land in the region as always.
    ///
    /// # Safety
    /// Every window's `dst..dst+len` must stay writable (and readable, for a reducing one),
    /// and untouched by anyone else, until `clear` returns.
    pub(crate) unsafe fn set(&self, key: u64, windows: &[Window], flag_delta: usize) {
        *self.direct.lock().unwrap() = Some(Direct { key, windows: windows.to_vec(), flag_delta });
    }

    /// Ends direct landing; returns once no lane reader writes into a window any more. A
    /// reader still inside a write after `timeout` (its peer stopped mid-write) has its lane
    /// shut down by `shut_down`, so that it stops touching the caller's memory.
    pub(crate) fn clear(&self, timeout: Duration, shut_down: impl Fn()) {
        *self.direct.lock().unwrap() = None;
        let start = std::time::Instant::now();
        let mut shut = false;
        while self.busy.load(Ordering::SeqCst) > 0 {
            if !shut && start.elapsed() >= timeout {
                shut_down();
                shut = true;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Bytes received by direct landing so far: (copied, reduced).
    pub(crate) fn landed_bytes(&self) -> (u64, u64) {
        (self.copied.load(Ordering::Relaxed), self.reduced.load(Ordering::Relaxed))
    }

    /// Where a lane write of `len` bytes at `offset` of region `key` lands instead of the
    /// region, if it falls whole into a window: (destination, flag delta, the window's
    /// reducer if it reduces). The caller is counted busy until [`Landing::left`].
    pub(super) fn target(&self, key: u64, offset: usize, len: usize) -> Option<(usize, usize, Option<Reducer>)> {
        let d = self.direct.lock().unwrap();
        let d = d.as_ref().filter(|d| d.key == key)?;
        let end = offset.checked_add(len)?;
        let w = d.windows.iter().find(|w| offset >= w.offset && end <= w.offset + w.len)?;
        self.busy.fetch_add(1, Ordering::SeqCst);
        Some((w.dst as usize + (offset - w.offset), d.flag_delta, w.reduce.clone()))
    }

    /// A reader that got a [`Landing::target`] is out of the window.
    pub(super) fn left(&self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }

    /// Counts `n` bytes landed directly (reduced or copied).
    pub(super) fn landed(&self, n: usize, reduced: bool) {
        if reduced { &self.reduced } else { &self.copied }.fetch_add(n as u64, Ordering::Relaxed);
    }
}
