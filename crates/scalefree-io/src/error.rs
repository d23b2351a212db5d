//! The readers' errors. Each is one line; data errors name the file and, where there is one,
//! the absolute 1-based line: `PATH:LINE: problem`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Opening, mapping or reading the file failed (not found, permission, I/O error).
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A bad line.
    #[error("{path}:{line}: {msg}")]
    Parse { path: PathBuf, line: u64, msg: String },
    /// A problem of the whole file: no data, corrupt gzip stream.
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    /// The caller's arguments cannot work (rank out of range, bad field counts).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

pub type Result<T> = std::result::Result<T, ReadError>;

/// A bad line found while parsing a chunk: `at` is a byte offset into the chunk inside (or
/// at the start of) the line; the driver turns it into the absolute line number.
#[derive(Debug)]
pub struct BadLine {
    pub at: usize,
    pub msg: String,
}

impl BadLine {
    pub fn new(at: usize, msg: impl Into<String>) -> Self {
        BadLine { at, msg: msg.into() }
    }
}
