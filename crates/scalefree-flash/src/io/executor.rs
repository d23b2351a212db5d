//! The IO executor: a pool of threads doing positional reads and writes for access
//! specifiers. A request is split into jobs of about `chunk_bytes` that run in parallel;
//! completion is reported through a callback (the scheduler's event channel) or an
//! [`IoTicket`] — no polling. Writes that share sectors are ordered by the file's
//! write-range locks (see [`crate::io::write_locks`]).

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::access::AccessSpec;
use super::aligned_buffer::{align_down, align_up, AlignedBuf, SECTOR_BYTES};
use super::direct;
use crate::error::{FlashError, Result};

/// Options of the IO executor.
#[derive(Clone, Debug)]
pub struct IoOptions {
    /// Threads doing IO (default 4: IO threads mostly wait on the device).
    pub threads: usize,
    /// Bytes per job and per system call (default 4 MiB).
    pub chunk_bytes: usize,
    /// Reads of strides separated by gaps up to this many bytes are merged into one read of
    /// the whole span (default 16 KiB; at most doubles the bytes read for short strides).
    pub read_merge_gap_bytes: u64,
    /// A request is split across the IO threads into jobs of at least this many bytes
    /// (default one sector: a request of a few pages still keeps every thread busy). A consumer
    /// that keeps many requests in flight (the program cache's prefetch of small blocks) sets
    /// it to `chunk_bytes`: each request is then one system call, and the queue of requests,
    /// not the split of one, keeps the threads busy.
    pub min_job_bytes: usize,
}

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions { threads: 4, chunk_bytes: 4 << 20, read_merge_gap_bytes: 16 << 10, min_job_bytes: SECTOR_BYTES }
    }
}

/// Read from flash into the buffer, or write the buffer to flash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoDirection {
    /// File to buffer.
    Read,
    /// Buffer to file.
    Write,
}

/// Counters of completed IO.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Bytes of access specifiers read.
    pub bytes_read: u64,
    /// Bytes of access specifiers written.
    pub bytes_written: u64,
    /// Requests completed.
    pub requests: u64,
}

type Callback = Box<dyn FnOnce(Result<()>, AlignedBuf) + Send>;

/// One contiguous piece: `len` bytes at `file_offset`, at `buf_offset` in the packed buffer.
#[derive(Clone, Copy, Debug)]
struct Piece {
    file_offset: u64,
    buf_offset: usize,
    len: usize,
}

enum Job {
    /// Pieces done one by one (each handles its own alignment).
    Pieces(Vec<Piece>),
    /// Several strides read or read-modify-written as one aligned span.
    Span { aligned_start: u64, aligned_end: u64, pieces: Vec<Piece> },
}

struct Request {
    direction: IoDirection,
    spec: AccessSpec,
    buffer_ptr: *mut u8,
    buffer: UnsafeCell<Option<AlignedBuf>>,
    remaining_jobs: AtomicUsize,
    first_error: Mutex<Option<FlashError>>,
    on_done: Mutex<Option<Callback>>,
}

// SAFETY: jobs of one request touch disjoint byte ranges of the buffer through
// `buffer_ptr`; the buffer itself is taken out only by the job that finishes last.
unsafe impl Send for Request {}
// SAFETY: as above.
unsafe impl Sync for Request {}

struct QueuedJob {
    request: Arc<Request>,
    job: Job,
}

struct Queue {
    jobs: VecDeque<QueuedJob>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    job_ready: Condvar,
    options: IoOptions,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    requests: AtomicU64,
}

/// Waits for one request submitted with [`IoExecutor::submit`].
pub struct IoTicket {
    receiver: mpsc::Receiver<(Result<()>, AlignedBuf)>,
}

impl IoTicket {
    /// Blocks until the request completes; returns its result and the buffer.
    pub fn wait(self) -> (Result<()>, AlignedBuf) {
        self.receiver.recv().expect("IO executor dropped a request without completing it")
    }
}

/// A thread pool doing the IO of access specifiers.
pub struct IoExecutor {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl IoExecutor {
    /// Starts `options.threads` IO threads (at least one).
    pub fn new(options: IoOptions) -> IoExecutor {
        let threads = options.threads.max(1);
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue { jobs: VecDeque::new(), shutdown: false }),
            job_ready: Condvar::new(),
            options: IoOptions { chunk_bytes: (align_down(options.chunk_bytes as u64) as usize).max(SECTOR_BYTES), ..options },
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            requests: AtomicU64::new(0),
        });
        let threads = (0..threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new().name(format!("flash-io-{i}")).spawn(move || worker(shared)).expect("spawning an IO thread")
            })
            .collect();
        IoExecutor { shared, threads }
    }

    /// Options in force.
    pub fn options(&self) -> &IoOptions {
        &self.shared.options
    }

    /// Counters of completed IO.
    pub fn stats(&self) -> IoStats {
        IoStats {
            bytes_read: self.shared.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.shared.bytes_written.load(Ordering::Relaxed),
            requests: self.shared.requests.load(Ordering::Relaxed),
        }
    }

    /// Starts reading `spec` into `buffer` (packed) or writing `buffer` to `spec`;
    /// `on_done` runs on an IO thread with the result and the buffer.
    /// Panics if the buffer is shorter than the access (misuse).
    pub fn submit_with(&self, direction: IoDirection, spec: AccessSpec, buffer: AlignedBuf, on_done: impl FnOnce(Result<()>, AlignedBuf) + Send + 'static) {
        assert!(buffer.len() as u64 >= spec.size_bytes(), "buffer of {} bytes for an access of {} bytes", buffer.len(), spec.size_bytes());
        if direction == IoDirection::Write {
            if let Err(err) = spec.file().check_writable() {
                on_done(Err(err), buffer);
                return;
            }
        }
        let jobs = plan(direction, &spec, &self.shared.options);
        if jobs.is_empty() {
            self.shared.requests.fetch_add(1, Ordering::Relaxed);
            on_done(Ok(()), buffer);
            return;
        }
        let buffer_ptr = buffer.as_mut_ptr();
        let request = Arc::new(Request {
            direction,
            spec,
            buffer_ptr,
            buffer: UnsafeCell::new(Some(buffer)),
            remaining_jobs: AtomicUsize::new(jobs.len()),
            first_error: Mutex::new(None),
            on_done: Mutex::new(Some(Box::new(on_done))),
        });
        let n_jobs = jobs.len();
        let mut queue = self.shared.queue.lock().expect("IO queue poisoned");
        queue.jobs.extend(jobs.into_iter().map(|job| QueuedJob { request: request.clone(), job }));
        drop(queue);
        // One job wakes one thread: waking them all for it (a prefetch of small blocks submits
        // one job per block) costs every idle IO thread a context switch per read.
        if n_jobs == 1 {
            self.shared.job_ready.notify_one();
        } else {
            self.shared.job_ready.notify_all();
        }
    }

    /// Like [`IoExecutor::submit_with`], returning a ticket to wait on.
    pub fn submit(&self, direction: IoDirection, spec: AccessSpec, buffer: AlignedBuf) -> IoTicket {
        let (sender, receiver) = mpsc::sync_channel(1);
        self.submit_with(direction, spec, buffer, move |result, buffer| {
            let _ = sender.send((result, buffer));
        });
        IoTicket { receiver }
    }

    /// Reads `spec` into a new packed buffer and waits.
    pub fn read(&self, spec: &AccessSpec) -> Result<AlignedBuf> {
        let buffer = AlignedBuf::zeroed(spec.size_bytes() as usize);
        let (result, buffer) = self.submit(IoDirection::Read, spec.clone(), buffer).wait();
        result.map(|()| buffer)
    }

    /// Writes a packed buffer to `spec` and waits; hands the buffer back.
    pub fn write(&self, spec: &AccessSpec, buffer: AlignedBuf) -> (Result<()>, AlignedBuf) {
        self.submit(IoDirection::Write, spec.clone(), buffer).wait()
    }
}

impl Drop for IoExecutor {
    fn drop(&mut self) {
        self.shared.queue.lock().expect("IO queue poisoned").shutdown = true;
        self.shared.job_ready.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Splits an access into jobs of about `chunk_bytes`.
fn plan(direction: IoDirection, spec: &AccessSpec, options: &IoOptions) -> Vec<Job> {
    let (n, len, stride) = (spec.n_strides(), spec.stride_len_bytes(), spec.stride_bytes());
    // Jobs of at most `chunk_bytes`, and small enough that every IO thread gets one.
    let floor = (options.min_job_bytes as u64).clamp(SECTOR_BYTES as u64, options.chunk_bytes as u64);
    let chunk = (spec.size_bytes() / options.threads.max(1) as u64).clamp(floor, options.chunk_bytes as u64);
    let mut jobs = Vec::new();
    if n == 0 || len == 0 {
        return jobs;
    }
    let gap = stride - len;
    // Merged reads fetch the gaps too; many small direct reads cost more than that here.
    let merge = n > 1
        && match direction {
            IoDirection::Read => gap <= options.read_merge_gap_bytes,
            // Buffered files write exact bytes, so only direct files merge (read-modify-write).
            IoDirection::Write => gap < SECTOR_BYTES as u64 && spec.file().is_direct(),
        };
    let piece = |i: u64| Piece { file_offset: spec.run_offset(i), buf_offset: (i * len) as usize, len: len as usize };
    if merge && stride <= options.chunk_bytes as u64 {
        let per_job = (chunk / stride).max(1);
        let mut first = 0;
        while first < n {
            let last = (first + per_job).min(n);
            let pieces: Vec<Piece> = (first..last).map(piece).collect();
            let aligned_start = align_down(spec.run_offset(first));
            let aligned_end = align_up(spec.run_offset(last - 1) + len);
            jobs.push(Job::Span { aligned_start, aligned_end, pieces });
            first = last;
        }
        return jobs;
    }
    // Pieces of at most `chunk` bytes, split at sector-aligned file offsets; short strides
    // are batched so that a job carries about `chunk` bytes.
    let mut batch = Vec::new();
    let mut batch_bytes = 0u64;
    for i in 0..n {
        let whole = piece(i);
        let mut done = 0u64;
        while done < len {
            let file_offset = whole.file_offset + done;
            let cut = align_down(file_offset + chunk).max(file_offset + 1);
            let take = (cut - file_offset).min(len - done);
            batch.push(Piece { file_offset, buf_offset: whole.buf_offset + done as usize, len: take as usize });
            batch_bytes += take;
            done += take;
            if batch_bytes >= chunk {
                jobs.push(Job::Pieces(std::mem::take(&mut batch)));
                batch_bytes = 0;
            }
        }
    }
    if !batch.is_empty() {
        jobs.push(Job::Pieces(batch));
    }
    jobs
}

fn worker(shared: Arc<Shared>) {
    let mut bounce = AlignedBuf::zeroed(0);
    loop {
        let queued = {
            let mut queue = shared.queue.lock().expect("IO queue poisoned");
            loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break job;
                }
                if queue.shutdown {
                    return;
                }
                queue = shared.job_ready.wait(queue).expect("IO queue poisoned");
            }
        };
        let request = queued.request;
        let result = run_job(&request, &queued.job, &mut bounce, shared.options.chunk_bytes);
        if let Err(err) = result {
            let mut first = request.first_error.lock().expect("IO error slot poisoned");
            first.get_or_insert(err);
        }
        if request.remaining_jobs.fetch_sub(1, Ordering::AcqRel) == 1 {
            // SAFETY: every other job of this request has finished (the counter reached zero
            // with acquire-release ordering), so nothing else touches the buffer.
            let buffer = unsafe { (*request.buffer.get()).take() }.expect("buffer taken twice");
            let error = request.first_error.lock().expect("IO error slot poisoned").take();
            let counter = match request.direction {
                IoDirection::Read => &shared.bytes_read,
                IoDirection::Write => &shared.bytes_written,
            };
            if error.is_none() {
                counter.fetch_add(request.spec.size_bytes(), Ordering::Relaxed);
            }
            shared.requests.fetch_add(1, Ordering::Relaxed);
            let callback = request.on_done.lock().expect("IO callback poisoned").take().expect("callback taken twice");
            callback(error.map_or(Ok(()), Err), buffer);
        }
    }
}

/// The bytes of the request's buffer covered by `piece`.
///
/// # Safety
/// Pieces of concurrently running jobs of one request must be disjoint (the planner makes
/// them so) and the buffer must outlive the call (it is freed only after the last job).
#[allow(clippy::mut_from_ref)]
unsafe fn piece_bytes<'a>(request: &'a Request, piece: &Piece) -> &'a mut [u8] {
    // SAFETY: per the function contract.
    unsafe { std::slice::from_raw_parts_mut(request.buffer_ptr.add(piece.buf_offset), piece.len) }
}

fn run_job(request: &Request, job: &Job, bounce: &mut AlignedBuf, chunk_bytes: usize) -> Result<()> {
    let file = request.spec.file();
    match (job, request.direction) {
        (Job::Pieces(pieces), IoDirection::Read) => pieces.iter().try_for_each(|p| {
            // SAFETY: pieces are disjoint parts of the buffer (see `piece_bytes`).
            let dst = unsafe { piece_bytes(request, p) };
            direct::read_span(file, p.file_offset, dst, bounce, chunk_bytes)
        }),
        (Job::Pieces(pieces), IoDirection::Write) => pieces.iter().try_for_each(|p| {
            // SAFETY: as above; the buffer is only read.
            let src = unsafe { piece_bytes(request, p) };
            direct::write_span(file, p.file_offset, src, bounce, chunk_bytes)
        }),
        (Job::Span { aligned_start, aligned_end, pieces }, IoDirection::Read) => {
            direct::read_aligned(file, *aligned_start, *aligned_end, bounce)?;
            for p in pieces {
                let from = (p.file_offset - aligned_start) as usize;
                // SAFETY: as above.
                unsafe { piece_bytes(request, p) }.copy_from_slice(&bounce.as_slice()[from..from + p.len]);
            }
            Ok(())
        }
        (Job::Span { aligned_start, aligned_end, pieces }, IoDirection::Write) => direct::patch_span(file, *aligned_start, *aligned_end, bounce, |span| {
            for p in pieces {
                let from = (p.file_offset - aligned_start) as usize;
                // SAFETY: as above; the buffer is only read.
                span[from..from + p.len].copy_from_slice(unsafe { piece_bytes(request, p) });
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::{FileOptions, FlashFile};

    /// A small deterministic generator for test data.
    fn bytes(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn buffer_from(data: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(data.len());
        buf.as_mut_slice().copy_from_slice(data);
        buf
    }

    fn check_strided_round_trip(options: &FileOptions, io: &IoOptions) {
        let len = 300_000u64;
        let file = FlashFile::scratch(&std::env::temp_dir(), len, options).unwrap();
        let mut model = bytes(1, len as usize);
        file.write_bytes(0, &model).unwrap();
        let executor = IoExecutor::new(io.clone());
        // (offset, n, run length, stride): aligned, unaligned, short runs sharing sectors,
        // runs longer than the chunk, gaps above and below the merge threshold.
        let cases = [(0, 1, 8192, 8192), (1, 1, 4095, 4095), (4000, 10, 100, 1000), (10, 7, 5000, 12_289), (123, 3, 70_000, 90_001), (4096, 20, 4096, 4096 + 5000), (8192, 30, 4096, 8192), (777, 200, 3, 7)];
        for (seed, &(offset, n, run, stride)) in cases.iter().enumerate() {
            let spec = AccessSpec::strided(file.clone(), offset, n, run, stride).unwrap();
            let got = executor.read(&spec).unwrap();
            for i in 0..n {
                let at = (offset + i * stride) as usize;
                assert_eq!(&got.as_slice()[(i * run) as usize..((i + 1) * run) as usize], &model[at..at + run as usize], "read {offset} {n} {run} {stride} run {i}");
            }
            let new = bytes(100 + seed as u64, (n * run) as usize);
            let (result, _) = executor.write(&spec, buffer_from(&new));
            result.unwrap();
            for i in 0..n {
                let at = (offset + i * stride) as usize;
                model[at..at + run as usize].copy_from_slice(&new[(i * run) as usize..((i + 1) * run) as usize]);
            }
            let mut back = vec![0u8; len as usize];
            file.read_bytes(0, &mut back).unwrap();
            assert!(back == model, "file differs from the model after writing {offset} {n} {run} {stride}");
        }
        assert!(executor.stats().requests >= 2 * cases.len() as u64);
    }

    #[test]
    fn strided_unaligned_round_trips_direct() {
        check_strided_round_trip(&FileOptions::default(), &IoOptions { threads: 3, chunk_bytes: 16 << 10, read_merge_gap_bytes: 16 << 10, min_job_bytes: SECTOR_BYTES });
    }

    #[test]
    fn strided_unaligned_round_trips_buffered_and_unmerged() {
        check_strided_round_trip(&FileOptions { direct_io: false }, &IoOptions { threads: 2, chunk_bytes: 8 << 10, read_merge_gap_bytes: 0, min_job_bytes: SECTOR_BYTES });
        check_strided_round_trip(&FileOptions::default(), &IoOptions { threads: 2, chunk_bytes: 1 << 20, read_merge_gap_bytes: 0, min_job_bytes: 1 << 20 });
    }

    #[test]
    fn min_job_bytes_keeps_a_small_request_in_one_read() {
        let file = FlashFile::scratch(&std::env::temp_dir(), 1 << 20, &FileOptions::default()).unwrap();
        let spec = AccessSpec::contiguous(file, 4096, 56 << 10).unwrap();
        let split = IoOptions::default();
        assert!(plan(IoDirection::Read, &spec, &split).len() > 1, "by default a request is split across the threads");
        let whole = IoOptions { min_job_bytes: split.chunk_bytes, ..IoOptions::default() };
        assert_eq!(plan(IoDirection::Read, &spec, &whole).len(), 1);
        let big = AccessSpec::contiguous(spec.file().clone(), 0, 1 << 20).unwrap();
        let small_chunks = IoOptions { chunk_bytes: 256 << 10, min_job_bytes: 4 << 20, ..IoOptions::default() };
        assert_eq!(plan(IoDirection::Read, &big, &small_chunks).len(), 4, "jobs stay at most chunk_bytes");
    }

    #[test]
    fn concurrent_writes_sharing_sectors_keep_every_byte() {
        // A row-major 64 x 1001-byte "matrix" cut into column blocks of odd widths: every
        // row's blocks share sectors with their neighbours. All blocks are written at once.
        let (rows, row_bytes) = (64u64, 1001u64);
        let widths = [1u64, 250, 3, 400, 97, 250];
        assert_eq!(widths.iter().sum::<u64>(), row_bytes);
        for round in 0..3 {
            let file = FlashFile::scratch(&std::env::temp_dir(), rows * row_bytes, &FileOptions::default()).unwrap();
            let executor = IoExecutor::new(IoOptions { threads: 4, chunk_bytes: 4096, read_merge_gap_bytes: 0, min_job_bytes: SECTOR_BYTES });
            let mut expected = vec![0u8; (rows * row_bytes) as usize];
            let mut tickets = Vec::new();
            let mut col = 0;
            for (b, &w) in widths.iter().enumerate() {
                let spec = AccessSpec::strided(file.clone(), col, rows, w, row_bytes).unwrap();
                let data = bytes(round * 10 + b as u64, (rows * w) as usize);
                for r in 0..rows {
                    let at = (r * row_bytes + col) as usize;
                    expected[at..at + w as usize].copy_from_slice(&data[(r * w) as usize..((r + 1) * w) as usize]);
                }
                tickets.push(executor.submit(IoDirection::Write, spec, buffer_from(&data)));
                col += w;
            }
            for ticket in tickets {
                ticket.wait().0.unwrap();
            }
            let mut back = vec![0u8; expected.len()];
            file.read_bytes(0, &mut back).unwrap();
            assert!(back == expected, "a write sharing a sector lost bytes (round {round})");
            assert_eq!(file.write_locks().held_count(), 0);
        }
    }

    #[test]
    fn errors_name_the_file_and_hand_the_buffer_back() {
        let path = std::env::temp_dir().join(format!("scalefree-flash-ro-exec-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 10_000]).unwrap();
        let file = FlashFile::open(&path, crate::file::OpenMode::ReadOnly, &FileOptions::default()).unwrap();
        let executor = IoExecutor::new(IoOptions::default());
        let spec = AccessSpec::contiguous(file, 10, 100).unwrap();
        assert!(executor.read(&spec).unwrap().as_slice().iter().all(|&b| b == 7));
        let (result, buffer) = executor.write(&spec, AlignedBuf::zeroed(100));
        assert_eq!(buffer.len(), 100);
        let err = result.unwrap_err();
        assert!(err.to_string().contains(&*path.to_string_lossy()), "{err}");
        std::fs::remove_file(&path).unwrap();
    }
}
