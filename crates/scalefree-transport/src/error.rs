//! One error type for the transport and everything built on it.

use std::time::Duration;

/// What went wrong. Each kind maps to its own Python exception class.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system call failed (`what` names the call and its object).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A peer process exited or was killed while we depended on it (`pid` 0: on another
    /// host, not known here).
    #[error("rank {rank}{} is gone: {detail}", pid_note(*.pid))]
    PeerLost { rank: u32, pid: u32, detail: String },
    /// A wait ran past its deadline while every peer was still alive.
    #[error("timed out after {timeout:?} {waiting_for}")]
    Timeout {
        timeout: Duration,
        waiting_for: String,
    },
    /// The caller passed something that cannot work (bad offsets, sizes, dtypes).
    #[error("{0}")]
    InvalidArgument(String),
    /// Ranks called the same collective with different arguments.
    #[error("ranks disagree: {0}")]
    Mismatch(String),
    /// The job could not be assembled (rendezvous, token, environment).
    #[error("bootstrap failed: {0}")]
    Bootstrap(String),
    /// A wait was interrupted by the embedding runtime (e.g. Ctrl-C in Python).
    #[error("interrupted while {0}")]
    Interrupted(String),
    /// This backend or platform cannot do what was asked.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps the current `errno` with a description of the call that failed.
    pub fn last_os(what: impl Into<String>) -> Self {
        Error::Io {
            what: what.into(),
            source: std::io::Error::last_os_error(),
        }
    }

    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

fn pid_note(pid: u32) -> String {
    if pid == 0 { String::new() } else { format!(" (pid {pid})") }
}
