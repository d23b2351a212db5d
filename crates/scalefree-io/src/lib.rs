//! Partitioned input readers: rank `r` of `P` reads and parses only its share of an input
//! file, and the shares of all ranks together hold every data line exactly once, in file order.
//!
//! - [`share`]: the split of a plain text file. The body `[lo, len)` is cut at the nominal
//!   byte offsets `lo + (r * (len - lo)) / P`; a rank takes the lines whose first byte lies in
//!   its nominal range, so its real range runs from the first line start at or after its
//!   nominal start to the first line start at or after its nominal end. The file is
//!   memory-mapped and a rank touches only its range (plus the rest of its last line).
//! - [`source`]: a path is one file or a part directory (Spark, Dask, Hive): its part files
//!   in name order, markers skipped. The parts are one body, split by bytes as one file
//!   ([`share`]); every rank reads the prologue of every part.
//! - [`dialect`]: the delimiter (blanks, comma, semicolon) and header line, detected from
//!   the first line of the first part or given.
//! - [`gz`]: gzip parts made of several members (BGZF blocks, concatenated members) are
//!   split by members, each rank decompressing only its own; a single-member stream is
//!   decompressed by every rank that shares it, each parsing only its chunks — or, through
//!   [`stream::TextStream`], by one rank that hands its chunks to the others.
//! - One file per format: [`edges`] (SNAP edge lists, Matrix Market bodies), [`svmlight`]
//!   (the syntax of `scalefree.sgd.read_svmlight`), [`ratings`] (the syntax of
//!   `scalefree-mf`'s rating reader, which uses [`ratings::RatingSyntax`] too), [`docword`]
//!   (bag-of-words counts: UCI `docword` files and their CSV exports).
//!
//! Every file has a prologue — the lines before its first data line (comments, a Matrix
//! Market banner and size line, a CSV header) — which every rank reads, so that every rank
//! agrees on where the body starts and an empty file is an error on every rank. Errors name
//! the file and its absolute 1-based line (`PATH:LINE: problem`); the line number is only
//! computed on the error path.

pub mod dialect;
pub mod docword;
pub mod edges;
pub mod error;
pub mod gz;
mod line;
mod matrix_market;
pub mod number;
pub mod ratings;
pub mod share;
pub mod source;
pub mod stream;
pub mod svmlight;

pub use dialect::{Delimiter, Header};
pub use docword::{read_docword_parts, read_docword_share, DocwordShare};
pub use edges::{read_edge_keys_parts, read_edges_parts, read_edges_share, EdgeKeys, EdgeOptions, EdgeSink, Edges};
pub use error::{ReadError, Result};
pub use ratings::{read_ratings_parts, read_ratings_share, RatingShare, RatingSyntax};
pub use share::Part;
pub use source::resolve_parts;
pub use stream::{Parsed, StreamKind, TextStream};
pub use svmlight::{read_svmlight_parts, read_svmlight_share, SvmlightShare};

/// Options that every reader takes. All ranks of a job must pass the same values (they
/// decide where the shares of a gzip file are cut).
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Decompressed bytes per chunk of a gzip file (chunks are cut at the last line end
    /// within this many bytes, or after the first line end past it for longer lines).
    pub gzip_chunk_bytes: usize,
    /// The field delimiter; None: detected from the first line ([`dialect`]).
    pub delimiter: Option<Delimiter>,
    /// Whether the first line (of every part) is a header.
    pub header: Header,
}

/// Default of [`ReadOptions::gzip_chunk_bytes`]: 4 MiB.
pub const DEFAULT_GZIP_CHUNK_BYTES: usize = 4 << 20;

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { gzip_chunk_bytes: DEFAULT_GZIP_CHUNK_BYTES, delimiter: None, header: Header::Auto }
    }
}
