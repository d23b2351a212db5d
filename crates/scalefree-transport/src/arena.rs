//! A registered arena: one large shared-memory region per rank from which big buffers are
//! allocated, so that peers address them without any copy (the papers' "allocate tensors
//! directly in registered memory"). Python installs it as numpy's data allocator.
//!
//! The region is a sparse memfd mapped once by every peer at start-up; pages are only
//! backed when touched. Blocks are page-aligned, best-fit from coalescing free lists, with a
//! bump pointer over fresh (zero) memory. Freed blocks stay resident for reuse (no page
//! faults) up to `cache_bytes`, or up to the largest block handed out when that is bigger (so
//! a buffer reallocated at the same size every step never faults its pages in again; the
//! process already held that much); beyond that their pages are returned to the kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use crate::region::Region;

const PAGE: usize = 4096;

/// Options for [`Arena`].
#[derive(Clone, Debug)]
pub struct ArenaOptions {
    /// Address space reserved per rank (sparse: costs nothing until touched).
    pub capacity_bytes: usize,
    /// Freed memory kept resident for reuse before pages are returned to the kernel.
    pub cache_bytes: usize,
}

impl Default for ArenaOptions {
    fn default() -> Self {
        use crate::config::env_bytes as env;
        ArenaOptions {
            capacity_bytes: env("SCALEFREE_ARENA_BYTES", 64 << 30),
            cache_bytes: env("SCALEFREE_ARENA_CACHE", 1 << 30),
        }
    }
}

/// A free range: `len` bytes of which `resident` bytes still hold pages.
#[derive(Clone, Copy)]
struct Free {
    len: usize,
    resident: usize,
}

#[derive(Default)]
struct State {
    /// Free ranges by offset (coalesced) and by (length, offset) for best fit.
    free_by_off: BTreeMap<usize, Free>,
    free_by_len: BTreeSet<(usize, usize)>,
    /// Everything at or above `top` has never been handed out (reads as zero).
    top: usize,
    /// Resident bytes in free ranges.
    cached_bytes: usize,
    /// The largest block handed out so far: the cache may hold that much even when it is
    /// above `cache_bytes`.
    largest_block: usize,
    /// Length of every block handed out, by offset.
    allocated: BTreeMap<usize, usize>,
    /// After `fork`, the child stops allocating here (the parent owns the arena).
    disabled: bool,
}

/// Allocator over one shared region. Thread-safe.
pub struct Arena {
    region: Region,
    base: usize,
    capacity: usize,
    cache_bytes: usize,
    state: Mutex<State>,
    /// Set in a forked child (checked before taking the lock, which a parent thread may
    /// have held at the moment of the fork).
    forked: std::sync::atomic::AtomicBool,
}

/// An allocated block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub ptr: *mut u8,
    pub len: usize,
    /// True when the memory is known to read as zero (never used, or returned to the kernel).
    pub zeroed: bool,
}

impl Arena {
    /// Wraps a region made by [`crate::Device::alloc_arena_region`].
    pub fn new(region: Region, opts: &ArenaOptions) -> Self {
        let base = region.as_ptr() as usize;
        let capacity = region.len();
        Arena { region, base, capacity, cache_bytes: opts.cache_bytes, state: Mutex::new(State::default()), forked: Default::default() }
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Whether `ptr` points into this arena.
    #[inline]
    pub fn contains(&self, ptr: *const u8) -> bool {
        let p = ptr as usize;
        p >= self.base && p < self.base + self.capacity
    }

    /// Stops handing out memory (called in a forked child, see the Python allocator).
    pub fn disable(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).disabled = true;
    }

    /// In a child after `fork`: remaps the arena copy-on-write, so the child's writes to
    /// arrays it inherited never reach the parent (or the parent's peers), and stops
    /// allocating from it. Only async-signal-safe calls (mmap) besides the state flag.
    pub fn privatize_after_fork(&self) {
        if let Some(fd) = self.region.fd() {
            unsafe {
                libc::mmap(
                    self.base as *mut libc::c_void,
                    self.capacity,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    fd,
                    0,
                );
            }
        }
        self.forked.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Allocates `len` bytes (rounded up to whole pages), or None when the arena is full or
    /// disabled (the caller falls back to ordinary memory).
    pub fn alloc(&self, len: usize) -> Option<Block> {
        let len = len.max(1).next_multiple_of(PAGE);
        if self.forked.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.disabled {
            return None;
        }
        // Best fit among free ranges.
        if let Some(&(flen, off)) = st.free_by_len.range((len, 0)..).next() {
            let f = st.take(off);
            debug_assert_eq!(f.len, flen);
            let used_resident = f.resident.min(len);
            st.cached_bytes -= used_resident;
            if flen > len {
                st.put(off + len, Free { len: flen - len, resident: f.resident - used_resident });
            }
            st.allocated.insert(off, len);
            st.largest_block = st.largest_block.max(len);
            return Some(Block { ptr: (self.base + off) as *mut u8, len, zeroed: false });
        }
        if st.top + len > self.capacity {
            return None;
        }
        let off = st.top;
        st.top += len;
        st.allocated.insert(off, len);
        st.largest_block = st.largest_block.max(len);
        Some(Block { ptr: (self.base + off) as *mut u8, len, zeroed: true })
    }

    /// The length of the block at `ptr`, if it is one this arena handed out.
    pub fn block_len(&self, ptr: *const u8) -> Option<usize> {
        if !self.contains(ptr) || self.forked.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.allocated.get(&(ptr as usize - self.base)).copied()
    }

    /// Returns the block at `ptr`. Pointers this arena did not hand out are ignored.
    pub fn free(&self, ptr: *mut u8) {
        if !self.contains(ptr) {
            return;
        }
        if self.forked.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let off = ptr as usize - self.base;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.disabled {
            return;
        }
        let Some(len) = st.allocated.remove(&off) else { return };
        st.cached_bytes += len;
        st.insert_free(off, Free { len, resident: len });
        if st.cached_bytes > self.cache_limit(&st) {
            let keep = self.cache_limit(&st) / 2;
            self.release(&mut st, keep);
        }
    }

    /// Returns the pages of every freed block to the kernel (the cache kept for reuse), for
    /// a caller that has dropped a phase's temporaries for good: the process's resident
    /// memory is then its live blocks. Returns the bytes released.
    pub fn release_cached(&self) -> usize {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.disabled || self.forked.load(std::sync::atomic::Ordering::Relaxed) {
            return 0;
        }
        let before = st.cached_bytes;
        self.release(&mut st, 0);
        before - st.cached_bytes
    }

    /// Freed bytes that may stay resident: `cache_bytes`, or the largest block handed out
    /// when that is bigger.
    fn cache_limit(&self, st: &State) -> usize {
        self.cache_bytes.max(st.largest_block)
    }

    /// Returns the pages of resident free ranges to the kernel until at most `keep` bytes
    /// stay cached.
    fn release(&self, st: &mut State, keep: usize) {
        let fd = match self.region.fd() {
            Some(fd) => fd,
            None => return,
        };
        // Largest ranges first: fewest system calls for the most memory.
        let ranges: Vec<(usize, usize)> = st.free_by_len.iter().rev().map(|&(l, o)| (o, l)).collect();
        for (off, len) in ranges {
            if st.cached_bytes <= keep {
                break;
            }
            let f = st.free_by_off[&off];
            if f.resident == 0 {
                continue;
            }
            let r = unsafe {
                libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off as libc::off_t, len as libc::off_t)
            };
            if r == 0 {
                st.cached_bytes -= f.resident;
                st.free_by_off.insert(off, Free { len, resident: 0 });
            }
        }
        // A released range at the top becomes fresh bump space again.
        if let Some((&off, &f)) = st.free_by_off.iter().next_back() {
            if off + f.len == st.top && f.resident == 0 {
                st.take(off);
                st.top = off;
            }
        }
    }

    /// Bytes handed out or cached (for tests and stats).
    pub fn high_water_bytes(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).top
    }
}

impl State {
    fn take(&mut self, off: usize) -> Free {
        let f = self.free_by_off.remove(&off).expect("free range");
        self.free_by_len.remove(&(f.len, off));
        f
    }

    fn put(&mut self, off: usize, f: Free) {
        self.free_by_off.insert(off, f);
        self.free_by_len.insert((f.len, off));
    }

    /// Inserts a free range, coalescing with its neighbours.
    fn insert_free(&mut self, mut off: usize, mut f: Free) {
        if let Some((&poff, &p)) = self.free_by_off.range(..off).next_back() {
            if poff + p.len == off {
                self.take(poff);
                off = poff;
                f = Free { len: p.len + f.len, resident: p.resident + f.resident };
            }
        }
        if let Some(&n) = self.free_by_off.get(&(off + f.len)) {
            self.take(off + f.len);
            f = Free { len: f.len + n.len, resident: f.resident + n.resident };
        }
        self.put(off, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, DeviceOptions, JobInfo};

    fn arena(capacity: usize, cache: usize) -> Arena {
        let dev = Device::new(JobInfo::single(), DeviceOptions::default()).unwrap();
        let region = dev.alloc_arena_region(capacity).unwrap();
        Arena::new(region, &ArenaOptions { capacity_bytes: capacity, cache_bytes: cache })
    }

    #[test]
    fn blocks_are_disjoint_aligned_and_reused() {
        let a = arena(1 << 30, 1 << 30);
        let mut blocks = Vec::new();
        for i in 1..200usize {
            let b = a.alloc(i * 5000).unwrap();
            assert_eq!(b.ptr as usize % PAGE, 0);
            assert!(b.zeroed && b.len >= i * 5000);
            unsafe { std::ptr::write_bytes(b.ptr, i as u8, b.len) };
            blocks.push(b);
        }
        for (i, b) in blocks.iter().enumerate() {
            let s = unsafe { std::slice::from_raw_parts(b.ptr, b.len) };
            assert!(s.iter().all(|&x| x == (i + 1) as u8), "block {i} overwritten");
        }
        let top = a.high_water_bytes();
        for b in blocks.iter().step_by(2) {
            a.free(b.ptr);
        }
        // Freed space is reused before the arena grows.
        let again = a.alloc(5000).unwrap();
        assert!(!again.zeroed);
        assert_eq!(a.high_water_bytes(), top);
        for b in blocks.iter().skip(1).step_by(2) {
            a.free(b.ptr);
        }
        a.free(again.ptr);
        // Everything coalesced into one range: a block of the whole size fits without growth.
        let big = a.alloc(top).unwrap();
        assert_eq!(big.ptr as usize, a.region().as_ptr() as usize);
        assert_eq!(a.high_water_bytes(), top);
        assert!(a.contains(big.ptr) && !a.contains(std::ptr::null()));
    }

    #[test]
    fn over_the_cache_pages_are_returned_and_read_zero() {
        let a = arena(1 << 30, 1 << 20);
        let b = a.alloc(4 << 20).unwrap();
        let b2 = a.alloc(4 << 20).unwrap();
        unsafe { std::ptr::write_bytes(b.ptr, 7, b.len) };
        unsafe { std::ptr::write_bytes(b2.ptr, 7, b2.len) };
        a.free(b.ptr);
        a.free(b2.ptr);
        // 8 MiB freed is past both the cache and the largest block (4 MiB): returned to the
        // kernel and back to bump space, zero again.
        let c = a.alloc(4 << 20).unwrap();
        assert!(c.zeroed, "released top range should be fresh");
        let s = unsafe { std::slice::from_raw_parts(c.ptr, c.len) };
        assert!(s.iter().all(|&x| x == 0));
    }

    #[test]
    fn release_cached_returns_every_freed_page() {
        let a = arena(1 << 30, 1 << 30);
        let keep = a.alloc(1 << 20).unwrap();
        let (b, b2) = (a.alloc(4 << 20).unwrap(), a.alloc(3 << 20).unwrap());
        let top = a.alloc(1 << 20).unwrap(); // the freed blocks are not at the top
        for x in [b, b2, keep] {
            unsafe { std::ptr::write_bytes(x.ptr, 7, x.len) };
        }
        a.free(b.ptr);
        a.free(b2.ptr);
        assert_eq!(a.release_cached(), 7 << 20);
        assert_eq!(a.release_cached(), 0);
        // The released range is reused, reading zero (its pages were returned); live blocks
        // are untouched.
        let c = a.alloc(7 << 20).unwrap();
        assert_eq!(c.ptr, b.ptr);
        assert!(unsafe { std::slice::from_raw_parts(c.ptr, c.len) }.iter().all(|&x| x == 0));
        assert!(unsafe { std::slice::from_raw_parts(keep.ptr, keep.len) }.iter().all(|&x| x == 7));
        a.free(top.ptr);
    }

    #[test]
    fn one_block_bigger_than_the_cache_stays_resident_for_its_next_use() {
        let a = arena(1 << 30, 1 << 20);
        let b = a.alloc(4 << 20).unwrap();
        unsafe { std::ptr::write_bytes(b.ptr, 7, b.len) };
        a.free(b.ptr);
        // The process held 4 MiB already: reallocating the same size faults nothing in.
        let c = a.alloc(4 << 20).unwrap();
        assert_eq!(c.ptr, b.ptr);
        assert!(!c.zeroed);
    }

    #[test]
    fn full_or_disabled_arena_says_no() {
        let a = arena(1 << 20, 1 << 20);
        assert!(a.alloc(2 << 20).is_none());
        let b = a.alloc(1 << 20).unwrap();
        assert!(a.alloc(1).is_none());
        a.free(b.ptr);
        a.disable();
        assert!(a.alloc(1).is_none());
    }
}
