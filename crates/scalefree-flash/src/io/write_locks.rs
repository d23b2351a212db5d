//! Ordering of writes that share sectors: a writer that read-modify-writes a sector holds
//! the sector's byte range exclusively, so two blocks whose edges share a sector never lose
//! each other's bytes (the paper's overlap check, done with a condition variable instead of
//! a backlog that is polled).

use std::sync::{Condvar, Mutex};

/// Byte ranges of one file currently being read-modify-written.
#[derive(Default)]
pub struct WriteRangeLocks {
    held: Mutex<Vec<(u64, u64)>>,
    released: Condvar,
}

/// Holds a byte range until dropped.
pub struct WriteRangeGuard<'a> {
    locks: &'a WriteRangeLocks,
    range: (u64, u64),
}

impl WriteRangeLocks {
    /// Waits until no held range overlaps `[start, end)`, then holds it.
    pub fn lock(&self, start: u64, end: u64) -> WriteRangeGuard<'_> {
        let mut held = self.held.lock().expect("write-range lock poisoned");
        while held.iter().any(|&(s, e)| s < end && start < e) {
            held = self.released.wait(held).expect("write-range lock poisoned");
        }
        held.push((start, end));
        WriteRangeGuard { locks: self, range: (start, end) }
    }

    /// Number of ranges held right now (for tests).
    pub fn held_count(&self) -> usize {
        self.held.lock().expect("write-range lock poisoned").len()
    }
}

impl Drop for WriteRangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().expect("write-range lock poisoned");
        if let Some(at) = held.iter().position(|&r| r == self.range) {
            held.swap_remove(at);
        }
        drop(held);
        self.locks.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn overlapping_ranges_exclude_each_other() {
        let locks = Arc::new(WriteRangeLocks::default());
        let inside = Arc::new(AtomicBool::new(false));
        let guard = locks.lock(0, 4096);
        let disjoint = locks.lock(4096, 8192);
        assert_eq!(locks.held_count(), 2);
        drop(disjoint);
        let (l2, in2) = (locks.clone(), inside.clone());
        let waiter = std::thread::spawn(move || {
            let _g = l2.lock(100, 200);
            in2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert!(!inside.load(Ordering::SeqCst), "overlapping range entered while held");
        drop(guard);
        waiter.join().unwrap();
        assert!(inside.load(Ordering::SeqCst));
        assert_eq!(locks.held_count(), 0);
    }
}
