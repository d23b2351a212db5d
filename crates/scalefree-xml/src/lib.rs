//! Extreme multi-label (XML) inference out of core — the BLAS-on-flash paper's second
//! application (§5.5): ensembles of label trees (Parabel / omikuji models) stored on flash
//! level by level and scored by a batched breadth-first beam search whose tasks run in the
//! flash scheduler under its hard memory budget.
//!
//! * [`format`] — the model file (one contiguous segment per tree level) and its writer.
//! * [`omikuji`] — import of a model saved by omikuji.
//! * [`data`] — points as a stream of batches (XC repository text, svmlight, CSR).
//! * [`beam`] — the scoring arithmetic of one (level chunk, batch) step.
//! * [`predict`] — the search as scheduler tasks, several batches in flight.
//! * [`metrics`] — precision@k and nDCG@k.

pub mod beam;
pub mod data;
pub mod format;
pub mod metrics;
pub mod omikuji;
pub mod predict;

pub use data::{push_csr_rows, Batch, CsrBatches, FlashCsrBatches, TextReader};
pub use format::{Loss, ModelInfo, ModelWriter, NodeKind, NodeSpec, Weights};
pub use metrics::RankingMetrics;
pub use omikuji::{import_omikuji, ImportSummary};
pub use predict::{predict, PredictOptions, PredictProgress, PredictStats};
