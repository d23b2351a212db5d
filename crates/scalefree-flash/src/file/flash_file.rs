//! [`FlashFile`]: one file the runtime reads and writes with positional, sector-aligned IO.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{FlashError, Result};
use crate::io::aligned_buffer::{align_up, AlignedBuf};
use crate::io::direct;
use crate::io::write_locks::WriteRangeLocks;

/// Unique identity of an open [`FlashFile`] within the process; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(u64);

static NEXT_FILE_ID: AtomicU64 = AtomicU64::new(1);

/// How an existing file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Reads only; writes fail with `InvalidArgument`.
    ReadOnly,
    /// Reads and writes in place.
    ReadWrite,
}

/// Whether the file bypasses the page cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT: sector-aligned IO straight to the device.
    Direct,
    /// Buffered IO through the page cache, with the reason O_DIRECT was not used
    /// (e.g. the filesystem, such as tmpfs, refused it, or it was turned off).
    Buffered {
        /// Why O_DIRECT is not in use.
        reason: String,
    },
}

/// Options for creating or opening a [`FlashFile`].
#[derive(Clone, Debug)]
pub struct FileOptions {
    /// Try O_DIRECT first (default `true`); fall back to buffered IO if the open fails.
    pub direct_io: bool,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions { direct_io: true }
    }
}

/// The directory scratch files go to: `SCALEFREE_FLASH_DIR` if set, else the system
/// temporary directory.
pub fn default_scratch_dir() -> PathBuf {
    std::env::var_os("SCALEFREE_FLASH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir)
}

enum Lifecycle {
    /// Scratch or existing file: nothing to do on drop (unless `delete_on_drop`).
    Plain { delete_on_drop: Option<PathBuf> },
    /// Created for the user; invisible until [`FlashFile::publish`].
    Unpublished { target: PathBuf, named_temp: Option<PathBuf> },
    /// Published.
    Published,
}

/// A file on flash. Scratch files are unlinked at creation (`O_TMPFILE` where supported), so
/// neither a drop nor a crash leaves anything behind. Files created for the user with
/// [`FlashFile::create_atomic`] appear at their path only when [`FlashFile::publish`] has
/// synced them, so an interrupted write never leaves a half-written file at that path.
pub struct FlashFile {
    id: FileId,
    path: PathBuf,
    fd: OwnedFd,
    io_mode: IoMode,
    writable: bool,
    len_bytes: u64,
    /// Writes of whole sectors past this size are trimmed back (files whose length is not a
    /// whole number of sectors); `None` for scratch files, whose size is already rounded.
    trim_to_bytes: Option<u64>,
    write_locks: WriteRangeLocks,
    lifecycle: Mutex<Lifecycle>,
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| FlashError::invalid(format!("path {} contains a NUL byte", path.display())))
}

fn open_raw(path: &Path, flags: libc::c_int, mode: libc::mode_t) -> std::io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        // SAFETY: `fd` was just returned by open and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// Opens with O_DIRECT if asked and allowed, else buffered; reports which.
fn open_maybe_direct(path: &Path, flags: libc::c_int, mode: libc::mode_t, options: &FileOptions) -> std::io::Result<(OwnedFd, IoMode)> {
    if !options.direct_io {
        return open_raw(path, flags, mode).map(|fd| (fd, IoMode::Buffered { reason: "direct IO turned off in the options".into() }));
    }
    match open_raw(path, flags | libc::O_DIRECT, mode) {
        Ok(fd) => Ok((fd, IoMode::Direct)),
        Err(direct_err) if direct_err.raw_os_error() == Some(libc::EINVAL) => {
            let fd = open_raw(path, flags, mode)?;
            Ok((fd, IoMode::Buffered { reason: format!("the filesystem refused O_DIRECT ({direct_err})") }))
        }
        Err(err) => Err(err),
    }
}

fn set_len(fd: RawFd, path: &Path, len_bytes: u64) -> Result<()> {
    // SAFETY: plain syscall on an owned descriptor.
    if unsafe { libc::ftruncate(fd, len_bytes as libc::off_t) } != 0 {
        return Err(FlashError::io(path, std::io::Error::last_os_error()));
    }
    Ok(())
}

fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Creates an unnamed file in `dir` (O_TMPFILE), or a named one that is unlinked at once.
/// Returns the descriptor, IO mode, and a path to delete on drop if unlinking failed.
fn create_unnamed(dir: &Path, options: &FileOptions) -> Result<(OwnedFd, IoMode, PathBuf, Option<PathBuf>)> {
    match open_maybe_direct(dir, libc::O_TMPFILE | libc::O_RDWR, 0o600, options) {
        Ok((fd, mode)) => return Ok((fd, mode, dir.join("(unnamed scratch file)"), None)),
        Err(err) if matches!(err.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)) => {}
        Err(err) => return Err(FlashError::io(dir, err)),
    }
    let path = dir.join(format!(".scalefree-scratch-{}", unique_suffix()));
    let (fd, mode) = open_maybe_direct(&path, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600, options).map_err(|e| FlashError::io(&path, e))?;
    let delete_on_drop = match std::fs::remove_file(&path) {
        Ok(()) => None,
        Err(_) => Some(path.clone()),
    };
    Ok((fd, mode, path, delete_on_drop))
}

impl FlashFile {
    /// Creates a zero-filled scratch file of `len_bytes` in `dir` (see [`default_scratch_dir`]).
    pub fn scratch(dir: &Path, len_bytes: u64, options: &FileOptions) -> Result<Arc<FlashFile>> {
        let (fd, io_mode, path, delete_on_drop) = create_unnamed(dir, options)?;
        set_len(fd.as_raw_fd(), &path, align_up(len_bytes))?;
        Ok(Arc::new(FlashFile::assemble(fd, path, io_mode, true, len_bytes, None, Lifecycle::Plain { delete_on_drop })))
    }

    /// Opens an existing file. Its length is taken from the file system.
    pub fn open(path: &Path, mode: OpenMode, options: &FileOptions) -> Result<Arc<FlashFile>> {
        let flags = match mode {
            OpenMode::ReadOnly => libc::O_RDONLY,
            OpenMode::ReadWrite => libc::O_RDWR,
        };
        let (fd, io_mode) = open_maybe_direct(path, flags, 0, options).map_err(|e| FlashError::io(path, e))?;
        let len_bytes = std::fs::metadata(path).map_err(|e| FlashError::io(path, e))?.len();
        let file = FlashFile::assemble(fd, path.to_path_buf(), io_mode, mode == OpenMode::ReadWrite, len_bytes, Some(len_bytes), Lifecycle::Plain { delete_on_drop: None });
        Ok(Arc::new(file))
    }

    /// Creates a zero-filled file of `len_bytes` that becomes visible at `path` only when
    /// [`FlashFile::publish`] is called (after it has been synced). Dropped unpublished, it
    /// leaves nothing behind (on Linux even a crash leaves nothing: it is an O_TMPFILE).
    pub fn create_atomic(path: &Path, len_bytes: u64, options: &FileOptions) -> Result<Arc<FlashFile>> {
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if path.file_name().is_none() {
            return Err(FlashError::invalid(format!("{} names no file", path.display())));
        }
        let (fd, io_mode, named_temp) = match open_maybe_direct(&dir, libc::O_TMPFILE | libc::O_RDWR, 0o644, options) {
            Ok((fd, mode)) => (fd, mode, None),
            Err(err) if matches!(err.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)) => {
                let temp = dir.join(format!(".{}.tmp-{}", path.file_name().unwrap_or_default().to_string_lossy(), unique_suffix()));
                let (fd, mode) = open_maybe_direct(&temp, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644, options).map_err(|e| FlashError::io(&temp, e))?;
                (fd, mode, Some(temp))
            }
            Err(err) => return Err(FlashError::io(&dir, err)),
        };
        set_len(fd.as_raw_fd(), path, len_bytes)?;
        let lifecycle = Lifecycle::Unpublished { target: path.to_path_buf(), named_temp };
        Ok(Arc::new(FlashFile::assemble(fd, path.to_path_buf(), io_mode, true, len_bytes, Some(len_bytes), lifecycle)))
    }

    fn assemble(fd: OwnedFd, path: PathBuf, io_mode: IoMode, writable: bool, len_bytes: u64, trim_to_bytes: Option<u64>, lifecycle: Lifecycle) -> FlashFile {
        FlashFile {
            id: FileId(NEXT_FILE_ID.fetch_add(1, Ordering::Relaxed)),
            path,
            fd,
            io_mode,
            writable,
            len_bytes,
            trim_to_bytes,
            write_locks: WriteRangeLocks::default(),
            lifecycle: Mutex::new(lifecycle),
        }
    }

    /// Syncs the data and makes a file from [`FlashFile::create_atomic`] appear at its path,
    /// replacing any file there in one rename. Idempotent; a no-op for other files.
    pub fn publish(&self) -> Result<()> {
        let mut lifecycle = self.lifecycle.lock().expect("file lifecycle lock poisoned");
        let Lifecycle::Unpublished { target, named_temp } = &*lifecycle else {
            return Ok(());
        };
        self.sync()?;
        let (target, named_temp) = (target.clone(), named_temp.clone());
        let temp = match named_temp {
            Some(temp) => temp,
            None => {
                let temp = target.with_file_name(format!(".{}.tmp-{}", target.file_name().unwrap_or_default().to_string_lossy(), unique_suffix()));
                let proc_path = c_path(Path::new(&format!("/proc/self/fd/{}", self.fd.as_raw_fd())))?;
                let temp_c = c_path(&temp)?;
                // SAFETY: valid NUL-terminated paths; AT_SYMLINK_FOLLOW links the open file.
                let rc = unsafe { libc::linkat(libc::AT_FDCWD, proc_path.as_ptr(), libc::AT_FDCWD, temp_c.as_ptr(), libc::AT_SYMLINK_FOLLOW) };
                if rc != 0 {
                    return Err(FlashError::io(&target, std::io::Error::last_os_error()));
                }
                temp
            }
        };
        if let Err(err) = std::fs::rename(&temp, &target) {
            let _ = std::fs::remove_file(&temp);
            return Err(FlashError::io(&target, err));
        }
        if let Some(dir) = target.parent() {
            let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
            if let Ok(handle) = std::fs::File::open(dir) {
                let _ = handle.sync_all();
            }
        }
        *lifecycle = Lifecycle::Published;
        Ok(())
    }

    /// Flushes written data to the device (`fdatasync`).
    pub fn sync(&self) -> Result<()> {
        // SAFETY: plain syscall on an owned descriptor.
        if unsafe { libc::fdatasync(self.fd.as_raw_fd()) } != 0 {
            return Err(FlashError::io(&self.path, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Reads `dst.len()` bytes starting at byte `offset`.
    pub fn read_bytes(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len() as u64)?;
        let mut bounce = AlignedBuf::zeroed(0);
        direct::read_span(self, offset, dst, &mut bounce, SYNC_CHUNK_BYTES)
    }

    /// Writes `src` starting at byte `offset`.
    pub fn write_bytes(&self, offset: u64, src: &[u8]) -> Result<()> {
        self.check_writable()?;
        self.check_range(offset, src.len() as u64)?;
        let mut bounce = AlignedBuf::zeroed(0);
        direct::write_span(self, offset, src, &mut bounce, SYNC_CHUNK_BYTES)
    }

    pub(crate) fn check_range(&self, offset: u64, len_bytes: u64) -> Result<()> {
        match offset.checked_add(len_bytes) {
            Some(end) if end <= self.len_bytes => Ok(()),
            _ => Err(FlashError::invalid(format!(
                "bytes {offset}..{} are outside {} ({} bytes)",
                offset.saturating_add(len_bytes),
                self.path.display(),
                self.len_bytes
            ))),
        }
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(FlashError::invalid(format!("{} was opened read-only", self.path.display())))
        }
    }

    /// Trims the file back to its logical length after a sector-rounded write past it.
    pub(crate) fn trim_past_end(&self, written_end: u64) -> Result<()> {
        match self.trim_to_bytes {
            Some(len) if written_end > len => set_len(self.fd.as_raw_fd(), &self.path, len),
            _ => Ok(()),
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub(crate) fn write_locks(&self) -> &WriteRangeLocks {
        &self.write_locks
    }

    /// Unique identity (part of every access specifier's key).
    pub fn id(&self) -> FileId {
        self.id
    }

    /// The path (for scratch files: the directory and a placeholder name).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Logical length in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// True when the file can be written.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// O_DIRECT or buffered, and why.
    pub fn io_mode(&self) -> &IoMode {
        &self.io_mode
    }

    /// True when the file bypasses the page cache.
    pub fn is_direct(&self) -> bool {
        self.io_mode == IoMode::Direct
    }
}

/// Bytes per system call for the synchronous `read_bytes` / `write_bytes`.
const SYNC_CHUNK_BYTES: usize = 8 << 20;

impl Drop for FlashFile {
    fn drop(&mut self) {
        let lifecycle = match self.lifecycle.get_mut() {
            Ok(state) => std::mem::replace(state, Lifecycle::Published),
            Err(_) => return,
        };
        match lifecycle {
            Lifecycle::Plain { delete_on_drop: Some(path) } => {
                let _ = std::fs::remove_file(path);
            }
            Lifecycle::Unpublished { named_temp: Some(temp), .. } => {
                let _ = std::fs::remove_file(temp);
            }
            _ => {}
        }
    }
}

impl std::fmt::Debug for FlashFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlashFile").field("path", &self.path).field("len_bytes", &self.len_bytes).field("io_mode", &self.io_mode).finish()
    }
}
