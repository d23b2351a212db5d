//! Flash arrays: files, typed pointers, dense and CSR matrices on flash.

pub mod csr_matrix;
pub mod dense_matrix;
pub mod flash_file;
pub mod flash_ptr;
pub mod text_matrix;

pub use csr_matrix::{FlashCsrMatrix, FlashIndices};
pub use dense_matrix::FlashMatrix;
pub use flash_file::{default_scratch_dir, FileId, FileOptions, FlashFile, IoMode, OpenMode};
pub use flash_ptr::FlashPtr;
pub use text_matrix::{docword_input_to_flash, docword_to_flash, read_docword, read_docword_input, FlashDocword, read_matrix_market, TextMatrix, DOCWORD_CHUNK_ENTRIES};
