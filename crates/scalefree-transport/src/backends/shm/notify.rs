//! Notifications of the shared-memory backend: a store into the word (a notification slot
//! in the peer's mapped control segment, a word of a mapped region, a mesh post) and a futex
//! wake when somebody is parked on it.

use super::Shm;
use crate::backends::Note;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::region::RemoteRegion;

impl Shm {
    /// Raises `peer`'s slot in its mapped control segment.
    pub(crate) fn publish(dev: &Device, peer: u32, slot: u32, value: u32) {
        crate::wait::publish(dev.slot_of(peer, slot as usize), dev.waiters_of(peer), value);
    }

    /// Write then note, through memory.
    ///
    /// # Safety
    /// `src..src+n` must be readable.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn write_then_note(dev: &Device, peer: u32, src: *const u8, remote: &RemoteRegion, off: usize, n: usize, note: Note,
                                         notify: impl FnOnce(u32, u32) -> Result<()>) -> Result<()> {
        match note {
            Note::None => {
                if n > 0 {
                    unsafe { Self::copy_to(dev, peer, src, remote, off, n)? };
                }
                Ok(())
            }
            Note::Slot(slot, value) => {
                if n > 0 {
                    unsafe { Self::copy_to(dev, peer, src, remote, off, n)? };
                }
                notify(slot, value)
            }
            Note::Word(word_off, value) => {
                let Some(base) = remote.mapped_ptr() else {
                    return Err(Error::Unsupported("a raised word needs a mapped region or a keyed one".into()));
                };
                if n > 0 {
                    unsafe { Self::copy_to(dev, peer, src, remote, off, n)? };
                }
                crate::wait::raise(unsafe { &*(base.add(word_off as usize) as *const std::sync::atomic::AtomicU32) }, value);
                Ok(())
            }
            Note::Post(word_off, value) => {
                let p = remote.mapped_ptr().ok_or_else(|| Error::Unsupported("mesh post to a peer whose region is not mapped".into()))?;
                unsafe { crate::mesh::post_mapped(p, off, src, n, word_off as usize, value) };
                Ok(())
            }
        }
    }
}
