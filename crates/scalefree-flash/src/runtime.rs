//! [`Runtime`]: owns the IO executor, the compute pool and the options. No global state:
//! create as many runtimes as needed (each with its own budget and threads).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{FlashError, Result};
use crate::file::{default_scratch_dir, FileOptions};
use crate::io::{IoExecutor, IoOptions};
use crate::kernels::ExternalBlas;
use crate::sched::{Dag, Priority};

/// Options of a [`Runtime`]. Every tunable of the flash runtime is here.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// Hard limit on the bytes of program-cache buffers (default 1 GiB;
    /// `SCALEFREE_FLASH_MEMORY` in [`RuntimeOptions::from_env`]).
    pub memory_budget_bytes: u64,
    /// Threads computing tasks (default: the machine's parallelism).
    pub compute_threads: usize,
    /// Threads doing IO (default 4).
    pub io_threads: usize,
    /// Directory for scratch files (default `SCALEFREE_FLASH_DIR` or the system temp dir).
    pub dir: PathBuf,
    /// Try O_DIRECT for files the runtime creates (default true; falls back to buffered IO
    /// where the filesystem refuses it).
    pub direct_io: bool,
    /// How the next task to prefetch is chosen (default fewest bytes to fetch).
    pub priority: Priority,
    /// Tasks prefetching or computing at once (default `compute_threads + 2`).
    pub max_tasks_in_flight: usize,
    /// Ready tasks scored per scheduling decision (default 4096).
    pub prioritizer_window: usize,
    /// Bytes per IO job and system call (default 4 MiB).
    pub io_chunk_bytes: usize,
    /// Strides separated by at most this many bytes are read as one span (default 16 KiB).
    pub read_merge_gap_bytes: u64,
    /// A request is split across the IO threads into jobs of at least this many bytes
    /// (default one sector; see [`IoOptions::min_job_bytes`]).
    pub io_min_job_bytes: usize,
    /// Niceness added to the compute threads (default 5; 0 leaves them as they are). When the
    /// compute threads use every core, IO threads and the scheduler — which only wake up to
    /// start the next read or task — otherwise wait milliseconds for a core, and prefetches
    /// finish late. Raising niceness needs no privileges.
    pub compute_niceness: i32,
    /// A CBLAS library (path for `dlopen`) for the dense blocks of gemm, e.g. the OpenBLAS
    /// numpy ships (default none: faer; `SCALEFREE_FLASH_BLAS` in [`RuntimeOptions::from_env`]).
    pub blas_library: Option<PathBuf>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        let compute_threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let io = IoOptions::default();
        RuntimeOptions {
            memory_budget_bytes: 1 << 30,
            compute_threads,
            io_threads: io.threads,
            dir: default_scratch_dir(),
            direct_io: true,
            priority: Priority::FewestBytesToFetch,
            max_tasks_in_flight: compute_threads + 2,
            prioritizer_window: 4096,
            io_chunk_bytes: io.chunk_bytes,
            read_merge_gap_bytes: io.read_merge_gap_bytes,
            io_min_job_bytes: io.min_job_bytes,
            compute_niceness: 5,
            blas_library: None,
        }
    }
}

/// Parses a byte size such as `512M`, `1G`, `1.5GiB` or `1048576`.
pub fn parse_bytes(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| FlashError::invalid(format!("cannot read {text:?} as a size in bytes")))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(FlashError::invalid(format!("unknown size unit {other:?} in {text:?}"))),
    };
    Ok((value * scale as f64) as u64)
}

impl RuntimeOptions {
    /// Defaults, overridden by `SCALEFREE_FLASH_MEMORY` (e.g. `1G`), `SCALEFREE_FLASH_THREADS`,
    /// `SCALEFREE_FLASH_IO_THREADS`, `SCALEFREE_FLASH_COMPUTE_NICENESS`, `SCALEFREE_FLASH_DIR`
    /// and `SCALEFREE_FLASH_BLAS`.
    pub fn from_env() -> Result<RuntimeOptions> {
        let mut options = RuntimeOptions::default();
        if let Ok(v) = std::env::var("SCALEFREE_FLASH_MEMORY") {
            options.memory_budget_bytes = parse_bytes(&v)?;
        }
        if let Ok(v) = std::env::var("SCALEFREE_FLASH_THREADS") {
            options.compute_threads = v.parse().map_err(|_| FlashError::invalid(format!("SCALEFREE_FLASH_THREADS={v:?} is not a number")))?;
            options.max_tasks_in_flight = options.compute_threads + 2;
        }
        if let Ok(v) = std::env::var("SCALEFREE_FLASH_COMPUTE_NICENESS") {
            options.compute_niceness = v.parse().map_err(|_| FlashError::invalid(format!("SCALEFREE_FLASH_COMPUTE_NICENESS={v:?} is not a number")))?;
        }
        if let Ok(v) = std::env::var("SCALEFREE_FLASH_IO_THREADS") {
            options.io_threads = v.parse().map_err(|_| FlashError::invalid(format!("SCALEFREE_FLASH_IO_THREADS={v:?} is not a number")))?;
        }
        if let Ok(v) = std::env::var("SCALEFREE_FLASH_BLAS") {
            options.blas_library = (!v.is_empty()).then(|| PathBuf::from(v));
        }
        Ok(options)
    }
}

/// Live counters of a runtime's kernels, readable from any thread while they run (for
/// progress bars): cumulative over the runtime's life, so a caller takes differences.
#[derive(Debug, Default)]
pub struct Progress {
    pub(crate) tasks_added: AtomicU64,
    pub(crate) tasks_completed: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
}

/// One reading of [`Progress`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressSnapshot {
    /// Tasks added to DAGs (including injected ones).
    pub tasks_added: u64,
    /// Tasks that completed.
    pub tasks_completed: u64,
    /// Bytes the program cache has read (prefetched) from flash.
    pub bytes_read: u64,
    /// Bytes written back to flash.
    pub bytes_written: u64,
}

impl Progress {
    /// The counters now.
    pub fn snapshot(&self) -> ProgressSnapshot {
        ProgressSnapshot {
            tasks_added: self.tasks_added.load(Ordering::Relaxed),
            tasks_completed: self.tasks_completed.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
        }
    }
}

/// The flash runtime: scratch directory, IO executor, compute pool, memory budget.
pub struct Runtime {
    options: RuntimeOptions,
    io: IoExecutor,
    compute_pool: rayon::ThreadPool,
    blas: Option<ExternalBlas>,
    progress: Progress,
}

impl Runtime {
    /// Starts the IO threads and the compute pool.
    pub fn new(options: RuntimeOptions) -> Result<Runtime> {
        if options.compute_threads == 0 {
            return Err(FlashError::invalid("compute_threads must be at least 1"));
        }
        if options.memory_budget_bytes == 0 {
            return Err(FlashError::invalid("memory_budget_bytes must be positive"));
        }
        if !options.dir.is_dir() {
            return Err(FlashError::Io { path: options.dir.clone(), source: std::io::Error::new(std::io::ErrorKind::NotFound, "scratch directory does not exist") });
        }
        let io = IoExecutor::new(IoOptions { threads: options.io_threads, chunk_bytes: options.io_chunk_bytes, read_merge_gap_bytes: options.read_merge_gap_bytes, min_job_bytes: options.io_min_job_bytes });
        let niceness = options.compute_niceness;
        let compute_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.compute_threads)
            .thread_name(|i| format!("flash-compute-{i}"))
            .start_handler(move |_| {
                if niceness != 0 {
                    // SAFETY: plain system calls on the calling thread; a failure only leaves
                    // the priority unchanged.
                    unsafe {
                        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                        let current = libc::getpriority(libc::PRIO_PROCESS, tid);
                        libc::setpriority(libc::PRIO_PROCESS, tid, current + niceness);
                    }
                }
            })
            .build()
            .map_err(|e| FlashError::invalid(format!("cannot start the compute pool: {e}")))?;
        let blas = options.blas_library.as_deref().map(ExternalBlas::load).transpose()?;
        Ok(Runtime { options, io, compute_pool, blas, progress: Progress::default() })
    }

    /// The options in force.
    pub fn options(&self) -> &RuntimeOptions {
        &self.options
    }

    /// File options for scratch and output files this runtime creates.
    pub fn file_options(&self) -> FileOptions {
        FileOptions { direct_io: self.options.direct_io }
    }

    /// The scratch directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.options.dir
    }

    /// A new, empty DAG to fill with tasks and [`Dag::run`].
    pub fn dag(&self) -> Dag<'_> {
        Dag::new(self)
    }

    /// The external BLAS for dense blocks, if one was given.
    pub fn blas(&self) -> Option<&ExternalBlas> {
        self.blas.as_ref()
    }

    /// Live progress counters of this runtime's kernels.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// The IO executor (also usable directly for synchronous strided IO).
    pub fn io(&self) -> &IoExecutor {
        &self.io
    }

    pub(crate) fn compute_pool(&self) -> &rayon::ThreadPool {
        &self.compute_pool
    }

    /// Runs `f` on the compute pool (so rayon and faer parallelism use its threads).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.compute_pool.install(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5k").unwrap(), 1536);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }

    #[test]
    fn bad_options_are_named() {
        let zero = RuntimeOptions { compute_threads: 0, ..RuntimeOptions::default() };
        assert!(matches!(Runtime::new(zero), Err(FlashError::InvalidArgument(_))));
        let missing = RuntimeOptions { dir: "/nonexistent/scalefree".into(), ..RuntimeOptions::default() };
        assert!(matches!(Runtime::new(missing), Err(FlashError::Io { .. })));
    }
}
