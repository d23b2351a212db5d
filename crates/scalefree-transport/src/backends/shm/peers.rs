//! Peers of the shared-memory backend: whether cross-memory attach reaches them, and a
//! watch on each one's process (a pidfd) that tells when it exits.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::cma_read;

/// Whether cross-memory attach works towards `pid` (tested with a real one-word read of
/// the peer's `probe_addr`). `SCALEFREE_CMA=0` turns it off for testing the fallback.
pub fn cma_permitted(pid: u32, probe_addr: usize) -> bool {
    if std::env::var("SCALEFREE_CMA").map(|v| v == "0").unwrap_or(false) {
        return false;
    }
    let mut word = 0u64;
    cma_read(pid, probe_addr, &mut word as *mut u64 as *mut u8, 8).is_ok()
}

/// A pidfd: becomes readable when the process exits (works for non-children).
#[derive(Debug)]
pub struct PidWatch {
    pub pid: u32,
    fd: Option<OwnedFd>,
}

impl PidWatch {
    pub fn new(pid: u32) -> Self {
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        let fd = if fd >= 0 {
            Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        } else {
            None
        };
        PidWatch { pid, fd }
    }

    /// True while the process exists and has not exited (a zombie counts as exited).
    pub fn alive(&self) -> bool {
        match &self.fd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let r = unsafe { libc::poll(&mut p, 1, 0) };
                !(r > 0 && p.revents != 0)
            }
            None => {
                // No pidfd support: fall back to /proc state.
                match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
                    Ok(s) => {
                        let state = s.rsplit(')').next().and_then(|r| r.trim().chars().next());
                        !matches!(state, Some('Z') | Some('X'))
                    }
                    Err(_) => false,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidwatch_sees_exit() {
        let mut child = std::process::Command::new("sleep").arg("0.1").spawn().unwrap();
        let w = PidWatch::new(child.id());
        assert!(w.alive());
        let _ = child.wait();
        // After reaping the pid may be reused, but the pidfd still reports the exit.
        assert!(!w.alive());
    }
}
