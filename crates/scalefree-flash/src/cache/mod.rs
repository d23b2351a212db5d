//! The program cache: access specifiers mapped to shared buffers under a memory budget.

pub(crate) mod buffer;
pub mod program_cache;
pub mod reader;

pub use program_cache::{CacheStats, EntryTag};
pub use reader::{CacheReader, CachedBlock, ReaderStats};
