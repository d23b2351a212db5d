//! Errors of the MF crate; every input error names the file and, where it has one, the line.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum MfError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: {msg}")]
    Parse { path: PathBuf, line: usize, msg: String },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The memory budget cannot hold what must be in memory at once.
    #[error("{0}")]
    OutOfBudget(String),
    /// Reading or writing the blocks on flash failed (out of core).
    #[error("flash: {0}")]
    Flash(String),
}

impl MfError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        MfError::Io { path: path.into(), source }
    }
}

pub type Result<T> = std::result::Result<T, MfError>;
