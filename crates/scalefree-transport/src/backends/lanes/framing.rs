//! A lane's frames: a 48-byte header (kind, value, region key, offset, length, note, index;
//! little-endian) and the write's bytes, sent with as few system calls as the socket allows.
//! On a sealed lane (`SCALEFREE_ENCRYPT=1`) the same frame goes as AES-GCM records (see
//! [`super::sealing`]): every sending function here takes the stream's [`Sealer`], if any.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Mutex;

use super::sealing::Sealer;

pub(super) const KIND_WRITE: u32 = 1;
pub(super) const KIND_NOTIFY: u32 = 2;
/// A fence (see [`Stripe`](super::striping::Stripe)): `index` is its number. On an extra stream it marks that every
/// write sent on that stream before it has been read; on the first stream, that the frames
/// after it wait until every extra stream has delivered that fence.
pub(super) const KIND_FENCE: u32 = 3;
/// A one-sided read (sealed lanes only, where nothing goes over UCX): `len` bytes at `offset`
/// of the receiver's region `key`, `note` bytes long, answered by a [`KIND_READ_REPLY`] with
/// the same `index`.
pub(super) const KIND_READ: u32 = 4;
/// The answer to a [`KIND_READ`]: its `index`, the bytes (`len`), `value` 1 when the region
/// is gone or too short (no bytes then).
pub(super) const KIND_READ_REPLY: u32 = 5;
/// Sealed lanes only (no UCX heartbeats to the peer): "still here", sent on an idle lane.
pub(super) const KIND_BEAT: u32 = 6;
/// Sealed lanes only: the sender closes the lane on purpose (its device is closing). A
/// sealed lane that closes without one is a lost peer (its process died, or its host).
pub(super) const KIND_BYE: u32 = 7;

/// Frame header, little-endian on the wire.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Frame {
    pub(super) kind: u32,
    pub(super) value: u32,
    pub(super) key: u64,
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) note: u64,
    pub(super) index: u64,
}
pub(super) const FRAME_LEN: usize = 48;

impl Frame {
    pub(super) fn bytes(&self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        b[0..4].copy_from_slice(&self.kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.value.to_le_bytes());
        for (i, v) in [self.key, self.offset, self.len, self.note, self.index].into_iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
    pub(super) fn parse(b: &[u8; FRAME_LEN]) -> Frame {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Frame {
            kind: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            value: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            key: u64_at(8),
            offset: u64_at(16),
            len: u64_at(24),
            note: u64_at(32),
            index: u64_at(40),
        }
    }
}

/// Sends what the socket takes now of header and data from byte `sent` of the frame on,
/// without blocking; returns how far the frame has gone (wire bytes: see
/// [`super::sealing::wire_len`]).
pub(super) fn send_now_from(s: &TcpStream, seal: Option<&Mutex<Sealer>>, frame: &Frame, data: &[u8], mut sent: usize) -> std::io::Result<usize> {
    if let Some(seal) = seal {
        return seal.lock().unwrap().send(s, frame, data, sent, false);
    }
    let hdr = frame.bytes();
    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
    let total = FRAME_LEN + data.len();
    while sent < total {
        let (a, b): (&[u8], &[u8]) = if sent < FRAME_LEN { (&hdr[sent..], data) } else { (&data[sent - FRAME_LEN..], &[]) };
        let mut iov = [libc::iovec { iov_base: a.as_ptr() as *mut libc::c_void, iov_len: a.len() },
                       libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }];
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = if b.is_empty() { 1 } else { 2 };
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        match taken(r, false)? {
            Some(k) => sent += k,
            None => break,
        }
    }
    Ok(sent)
}

/// What a `send`/`sendmsg` that returned `r` did: `Some(bytes)` taken (0 when interrupted),
/// `None` when the socket takes nothing now and the call did not block (`block` false), or
/// the error.
pub(super) fn taken(r: isize, block: bool) -> std::io::Result<Option<usize>> {
    if r > 0 {
        return Ok(Some(r as usize));
    }
    if r == 0 {
        return Err(std::io::ErrorKind::WriteZero.into());
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::Interrupted => Ok(Some(0)),
        std::io::ErrorKind::WouldBlock if !block => Ok(None),
        _ => Err(e),
    }
}

/// What the socket takes now of a frame (see [`send_now_from`]).
pub(super) fn send_now(s: &TcpStream, seal: Option<&Mutex<Sealer>>, frame: &Frame, data: &[u8]) -> std::io::Result<usize> {
    send_now_from(s, seal, frame, data, 0)
}

/// The rest of a frame from byte `sent` on, blocking.
pub(super) fn write_rest(s: &TcpStream, seal: Option<&Mutex<Sealer>>, frame: &Frame, data: &[u8], sent: usize) -> std::io::Result<()> {
    if let Some(seal) = seal {
        return seal.lock().unwrap().send(s, frame, data, sent, true).map(|_| ());
    }
    let hdr = frame.bytes();
    if sent < FRAME_LEN {
        write_all_vectored(s, &hdr[sent..], data)
    } else {
        write_all_vectored(s, &data[sent - FRAME_LEN..], &[])
    }
}

/// [`write_frame`], trying without blocking first: if the socket cannot take it all at once,
/// `on_block` runs before the rest is written blocking.
pub(super) fn write_frame_or(s: &TcpStream, seal: Option<&Mutex<Sealer>>, frame: &Frame, data: &[u8], on_block: &dyn Fn()) -> std::io::Result<()> {
    let sent = send_now(s, seal, frame, data)?;
    if sent == super::sealing::wire_len(data.len(), seal.is_some()) {
        return Ok(());
    }
    on_block();
    write_rest(s, seal, frame, data, sent)
}

/// Header and data in as few system calls as the socket allows (one `writev` when it has room).
#[cfg(test)]
pub(super) fn write_frame(s: &TcpStream, frame: &Frame, data: &[u8]) -> std::io::Result<()> {
    let hdr = frame.bytes();
    write_all_vectored(s, &hdr, data)
}

pub(super) fn write_all_vectored(mut s: &TcpStream, a: &[u8], b: &[u8]) -> std::io::Result<()> {
    let mut bufs = [std::io::IoSlice::new(a), std::io::IoSlice::new(b)];
    let mut bufs = &mut bufs[..];
    while !bufs.is_empty() {
        match s.write_vectored(bufs) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(k) => std::io::IoSlice::advance_slices(&mut bufs, k),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;


    /// A write of more than 4 GiB at an offset past 2^32 is one frame: its 64-bit length and
    /// offset survive the header, and the writer sends exactly that many bytes (Linux moves at
    /// most 2 GiB − 4 KiB per `writev`, so it takes several calls). The data is an untouched
    /// anonymous mapping (the zero page, no memory) with 4 marked bytes; the reader keeps
    /// 1 MiB at a time.
    #[test]
    fn a_frame_of_more_than_4_gib_goes_whole() {
        let n: usize = (1 << 32) + (3 << 20) + 5;
        let map = unsafe {
            libc::mmap(std::ptr::null_mut(), n, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
        };
        assert_ne!(map, libc::MAP_FAILED);
        let data = unsafe { std::slice::from_raw_parts_mut(map as *mut u8, n) };
        let marks = [(0usize, 1u8), ((1 << 31) - 1, 2), ((1 << 32) - 1, 3), (1 << 32, 4), (n - 1, 5)];
        for &(at, v) in &marks {
            data[at] = v;
        }
        let frame = Frame { kind: KIND_WRITE, value: 0xdead_beef, key: 7, offset: (5 << 32) + 64, len: n as u64, note: crate::backends::wire::NOTE_POST | (3 << 32), index: (1 << 33) + 8 };
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::scope(|sc| {
            let data = &*data;
            sc.spawn(move || {
                let s = TcpStream::connect(addr).unwrap();
                write_frame(&s, &frame, data).unwrap();
            });
            let (mut r, _) = l.accept().unwrap();
            let mut hdr = [0u8; FRAME_LEN];
            r.read_exact(&mut hdr).unwrap();
            let f = Frame::parse(&hdr);
            assert_eq!((f.kind, f.value, f.key, f.offset, f.len, f.note, f.index),
                       (frame.kind, frame.value, frame.key, frame.offset, n as u64, frame.note, frame.index));
            let mut part = vec![0u8; 1 << 20];
            let (mut got, mut seen) = (0usize, Vec::new());
            while got < f.len as usize {
                let k = (f.len as usize - got).min(part.len());
                r.read_exact(&mut part[..k]).unwrap();
                seen.extend(marks.iter().filter(|&&(at, _)| at >= got && at < got + k).map(|&(at, _)| (at, part[at - got])));
                got += k;
            }
            assert_eq!(seen, marks.to_vec());
            assert_eq!(r.read(&mut part[..1]).unwrap(), 0, "nothing after the frame");
        });
        unsafe { libc::munmap(map, n) };
    }
}
