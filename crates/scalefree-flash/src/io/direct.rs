//! Sector-aligned positional IO on a [`FlashFile`]: O_DIRECT when the file was opened that
//! way (bounce buffers for unaligned ends, read-modify-write of edge sectors under a
//! write-range lock), plain `pread`/`pwrite` otherwise.

use super::aligned_buffer::{align_down, align_up, AlignedBuf, SECTOR_BYTES};
use crate::error::{FlashError, Result};
use crate::file::FlashFile;

/// Reads `dst.len()` bytes at `offset` with `pread`, zero-filling anything past end of file.
/// With O_DIRECT, `offset`, `dst.len()` and `dst`'s address must be sector-aligned.
fn pread_full(file: &FlashFile, offset: u64, dst: &mut [u8]) -> Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let rest = &mut dst[done..];
        // SAFETY: `rest` is a valid writable buffer of `rest.len()` bytes.
        let got = unsafe { libc::pread(file.raw_fd(), rest.as_mut_ptr().cast(), rest.len(), (offset + done as u64) as libc::off_t) };
        if got < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(FlashError::io(file.path(), err));
        }
        if got == 0 {
            rest.fill(0);
            break;
        }
        done += got as usize;
    }
    Ok(())
}

/// Writes all of `src` at `offset` with `pwrite`.
fn pwrite_full(file: &FlashFile, offset: u64, src: &[u8]) -> Result<()> {
    let mut done = 0usize;
    while done < src.len() {
        let rest = &src[done..];
        // SAFETY: `rest` is a valid readable buffer of `rest.len()` bytes.
        let put = unsafe { libc::pwrite(file.raw_fd(), rest.as_ptr().cast(), rest.len(), (offset + done as u64) as libc::off_t) };
        if put < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(FlashError::io(file.path(), err));
        }
        if put == 0 {
            return Err(FlashError::io(file.path(), std::io::Error::new(std::io::ErrorKind::WriteZero, "pwrite wrote nothing")));
        }
        done += put as usize;
    }
    Ok(())
}

fn is_aligned_ptr(ptr: *const u8) -> bool {
    (ptr as usize).is_multiple_of(SECTOR_BYTES)
}

/// Reads `dst.len()` bytes at byte `offset` (any alignment), at most `chunk_bytes` per
/// system call. `bounce` is reused scratch for unaligned pieces.
pub fn read_span(file: &FlashFile, offset: u64, dst: &mut [u8], bounce: &mut AlignedBuf, chunk_bytes: usize) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    if !file.is_direct() {
        return pread_full(file, offset, dst);
    }
    let chunk_bytes = (align_down(chunk_bytes as u64) as usize).max(SECTOR_BYTES);
    let end = offset + dst.len() as u64;
    let mut aligned_pos = align_down(offset);
    let aligned_end = align_up(end);
    while aligned_pos < aligned_end {
        let piece_end = (aligned_pos + chunk_bytes as u64).min(aligned_end);
        let want_start = offset.max(aligned_pos);
        let want_end = end.min(piece_end);
        let dst_part = &mut dst[(want_start - offset) as usize..(want_end - offset) as usize];
        let piece_len = (piece_end - aligned_pos) as usize;
        if want_start == aligned_pos && want_end == piece_end && is_aligned_ptr(dst_part.as_ptr()) {
            pread_full(file, aligned_pos, dst_part)?;
        } else {
            bounce.ensure_len(piece_len);
            pread_full(file, aligned_pos, bounce.as_mut_slice())?;
            let from = (want_start - aligned_pos) as usize;
            dst_part.copy_from_slice(&bounce.as_slice()[from..from + dst_part.len()]);
        }
        aligned_pos = piece_end;
    }
    Ok(())
}

/// Writes `src` at byte `offset` (any alignment), at most `chunk_bytes` per system call.
/// Partially covered edge sectors are read, patched and written back while their byte range
/// is held in the file's write-range locks, so concurrent writers of neighbouring blocks that
/// share a sector are ordered.
pub fn write_span(file: &FlashFile, offset: u64, src: &[u8], bounce: &mut AlignedBuf, chunk_bytes: usize) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    if !file.is_direct() {
        return pwrite_full(file, offset, src);
    }
    let chunk_bytes = (align_down(chunk_bytes as u64) as usize).max(SECTOR_BYTES);
    let end = offset + src.len() as u64;
    let mut aligned_pos = align_down(offset);
    let aligned_end = align_up(end);
    while aligned_pos < aligned_end {
        let piece_end = (aligned_pos + chunk_bytes as u64).min(aligned_end);
        let have_start = offset.max(aligned_pos);
        let have_end = end.min(piece_end);
        let src_part = &src[(have_start - offset) as usize..(have_end - offset) as usize];
        let head_partial = have_start > aligned_pos;
        let tail_partial = have_end < piece_end;
        if !head_partial && !tail_partial && is_aligned_ptr(src_part.as_ptr()) {
            pwrite_full(file, aligned_pos, src_part)?;
        } else {
            let piece_len = (piece_end - aligned_pos) as usize;
            bounce.ensure_len(piece_len);
            // Hold only the edge sectors this piece shares with other writers.
            let lock_start = if head_partial { aligned_pos } else { align_down(have_end) };
            let lock_end = if tail_partial { piece_end } else { aligned_pos + SECTOR_BYTES as u64 };
            let _guard = (head_partial || tail_partial).then(|| file.write_locks().lock(lock_start, lock_end));
            let buf = bounce.as_mut_slice();
            if head_partial {
                pread_full(file, aligned_pos, &mut buf[..SECTOR_BYTES])?;
            }
            if tail_partial && (piece_len > SECTOR_BYTES || !head_partial) {
                let last = piece_len - SECTOR_BYTES;
                pread_full(file, aligned_pos + last as u64, &mut buf[last..])?;
            }
            let from = (have_start - aligned_pos) as usize;
            buf[from..from + src_part.len()].copy_from_slice(src_part);
            pwrite_full(file, aligned_pos, buf)?;
            file.trim_past_end(piece_end)?;
        }
        aligned_pos = piece_end;
    }
    Ok(())
}

/// Read-modify-writes the sector-aligned span `[aligned_start, aligned_end)` as one unit:
/// reads it whole, lets `patch` overwrite the bytes it owns, writes it back, holding the
/// span's write-range lock throughout. Used for several short strides merged into one IO.
pub fn patch_span(file: &FlashFile, aligned_start: u64, aligned_end: u64, bounce: &mut AlignedBuf, patch: impl FnOnce(&mut [u8])) -> Result<()> {
    debug_assert!(aligned_start.is_multiple_of(SECTOR_BYTES as u64) && aligned_end.is_multiple_of(SECTOR_BYTES as u64));
    let len = (aligned_end - aligned_start) as usize;
    bounce.ensure_len(len);
    let _guard = file.write_locks().lock(aligned_start, aligned_end);
    let buf = bounce.as_mut_slice();
    pread_full(file, aligned_start, buf)?;
    patch(buf);
    pwrite_full(file, aligned_start, buf)?;
    file.trim_past_end(aligned_end)
}

/// Reads the sector-aligned span `[aligned_start, aligned_end)` into `bounce` whole.
pub fn read_aligned(file: &FlashFile, aligned_start: u64, aligned_end: u64, bounce: &mut AlignedBuf) -> Result<()> {
    let len = (aligned_end - aligned_start) as usize;
    bounce.ensure_len(len);
    pread_full(file, aligned_start, bounce.as_mut_slice())
}
