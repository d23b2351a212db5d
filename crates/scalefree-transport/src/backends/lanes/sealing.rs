//! Sealed lanes (`SCALEFREE_ENCRYPT=1`): every frame travels as records of
//! [`crate::seal`] (AES-256-GCM, numbered, one key per stream and direction). A frame is one
//! record for its 48-byte header and one per [`CHUNK`] of its data (the last one shorter).
//! Whoever sends a frame (the caller, the lane's writer thread or a waiter, see `writer.rs`)
//! seals it a group of records at a time just before the socket takes them, so a large
//! write is sealed chunk by chunk while the kernel carries the chunks before it; each of a
//! peer's streams seals in its own thread. The reader reads a chunk's ciphertext straight
//! into where the write lands and opens it there (or in its part buffer, for a reducing
//! window), so sealing adds no copy at the receiving end. A record refused (replayed,
//! reordered, modified) ends the lane and reports the peer lost: the write's note is never
//! raised, so nobody takes its bytes for arrived data.

use std::io::Read;
use std::net::TcpStream;

use super::framing::{taken, Frame, FRAME_LEN};
use crate::seal::{Cipher, OVERHEAD, TAG_LEN};

/// Data bytes per record.
pub(super) const CHUNK: usize = 64 << 10;
/// A sealed header on the wire.
pub(super) const SEALED_HDR: usize = FRAME_LEN + OVERHEAD;
/// The longest frame header on the wire, sealed or not.
pub(super) const HDR_MAX: usize = SEALED_HDR;

/// The label of a lane's session keys.
pub(super) const SEAL_LABEL: &str = "scalefree lane seal";

/// The bytes a frame with `n` bytes of data takes on the wire, sealed or not.
pub(super) fn wire_len(n: usize, sealed: bool) -> usize {
    if sealed { SEALED_HDR + n + OVERHEAD * n.div_ceil(CHUNK) } else { FRAME_LEN + n }
}

/// The group of records a sender seals at once that holds wire byte `at` of a frame with
/// `n` bytes of data: (group, its first wire byte). Group 0 is the header and the first
/// chunk (a small frame is one send), group `g > 0` is chunk `g`.
fn group_at(n: usize, at: usize) -> (usize, usize) {
    let first = SEALED_HDR + if n > 0 { n.min(CHUNK) + OVERHEAD } else { 0 };
    if at < first {
        return (0, 0);
    }
    let g = 1 + (at - first) / (CHUNK + OVERHEAD);
    (g, first + (g - 1) * (CHUNK + OVERHEAD))
}

/// The sending half of a sealed stream: the key, the next record's number, and the group of
/// records sealed and not yet all on the socket (a sender that stops part-way leaves it
/// here for whoever sends the rest of the frame: frames of one stream go out one at a time,
/// in order).
pub(crate) struct Sealer {
    cipher: Cipher,
    buf: Vec<u8>,
    /// The wire offset in the current frame where `buf` starts, while it is being sent.
    start: Option<usize>,
    /// Bytes of `buf` on the socket.
    pos: usize,
    /// Test hook (see [`Fault`]), and the last data record sealed, for a replay.
    fault: Fault,
    last: Vec<u8>,
}

/// A fault to inject into the records a stream sends, for the tests of sealed lanes
/// (`SCALEFREE_TEST_LANE_FAULT`, see `docs/config.md`): `flip:N` flips one byte of the first
/// data record numbered N or more after sealing it, `replay:N` sends the data record before
/// that one once more ahead of it; `@R` after either limits it to rank R's lanes. Once per
/// stream. Not for production use: it makes the receiving ranks refuse the lane.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fault {
    None,
    Flip(u64),
    Replay(u64),
}

impl Fault {
    /// The fault this rank (`me`) injects, if the environment asks for one.
    pub(crate) fn from_env(me: u32) -> Fault {
        Fault::parse(&std::env::var("SCALEFREE_TEST_LANE_FAULT").unwrap_or_default(), me)
    }

    fn parse(v: &str, me: u32) -> Fault {
        let (v, rank) = v.split_once('@').map_or((v, None), |(a, b)| (a, b.trim().parse::<u32>().ok()));
        if rank.is_some_and(|r| r != me) {
            return Fault::None;
        }
        let (what, n) = v.split_once(':').unwrap_or((v, ""));
        match (what.trim(), n.trim().parse::<u64>()) {
            ("flip", Ok(n)) if n > 0 => Fault::Flip(n),
            ("replay", Ok(n)) if n > 1 => Fault::Replay(n),
            _ => Fault::None,
        }
    }
}

impl Sealer {
    pub(crate) fn new(key: &[u8; 32], fault: Fault) -> Sealer {
        Sealer { cipher: Cipher::new(key), buf: Vec::new(), start: None, pos: 0, fault, last: Vec::new() }
    }

    /// Appends one sealed record of `plain` to the buffer.
    fn seal(&mut self, plain: &[u8], data: bool) {
        if self.fault == Fault::None {
            self.cipher.seal_onto(&mut self.buf, plain);
            return;
        }
        let rec = self.buf.len();
        let (body, counter) = self.cipher.seal_onto(&mut self.buf, plain);
        match self.fault {
            Fault::Flip(k) if data && counter >= k => {
                self.buf[body + plain.len() / 2] ^= 0x40;
                self.fault = Fault::None;
            }
            Fault::Replay(k) if data && counter >= k && !self.last.is_empty() => {
                // The previous data record goes once more, before this one.
                let this = self.buf.split_off(rec);
                self.buf.extend_from_slice(&self.last);
                self.buf.extend_from_slice(&this);
                self.fault = Fault::None;
            }
            _ => {}
        }
        if data && matches!(self.fault, Fault::Replay(_)) {
            self.last.clear();
            self.last.extend_from_slice(&self.buf[self.buf.len() - plain.len() - OVERHEAD..]);
        }
    }

    /// Seals group `g` of the frame (see [`group_at`]).
    fn fill(&mut self, g: usize, frame: &Frame, data: &[u8]) {
        self.buf.clear();
        let n = data.len();
        let range = if g == 0 {
            self.seal(&frame.bytes(), false);
            0..n.min(CHUNK)
        } else {
            g * CHUNK..n.min((g + 1) * CHUNK)
        };
        if !range.is_empty() {
            self.seal(&data[range], true);
        }
    }

    /// Sends the sealed frame from wire byte `sent` on: blocking (`block`) until it is all
    /// on the socket, else as far as the socket takes it now. Returns how far it has gone.
    pub(super) fn send(&mut self, s: &TcpStream, frame: &Frame, data: &[u8], mut sent: usize, block: bool) -> std::io::Result<usize> {
        let fd = std::os::fd::AsRawFd::as_raw_fd(s);
        let total = wire_len(data.len(), true);
        let flags = libc::MSG_NOSIGNAL | if block { 0 } else { libc::MSG_DONTWAIT };
        while sent < total {
            let (g, start) = group_at(data.len(), sent);
            if self.start != Some(start) {
                debug_assert_eq!(sent, start, "a sealed frame resumes where its group was left");
                self.fill(g, frame, data);
                self.start = Some(start);
                self.pos = 0;
            }
            let rest = &self.buf[self.pos..];
            let r = unsafe { libc::send(fd, rest.as_ptr() as *const libc::c_void, rest.len(), flags) };
            let Some(k) = taken(r, block)? else { break };
            if k > 0 {
                self.pos += k;
                let len = group_len(data.len(), g);
                if self.pos == self.buf.len() {
                    sent = start + len;
                    self.start = None;
                } else {
                    // (Within the group: a replayed record sent by the test hook is not in
                    // the frame's length.)
                    sent = start + self.pos.min(len - 1);
                }
            }
        }
        Ok(sent)
    }
}

/// The wire length of group `g` of a frame with `n` bytes of data (see [`group_at`]).
fn group_len(n: usize, g: usize) -> usize {
    let data = if g == 0 { n.min(CHUNK) } else { n.min((g + 1) * CHUNK) - g * CHUNK };
    (if g == 0 { SEALED_HDR } else { 0 }) + if data > 0 { data + OVERHEAD } else { 0 }
}

/// The receiving half of a sealed stream.
pub(crate) struct Opener {
    cipher: Cipher,
}

impl Opener {
    pub(crate) fn new(key: &[u8; 32]) -> Opener {
        Opener { cipher: Cipher::new(key) }
    }

    /// Opens a sealed header read whole into `wire`.
    pub(super) fn open_header(&mut self, wire: &mut [u8; SEALED_HDR]) -> std::io::Result<Frame> {
        let plain = self.cipher.open_record(wire)?;
        Ok(Frame::parse(plain[..FRAME_LEN].try_into().unwrap()))
    }

    /// Reads data records of a frame into `dst` and opens them there. `dst` starts at a
    /// chunk boundary of the frame's data and is a whole number of chunks, or the frame's
    /// last bytes (every caller reads whole frames or parts of [`CHUNK`] multiples).
    pub(super) fn read(&mut self, s: &mut TcpStream, dst: &mut [u8]) -> std::io::Result<()> {
        let mut tag = [0u8; TAG_LEN];
        for part in dst.chunks_mut(CHUNK) {
            let mut counter = [0u8; 8];
            read_parts(s, &mut [&mut counter[..], part, &mut tag[..]])?;
            self.cipher.open(u64::from_le_bytes(counter), part, &tag)?;
        }
        Ok(())
    }
}

/// Reads exactly the bytes of `parts`, in order, in as few system calls as the socket allows.
fn read_parts(s: &mut TcpStream, parts: &mut [&mut [u8]]) -> std::io::Result<()> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
    let mut done = [0usize; 3];
    assert!(parts.len() <= done.len());
    loop {
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(parts.len());
        for (p, &d) in parts.iter_mut().zip(&done) {
            if d < p.len() {
                iov.push(libc::iovec { iov_base: p[d..].as_mut_ptr() as *mut libc::c_void, iov_len: p.len() - d });
            }
        }
        if iov.is_empty() {
            return Ok(());
        }
        let r = unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as libc::c_int) };
        if r == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut k = r as usize;
        for (p, d) in parts.iter().zip(done.iter_mut()) {
            let take = (p.len() - *d).min(k);
            *d += take;
            k -= take;
        }
    }
}

/// Reads the rest of a header whose first `got` bytes are in `hdr`, and opens it when the
/// stream is sealed.
pub(super) fn read_header(s: &mut TcpStream, open: Option<&mut Opener>, hdr: &mut [u8; HDR_MAX], got: usize) -> std::io::Result<Frame> {
    match open {
        None => {
            s.read_exact(&mut hdr[got..FRAME_LEN])?;
            Ok(Frame::parse(hdr[..FRAME_LEN].try_into().unwrap()))
        }
        Some(o) => {
            s.read_exact(&mut hdr[got..SEALED_HDR])?;
            o.open_header(hdr)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::framing::{KIND_NOTIFY, KIND_WRITE};
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (r, _) = l.accept().unwrap();
        (s, r)
    }

    /// Receives one frame as the lane's reader does.
    fn receive(r: &mut TcpStream, o: &mut Opener) -> std::io::Result<(Frame, Vec<u8>)> {
        let mut hdr = [0u8; HDR_MAX];
        let f = read_header(r, Some(o), &mut hdr, 0)?;
        let mut got = vec![0u8; f.len as usize];
        o.read(r, &mut got)?;
        Ok((f, got))
    }

    #[test]
    fn sealed_frames_of_every_size_arrive_whole_and_in_order() {
        let key = [7u8; 32];
        for n in [0, 1, 1000, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 4 << 20] {
            let (s, mut r) = pair();
            let data: Vec<u8> = (0..n).map(|i| (i * 13 % 251) as u8).collect();
            let frame = Frame { kind: KIND_WRITE, value: 3, key: 9, offset: 4, len: n as u64, note: 0, index: 2 };
            let h = std::thread::spawn(move || {
                let mut se = Sealer::new(&key, Fault::None);
                // Non-blocking as far as it goes, then the rest blocking; then a notification.
                let sent = se.send(&s, &frame, &data, 0, false).unwrap();
                se.send(&s, &frame, &data, sent, true).unwrap();
                se.send(&s, &Frame { kind: KIND_NOTIFY, index: 1, value: 5, ..Frame::default() }, &[], 0, true).unwrap();
                data
            });
            let mut o = Opener::new(&key);
            let (f, got) = receive(&mut r, &mut o).unwrap();
            let data = h.join().unwrap();
            assert_eq!((f.kind, f.len as usize, f.key, f.offset, f.index, f.value), (KIND_WRITE, n, 9, 4, 2, 3));
            assert!(got == data, "n = {n}: the data arrived changed");
            let (f2, _) = receive(&mut r, &mut o).unwrap();
            assert_eq!((f2.kind, f2.index, f2.value), (KIND_NOTIFY, 1, 5));
            assert_eq!(wire_len(n, true), SEALED_HDR + n + OVERHEAD * n.div_ceil(CHUNK));
        }
    }

    #[test]
    fn a_flipped_byte_a_replayed_record_and_a_wrong_key_are_refused_by_name() {
        let key = [1u8; 32];
        let n = 3 * CHUNK;
        let data = vec![0x5au8; n];
        let frame = Frame { kind: KIND_WRITE, len: n as u64, ..Frame::default() };
        let mut wire = Vec::new();
        {
            let (s, mut r) = pair();
            let (d2, f2) = (data.clone(), frame);
            let h = std::thread::spawn(move || Sealer::new(&key, Fault::None).send(&s, &f2, &d2, 0, true).unwrap());
            r.read_to_end(&mut wire).unwrap_or(0);
            h.join().unwrap();
        }
        assert_eq!(wire.len(), wire_len(n, true));
        let feed = |bytes: Vec<u8>, k: [u8; 32]| -> std::io::Result<(Frame, Vec<u8>)> {
            let (mut s, mut r) = pair();
            let h = std::thread::spawn(move || {
                let _ = std::io::Write::write_all(&mut s, &bytes);
            });
            let out = receive(&mut r, &mut Opener::new(&k));
            drop(r);
            h.join().unwrap();
            out
        };
        let (_, got) = feed(wire.clone(), key).unwrap();
        assert!(got == data);
        // One bit of the second data record's ciphertext flipped.
        let mut bad = wire.clone();
        bad[SEALED_HDR + (CHUNK + OVERHEAD) + 8 + 100] ^= 1;
        let e = feed(bad, key).unwrap_err();
        assert!(e.kind() == std::io::ErrorKind::InvalidData && e.to_string().contains("record 2 failed authentication"), "{e}");
        // The first data record sent twice.
        let rec1 = SEALED_HDR..SEALED_HDR + CHUNK + OVERHEAD;
        let mut replayed = wire[..rec1.end].to_vec();
        replayed.extend_from_slice(&wire[rec1.clone()]);
        replayed.extend_from_slice(&wire[rec1.end..]);
        let e = feed(replayed, key).unwrap_err();
        assert!(e.to_string().contains("replayed or reordered: record 1, expected 2"), "{e}");
        // Two records swapped.
        let rec2 = rec1.end..rec1.end + CHUNK + OVERHEAD;
        let mut swapped = wire[..rec1.start].to_vec();
        swapped.extend_from_slice(&wire[rec2.clone()]);
        swapped.extend_from_slice(&wire[rec1.clone()]);
        swapped.extend_from_slice(&wire[rec2.end..]);
        let e = feed(swapped, key).unwrap_err();
        assert!(e.to_string().contains("record 2, expected 1"), "{e}");
        // A record's counter rewritten to the expected one: its tag no longer matches.
        let mut renumbered = wire[..rec1.end].to_vec();
        let mut again = wire[rec1.clone()].to_vec();
        again[..8].copy_from_slice(&2u64.to_le_bytes());
        renumbered.extend_from_slice(&again);
        let e = feed(renumbered, key).unwrap_err();
        assert!(e.to_string().contains("record 2 failed authentication"), "{e}");
        // Another key (another connection, direction or job): the header is refused.
        let e = feed(wire.clone(), [2u8; 32]).unwrap_err();
        assert!(e.to_string().contains("record 0 failed authentication"), "{e}");
    }

    #[test]
    fn the_test_hook_flips_and_replays_as_told() {
        let key = [3u8; 32];
        let n = 2 * CHUNK;
        let data = vec![1u8; n];
        let frame = Frame { kind: KIND_WRITE, len: n as u64, ..Frame::default() };
        for (fault, want) in [(Fault::Flip(2), "record 2 failed authentication"), (Fault::Replay(2), "record 1, expected 2")] {
            let (s, mut r) = pair();
            let d2 = data.clone();
            let h = std::thread::spawn(move || {
                let mut se = Sealer::new(&key, fault);
                se.send(&s, &frame, &d2, 0, true).unwrap();
            });
            let e = receive(&mut r, &mut Opener::new(&key)).unwrap_err();
            assert!(e.to_string().contains(want), "{fault:?}: {e}");
            h.join().unwrap();
        }
        assert_eq!(Fault::parse("flip:3", 1), Fault::Flip(3));
        assert_eq!(Fault::parse("replay:2@1", 1), Fault::Replay(2));
        assert_eq!(Fault::parse("replay:2@0", 1), Fault::None);
        assert_eq!(Fault::parse("", 0), Fault::None);
        assert_eq!(Fault::parse("flip:x", 0), Fault::None);
        assert_eq!(group_at(0, 0), (0, 0));
        assert_eq!(group_at(CHUNK + 1, SEALED_HDR + CHUNK + OVERHEAD), (1, SEALED_HDR + CHUNK + OVERHEAD));
    }
}
