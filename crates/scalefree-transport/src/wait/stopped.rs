//! Peers on this host that are stopped (SIGSTOP, job control): what a wait does about them
//! (`SCALEFREE_STOPPED_PEER`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::PEER_HOSTS;
use crate::error::{Error, Result};

/// What a wait does about a peer on this host that is stopped (`SCALEFREE_STOPPED_PEER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoppedPeer {
    /// Warn after [`WaitPolicy::peer_timeout`] (as for any silent peer); fail after the timeout.
    Warn,
    /// Fail with [`Error::PeerLost`] once the peer has been seen stopped for the peer timeout.
    Error,
}

impl StoppedPeer {
    /// The default: see `docs/config.md` (a rank stopped alone does not resume by itself).
    pub const DEFAULT: StoppedPeer = StoppedPeer::Error;

    /// `SCALEFREE_STOPPED_PEER` (`error` or `warn`; unset or empty: [`StoppedPeer::DEFAULT`]).
    pub fn from_env() -> Result<Self> {
        match std::env::var("SCALEFREE_STOPPED_PEER").unwrap_or_default().trim() {
            "" => Ok(Self::DEFAULT),
            "error" => Ok(StoppedPeer::Error),
            "warn" => Ok(StoppedPeer::Warn),
            other => Err(Error::InvalidArgument(format!("SCALEFREE_STOPPED_PEER={other:?}: expected error or warn"))),
        }
    }
}

/// The processes of this rank's peers on this host, (rank, pid), and what to do when one is
/// stopped: what waits look at (see [`set_local_peers`]).
static LOCAL_PEERS: Mutex<(Vec<(u32, u32)>, Option<StoppedPeer>)> = Mutex::new((Vec::new(), None));

/// Tells waits which peers run on this host (`pids[r]`: rank r's process, None elsewhere;
/// this process's own pid is skipped), reading `SCALEFREE_STOPPED_PEER` (an error if invalid).
pub fn set_local_peers(pids: &[Option<u32>]) -> Result<()> {
    let policy = StoppedPeer::from_env()?;
    let me = std::process::id();
    let peers = pids.iter().enumerate().filter_map(|(r, p)| p.filter(|p| *p != me).map(|p| (r as u32, p))).collect();
    *LOCAL_PEERS.lock().unwrap_or_else(|e| e.into_inner()) = (peers, Some(policy));
    Ok(())
}

/// Whether process `pid` is stopped by a signal (state `T` in `/proc/PID/stat`; a debugger's
/// stop, `t`, is not).
pub(super) fn process_stopped(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // "pid (comm) S ...": the name may hold spaces and parentheses; the state follows the last ')'.
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) == Some("T")
}

fn this_host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned()).filter(|h| !h.is_empty())
}

/// Watches, during one wait, whether a peer on this host stays stopped (SIGSTOP, job control)
/// for the peer timeout. Peers are looked at once a second; a gap in this thread's own looks
/// (it was stopped or descheduled itself, e.g. the whole job was suspended) starts over.
pub(super) struct StoppedWatch {
    last_probe: Option<Instant>,
    since: Vec<(u32, Instant)>,
}

const STOPPED_PROBE_EVERY: Duration = Duration::from_secs(1);

impl StoppedWatch {
    pub(super) fn new() -> Self {
        StoppedWatch { last_probe: None, since: Vec::new() }
    }

    pub(super) fn check(&mut self, start: Instant, peer_timeout: Duration) -> Result<()> {
        let now = Instant::now();
        if peer_timeout.is_zero() || now.duration_since(start) < STOPPED_PROBE_EVERY
            || self.last_probe.is_some_and(|t| now.duration_since(t) < STOPPED_PROBE_EVERY) {
            return Ok(());
        }
        if self.last_probe.is_some_and(|t| now.duration_since(t) > 3 * STOPPED_PROBE_EVERY) {
            self.since.clear();
        }
        self.last_probe = Some(now);
        let peers = {
            let g = LOCAL_PEERS.lock().unwrap_or_else(|e| e.into_inner());
            if g.1 != Some(StoppedPeer::Error) {
                return Ok(());
            }
            g.0.clone()
        };
        let mut since = Vec::new();
        for (rank, pid) in peers {
            if !process_stopped(pid) {
                continue;
            }
            let t = self.since.iter().find(|(r, _)| *r == rank).map_or(now, |(_, t)| *t);
            if now.duration_since(t) >= peer_timeout {
                // The peer runs on this host: its name from the rendezvous, else this host's.
                let host = PEER_HOSTS.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
                    .and_then(|(_, h)| h.get(rank as usize).cloned()).filter(|h| !h.is_empty())
                    .or_else(this_host_name).map(|h| format!(" on host {h}")).unwrap_or_default();
                return Err(Error::PeerLost {
                    rank,
                    pid,
                    detail: format!(
                        "the process is stopped{host} (SIGSTOP or job control) and has been for {:.0} s \
                         (SCALEFREE_STOPPED_PEER=error, SCALEFREE_PEER_TIMEOUT={:.0} s)",
                        now.duration_since(t).as_secs_f64(), peer_timeout.as_secs_f64()
                    ),
                });
            }
            since.push((rank, t));
        }
        self.since = since;
        Ok(())
    }
}
