//! The one error type of the flash crate.

use std::path::{Path, PathBuf};

/// Every failure the flash runtime reports. Misuse that can be detected before any IO
/// (shapes, bounds, budgets) is reported without touching the disk.
#[derive(Debug, thiserror::Error)]
pub enum FlashError {
    /// An operating-system IO error on a named file.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file the operation was on.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The device holding `path` is full (ENOSPC / EDQUOT).
    #[error("disk full while writing {path}")]
    DiskFull {
        /// The file being written.
        path: PathBuf,
    },
    /// A file exists but its contents are not what was expected (bad magic, checksum, size).
    #[error("corrupt or unrecognised file {path}: {reason}")]
    Corrupt {
        /// The file that was opened.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// One task (or one request) alone needs more memory than the whole budget.
    #[error("out of memory budget: {what} needs {needed_bytes} bytes but the budget is {budget_bytes} bytes")]
    OutOfBudget {
        /// What asked for the memory.
        what: String,
        /// How many bytes it needs at once.
        needed_bytes: u64,
        /// The runtime's memory budget.
        budget_bytes: u64,
    },
    /// Operand shapes do not agree.
    #[error("shape mismatch: {0}")]
    ShapeMismatch(String),
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A task's `execute` returned an error or panicked.
    #[error("task {task} failed: {reason}")]
    TaskFailed {
        /// The task's name.
        task: String,
        /// Its error or panic message.
        reason: String,
    },
}

/// Result alias of the flash crate.
pub type Result<T> = std::result::Result<T, FlashError>;

impl FlashError {
    /// Wraps an OS error on `path`, naming ENOSPC / EDQUOT as [`FlashError::DiskFull`].
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => FlashError::DiskFull { path: path.to_path_buf() },
            _ => FlashError::Io { path: path.to_path_buf(), source },
        }
    }

    /// Shorthand for [`FlashError::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        FlashError::InvalidArgument(message.into())
    }

    /// Shorthand for [`FlashError::ShapeMismatch`].
    pub fn shape(message: impl Into<String>) -> Self {
        FlashError::ShapeMismatch(message.into())
    }
}
