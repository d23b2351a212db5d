//! A channel to one peer: one-sided writes and reads between regions, and notifications.
//!
//! Two forms of each operation:
//!
//! * `start_write`, `start_read`, `start_write_notify` post the operation and return a
//!   [`Completion`] at once; test or wait on it later, with any number in flight. Over UCX
//!   the operation runs while the caller goes on (a TCP lane's writer thread, or UCX's own
//!   progress); on shared memory a copy completes before the call returns (a memcpy into
//!   the peer's mapping, or one `process_vm_writev`/`readv`), so its completion is
//!   already done.
//! * `write`, `read`, `write_notify` are the blocking conveniences: they return once the
//!   operation has completed (the returned completion is done).
//!
//! Ordering (also in `docs/transport.md`): a completion tells that the operation's *local*
//! buffer may be reused (a read: that the bytes are here). Operations in flight to one peer
//! are not ordered with each other: two writes to overlapping bytes land in either order.
//! A notification (`write_notify`'s, or `notify`) is seen by the peer only after the data
//! of its own write and of every write to that peer that completed before it was issued.

use crate::backends::{Note, Request};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::region::{check_range, Region, RemoteRegion};

/// The completion of a one-sided operation.
#[must_use = "wait on the completion before reusing the buffer"]
pub struct Completion {
    /// An operation still in flight (a backend's request), and the device that drives its progress.
    pending: Option<(Device, Request)>,
    /// The local region the operation reads or writes, kept alive until it completes.
    keep: Option<Region>,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Completion(done: {})", self.test())
    }
}

impl Completion {
    pub(crate) fn done() -> Self {
        Completion { pending: None, keep: None }
    }
    fn pending(dev: &Device, r: Option<Request>, keep: Option<Region>) -> Self {
        match r {
            None => Completion::done(),
            Some(r) => Completion { pending: Some((dev.clone(), r)), keep },
        }
    }
    /// True once the operation's buffers may be reused.
    pub fn test(&self) -> bool {
        match &self.pending {
            None => true,
            Some((dev, r)) => {
                dev.backend().progress();
                r.test()
            }
        }
    }
    /// Blocks until the operation has completed.
    pub fn wait(self) -> Result<()> {
        self.wait_for(None)
    }
    /// Blocks until the operation has completed, at most `timeout` (then
    /// [`Error::Timeout`]; the operation stays in flight).
    pub fn wait_for(&self, timeout: Option<std::time::Duration>) -> Result<()> {
        match &self.pending {
            None => Ok(()),
            Some((dev, r)) => {
                let mut policy = *dev.policy();
                if let Some(t) = timeout {
                    policy.timeout = t;
                }
                dev.backend().wait_request(r, &policy)
            }
        }
    }
    /// Whether this operation still holds the local region it was posted with.
    pub fn holds_region(&self) -> bool {
        self.keep.is_some()
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        // Dropped unfinished: the bytes may still move from or into the region; keep it
        // (and the request) until they have (a dropped completion is waited for).
        if let Some((dev, r)) = self.pending.take() {
            if !r.test() {
                let _ = dev.backend().wait_request(&r, dev.policy());
            }
        }
    }
}

/// A connection from this rank to `peer`.
#[derive(Clone)]
pub struct Channel {
    dev: Device,
    peer: u32,
}

impl Channel {
    pub(crate) fn new(dev: Device, peer: u32) -> Self {
        Channel { dev, peer }
    }

    pub fn peer(&self) -> u32 {
        self.peer
    }

    fn check_owner(&self, remote: &RemoteRegion) -> Result<()> {
        if remote.owner() != self.peer {
            return Err(Error::InvalidArgument(format!(
                "channel to rank {} was given a region of rank {}",
                self.peer,
                remote.owner()
            )));
        }
        Ok(())
    }

    /// Copies `n` bytes from `local[local_off..]` into the peer's `remote[remote_off..]`.
    pub fn write(&self, local: &Region, local_off: usize, remote: &RemoteRegion, remote_off: usize, n: usize) -> Result<Completion> {
        local.check_range(local_off, n, "write source")?;
        check_range(remote.len(), remote_off, n, "write target")?;
        self.check_owner(remote)?;
        unsafe { self.write_from(local.as_ptr().add(local_off), remote, remote_off, n)? };
        Ok(Completion::done())
    }

    /// Copies `n` bytes from the peer's `remote[remote_off..]` into `local[local_off..]`.
    pub fn read(&self, remote: &RemoteRegion, remote_off: usize, local: &Region, local_off: usize, n: usize) -> Result<Completion> {
        local.check_range(local_off, n, "read target")?;
        check_range(remote.len(), remote_off, n, "read source")?;
        self.check_owner(remote)?;
        unsafe { self.read_into(remote, remote_off, local.as_ptr().add(local_off), n)? };
        Ok(Completion::done())
    }

    /// `write`, then a notification `value` (non-zero) in the peer's `slot`. The peer sees
    /// the data before it sees the notification.
    #[allow(clippy::too_many_arguments)]
    pub fn write_notify(&self, local: &Region, local_off: usize, remote: &RemoteRegion, remote_off: usize, n: usize, slot: usize, value: u32) -> Result<Completion> {
        Device::check_slot(slot)?;
        if value == 0 {
            return Err(Error::InvalidArgument("a notification value must be non-zero".into()));
        }
        local.check_range(local_off, n, "write source")?;
        check_range(remote.len(), remote_off, n, "write target")?;
        self.check_owner(remote)?;
        unsafe { self.write_notify_from(local.as_ptr().add(local_off), remote, remote_off, n, slot, value)? };
        Ok(Completion::done())
    }

    /// Posts a copy of `n` bytes from `local[local_off..]` into the peer's
    /// `remote[remote_off..]` and returns at once; `local` must stay unchanged there until
    /// the completion is done (the completion keeps the region alive).
    pub fn start_write(&self, local: &Region, local_off: usize, remote: &RemoteRegion, remote_off: usize, n: usize) -> Result<Completion> {
        local.check_range(local_off, n, "write source")?;
        check_range(remote.len(), remote_off, n, "write target")?;
        self.check_owner(remote)?;
        if n == 0 {
            return Ok(Completion::done());
        }
        let src = unsafe { local.as_ptr().add(local_off) };
        self.dev.inner.traffic.wrote(self.peer, n);
        let r = unsafe { self.dev.backend().start_write(&self.dev, self.peer, src, remote, remote_off, n)? };
        Ok(Completion::pending(&self.dev, r, Some(local.clone())))
    }

    /// Posts a copy of `n` bytes of the peer's `remote[remote_off..]` into
    /// `local[local_off..]` and returns at once; the bytes are there once the completion
    /// is done (do not read or write them before).
    pub fn start_read(&self, remote: &RemoteRegion, remote_off: usize, local: &Region, local_off: usize, n: usize) -> Result<Completion> {
        local.check_range(local_off, n, "read target")?;
        check_range(remote.len(), remote_off, n, "read source")?;
        self.check_owner(remote)?;
        if n == 0 {
            return Ok(Completion::done());
        }
        let dst = unsafe { local.as_ptr().add(local_off) };
        self.dev.inner.traffic.read(self.peer, n);
        let r = unsafe { self.dev.backend().start_read(&self.dev, self.peer, remote, remote_off, dst, n)? };
        Ok(Completion::pending(&self.dev, r, Some(local.clone())))
    }

    /// [`Channel::start_write`], then notification `value` (non-zero) in the peer's `slot`:
    /// the peer sees the data before the notification.
    #[allow(clippy::too_many_arguments)]
    pub fn start_write_notify(&self, local: &Region, local_off: usize, remote: &RemoteRegion, remote_off: usize, n: usize, slot: usize, value: u32) -> Result<Completion> {
        Device::check_slot(slot)?;
        if value == 0 {
            return Err(Error::InvalidArgument("a notification value must be non-zero".into()));
        }
        local.check_range(local_off, n, "write source")?;
        check_range(remote.len(), remote_off, n, "write target")?;
        self.check_owner(remote)?;
        let mut c = unsafe { self.start_write_notify_from(local.as_ptr().add(local_off), remote, remote_off, n, slot, value)? };
        if c.pending.is_some() {
            c.keep = Some(local.clone());
        }
        Ok(c)
    }

    /// Delivers notification `value` (non-zero) into the peer's `slot`.
    pub fn notify(&self, slot: usize, value: u32) -> Result<()> {
        Device::check_slot(slot)?;
        if value == 0 {
            return Err(Error::InvalidArgument("a notification value must be non-zero".into()));
        }
        self.dev.inner.traffic.wrote(self.peer, 0);
        self.raw_notify(slot, value)
    }

    fn raw_notify(&self, slot: usize, value: u32) -> Result<()> {
        self.dev.backend().notify(&self.dev, self.peer, slot as u32, value)
    }

    /// [`Channel::write_notify_from`] that returns at once: `src` must stay untouched until
    /// the completion is done (on shared memory it already is).
    ///
    /// # Safety
    /// `src..src+n` must stay readable until the completion is done.
    pub unsafe fn start_write_notify_from(&self, src: *const u8, remote: &RemoteRegion, remote_off: usize, n: usize, slot: usize, value: u32) -> Result<Completion> {
        Device::check_slot(slot)?;
        self.dev.inner.traffic.wrote(self.peer, n);
        let r = unsafe { self.dev.backend().start_write_notify(&self.dev, self.peer, src, remote, remote_off, n, Note::Slot(slot as u32, value))? };
        Ok(Completion::pending(&self.dev, r, None))
    }

    /// Writes `n` bytes from `src` into the peer's `remote[remote_off..]`, then raises the
    /// 32-bit word at `word_off` of the same region to `value` (sequence order: it never goes
    /// down) and wakes whoever waits on it. The peer sees the data before the word. Returns
    /// at once; `src` must stay untouched until the completion is done.
    ///
    /// # Safety
    /// `src..src+n` must stay readable until the completion is done.
    pub unsafe fn start_write_raise(&self, src: *const u8, remote: &RemoteRegion, remote_off: usize, n: usize, word_off: usize, value: u32) -> Result<Completion> {
        check_range(remote.len(), remote_off, n, "write target")?;
        check_range(remote.len(), word_off, 4, "notification word")?;
        if !word_off.is_multiple_of(4) {
            return Err(Error::InvalidArgument(format!("notification word offset {word_off} is not 4-byte aligned")));
        }
        if remote.rkey.is_none() && remote.mapped_ptr().is_none() {
            return Err(Error::Unsupported("start_write_raise needs a mapped or keyed region".into()));
        }
        self.dev.inner.traffic.wrote(self.peer, n);
        let r = unsafe { self.dev.backend().start_write_notify(&self.dev, self.peer, src, remote, remote_off, n, Note::Word(word_off as u64, value))? };
        Ok(Completion::pending(&self.dev, r, None))
    }

    /// Writes `n` bytes from `src` into `remote` at `remote_off`, then raises notification
    /// `slot` to `value` at the peer once they have landed.
    ///
    /// # Safety
    /// `src..src+n` must be readable for the call.
    pub unsafe fn write_notify_from(&self, src: *const u8, remote: &RemoteRegion, remote_off: usize, n: usize, slot: usize, value: u32) -> Result<()> {
        self.dev.inner.traffic.wrote(self.peer, n);
        unsafe { self.dev.backend().write_notify(&self.dev, self.peer, src, remote, remote_off, n, Note::Slot(slot as u32, value)) }
    }

    /// Raw write for collectives: no bounds checks beyond the remote region's.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    pub unsafe fn write_from(&self, src: *const u8, remote: &RemoteRegion, remote_off: usize, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.dev.inner.traffic.wrote(self.peer, n);
        unsafe { self.dev.backend().write(&self.dev, self.peer, src, remote, remote_off, n) }
    }

    /// Mesh post (see [`crate::mesh::Mesh::post`]) to this channel's peer: `n` bytes from
    /// `src` into `remote` at `remote_off`, then the 64-bit word at `word_off` of the same
    /// region becomes `value` and the region's doorbell rings; returns once `src` may be
    /// reused.
    ///
    /// # Safety
    /// `src..src+n` must be readable; `remote` must be a mesh region.
    pub unsafe fn write_post(&self, src: *const u8, remote: &RemoteRegion, remote_off: usize, n: usize, word_off: usize, value: u64) -> Result<()> {
        unsafe { self.start_write_post(src, remote, remote_off, n, word_off, value)? }.wait()
    }

    /// [`Channel::write_post`] that returns at once: `src` must stay untouched until the
    /// completion is done (to a mapped peer it already is). Testing the completion never
    /// fails because some other peer is lost (for collectives that survive losses).
    ///
    /// # Safety
    /// `src..src+n` must stay readable until the completion is done; `remote` must be a
    /// mesh region.
    pub unsafe fn start_write_post(&self, src: *const u8, remote: &RemoteRegion, remote_off: usize, n: usize, word_off: usize, value: u64) -> Result<Completion> {
        check_range(remote.len(), remote_off, n, "write target")?;
        check_range(remote.len(), word_off, 8, "posted word")?;
        if remote.len() < crate::mesh::MESH_HEADER || !word_off.is_multiple_of(8) {
            return Err(Error::InvalidArgument("a post goes to an aligned word of a mesh region".into()));
        }
        self.dev.inner.traffic.wrote(self.peer, n);
        let r = unsafe { self.dev.backend().start_write_notify(&self.dev, self.peer, src, remote, remote_off, n, Note::Post(word_off as u64, value))? };
        Ok(Completion::pending(&self.dev, r, None))
    }

    /// Raw read for collectives.
    ///
    /// # Safety
    /// `dst..dst+n` must be writable and not overlap the source.
    pub unsafe fn read_into(&self, remote: &RemoteRegion, remote_off: usize, dst: *mut u8, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.dev.inner.traffic.read(self.peer, n);
        unsafe { self.dev.backend().read(&self.dev, self.peer, remote, remote_off, dst, n) }
    }
}
