//! The receiving side of a lane: each frame read whole, a write's bytes straight from the
//! socket into the target region (or a caller's window, see [`super::landing`]), its note
//! raised after the last byte.

use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::framing::{Frame, FRAME_LEN, KIND_BEAT, KIND_BYE, KIND_FENCE, KIND_NOTIFY, KIND_READ, KIND_READ_REPLY, KIND_WRITE};
use super::gate::Gate;
use super::sealing::{read_header, Opener, CHUNK, HDR_MAX, SEALED_HDR};
use super::{Lane, Link};
use crate::backends::wire::NOTE_WORD;
use crate::backends::Reducer;

/// The receiving side of a lane.
pub(super) struct Reader {
    pub(super) s: TcpStream,
    pub(super) fd: std::os::fd::RawFd,
    pub(super) scratch: Vec<u8>,
    /// Where a reducing window's parts are read (see [`read_reducing`]).
    pub(super) part: Vec<u64>,
    /// The peer closed the lane, or it broke.
    pub(super) done: bool,
    /// The receiving half of a sealed stream (`SCALEFREE_ENCRYPT=1`).
    pub(super) open: Option<Opener>,
    /// The peer said goodbye ([`KIND_BYE`]): its lane closing is no loss.
    pub(super) bye: bool,
}

/// Reads `dst.len()` bytes of a frame's data, opening them in place on a sealed stream
/// (`dst` starts at a multiple of [`CHUNK`] into the data and is a multiple of it long, or
/// reaches the frame's end: see [`Opener::read`]).
fn read_body(s: &mut TcpStream, open: &mut Option<Opener>, dst: &mut [u8]) -> std::io::Result<()> {
    match open {
        None => s.read_exact(dst),
        Some(o) => o.read(s, dst),
    }
}

/// What a failed read of a frame tells: a sealed record refused says why itself, and from
/// which host (the lane's far address) it came.
fn broke(s: &TcpStream, e: std::io::Error, how: &str) -> String {
    if e.kind() == std::io::ErrorKind::InvalidData {
        let from = s.peer_addr().map(|a| a.ip().to_string()).unwrap_or_else(|_| "?".into());
        format!("its sealed TCP lane from host {from} was refused: {e}")
    } else {
        format!("its TCP lane broke{how}: {e}")
    }
}

const _: () = assert!(REDUCE_PART.is_multiple_of(CHUNK) && SCRATCH.is_multiple_of(CHUNK), "reads of a sealed frame's data go by whole chunks");

/// What a socket has to read now.
pub(super) enum Avail {
    Data(usize),
    Nothing,
    Closed,
}

/// Starts reading a frame header of `len` bytes on the wire without blocking: what arrived
/// of it goes to `hdr` (`Data(k)`: `k` bytes, the rest to be read blocking).
pub(super) fn available(fd: std::os::fd::RawFd, hdr: &mut [u8; HDR_MAX], len: usize) -> Avail {
    let r = unsafe { libc::recv(fd, hdr.as_mut_ptr() as *mut libc::c_void, len, libc::MSG_DONTWAIT) };
    match r {
        0 => Avail::Closed,
        r if r > 0 => Avail::Data(r as usize),
        _ => match std::io::Error::last_os_error().kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Avail::Nothing,
            // Let the read report it.
            _ => Avail::Data(0),
        },
    }
}

/// Handles every frame that has started to arrive (each read whole, blocking for its rest);
/// returns how many. Whoever holds the reader runs it: the lane's thread, woken by `poll`,
/// or a caller waiting for a notification (no thread wake-up on the way).
pub(super) fn drain(sh: &Link, lane: &Lane, rd: &mut Reader) -> u32 {
    let mut k = 0;
    let mut hdr = [0u8; HDR_MAX];
    let len = if rd.open.is_some() { SEALED_HDR } else { FRAME_LEN };
    while !rd.done {
        match available(rd.fd, &mut hdr, len) {
            Avail::Nothing => break,
            // Closed between frames: the peer is done with us (its process exited or dropped
            // its device). Not an error here: if it died while we still need it, UCX
            // (endpoint error, heartbeats) or the process watch says so, as without lanes.
            // A sealed lane has no UCX beside it: closed without a goodbye, the peer is lost.
            Avail::Closed => {
                rd.done = true;
                if rd.open.is_some() && !rd.bye && !lane.state.lock().unwrap().closed && !sh.to.stopping() {
                    let from = rd.s.peer_addr().map(|a| a.ip().to_string()).unwrap_or_else(|_| "?".into());
                    sh.to.lost(lane.peer, format!("its sealed TCP lane from host {from} closed without a goodbye (the process died, or its host)"));
                }
            }
            Avail::Data(got) => match read_frame(sh, lane, rd, &mut hdr, got) {
                Ok(()) => k += 1,
                Err(why) => {
                    rd.done = true;
                    if !lane.state.lock().unwrap().closed && !sh.to.stopping() {
                        sh.to.lost(lane.peer, why);
                    }
                }
            },
        }
    }
    if rd.done && lane.index > 0 {
        // A fence waiter on the first stream must not wait for this one any more.
        lane.fences.seen.lock().unwrap()[lane.index] = u64::MAX;
        lane.fences.cv.notify_all();
    }
    k
}

/// Handles one frame whose first `got` header bytes are in `hdr` already.
pub(super) fn read_frame(sh: &Link, lane: &Lane, rd: &mut Reader, hdr: &mut [u8; HDR_MAX], got: usize) -> std::result::Result<(), String> {
    let peer = lane.peer as usize;
    let f = read_header(&mut rd.s, rd.open.as_mut(), hdr, got).map_err(|e| broke(&rd.s, e, ""))?;
    sh.to.heard_from(peer as u32);
    match f.kind {
        KIND_WRITE => {
            let n = f.len as usize;
            let target = sh.to.target(f.key, f.offset as usize, n);
            let direct = target.and_then(|_| sh.landing.target(f.key, f.offset as usize, n));
            if let (Some((_, raddr, rlen)), Some((to, delta, reduce))) = (target, direct) {
                // Direct landing: into the caller's memory, then the flag, then the note.
                let r = match &reduce {
                    None => read_body(&mut rd.s, &mut rd.open, unsafe { std::slice::from_raw_parts_mut(to as *mut u8, n) }),
                    Some(f) => read_reducing(rd, to, n, f),
                };
                sh.landing.left();
                r.map_err(|e| broke(&rd.s, e, " mid-write"))?;
                sh.landing.landed(n, reduce.is_some());
                let flag = (f.index as usize).checked_add(delta).filter(|&o| o + 4 <= rlen && o % 4 == 0);
                if let (NOTE_WORD, Some(o)) = (f.note, flag) {
                    unsafe { &*((raddr + o) as *const std::sync::atomic::AtomicU32) }.store(f.value, Ordering::Release);
                }
                sh.to.raise(raddr, rlen, f.note, f.index, f.value);
                return Ok(());
            }
            match target {
                Some((dst, _, _)) => read_body(&mut rd.s, &mut rd.open, unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) }),
                // A write to a region that is gone or out of bounds: dropped, as over UCX.
                None => skip(rd, n),
            }
            .map_err(|e| broke(&rd.s, e, " mid-write"))?;
            if let Some((_, raddr, rlen)) = target {
                sh.to.raise(raddr, rlen, f.note, f.index, f.value);
            }
            Ok(())
        }
        KIND_NOTIFY => {
            sh.to.publish(f.index as u32, f.value);
            Ok(())
        }
        KIND_BEAT => Ok(()),
        KIND_BYE => {
            rd.bye = true;
            Ok(())
        }
        KIND_READ => {
            // Answered from this rank's region by the lane's writer thread (a reader never
            // blocks on its socket's sending side); a region gone or too short: refused.
            let n = f.note as usize;
            let reply = Frame { kind: KIND_READ_REPLY, index: f.index, ..Frame::default() };
            match sh.to.target(f.key, f.offset as usize, n) {
                Some((src, _, _)) => super::writer::enqueue(lane, Frame { len: n as u64, ..reply }, src),
                None => super::writer::enqueue(lane, Frame { value: 1, ..reply }, 0),
            }
            Ok(())
        }
        KIND_READ_REPLY => {
            let n = f.len as usize;
            let pending = sh.reads.lock().unwrap().remove(&f.index);
            match pending {
                Some(p) if f.value == 0 && p.n == n => {
                    let r = read_body(&mut rd.s, &mut rd.open, unsafe { std::slice::from_raw_parts_mut(p.dst as *mut u8, n) });
                    p.op.finish(if r.is_ok() { crate::backends::OpState::OK } else { crate::backends::OpState::BROKEN });
                    r.map_err(|e| broke(&rd.s, e, " mid-read"))
                }
                other => {
                    if let Some(p) = other {
                        p.op.finish(crate::backends::OpState::BROKEN);
                    }
                    skip(rd, n).map_err(|e| broke(&rd.s, e, " mid-read"))
                }
            }
        }
        KIND_FENCE if lane.index > 0 => {
            let mut seen = lane.fences.seen.lock().unwrap();
            seen[lane.index] = seen[lane.index].max(f.index);
            lane.fences.cv.notify_all();
            Ok(())
        }
        KIND_FENCE => {
            // The first stream: on only once every extra stream has read this fence (their
            // reader threads read them; they never wait for this one).
            let mut seen = lane.fences.seen.lock().unwrap();
            while seen[1..].iter().any(|&s| s < f.index) {
                seen = lane.fences.cv.wait_timeout(seen, Duration::from_millis(100)).unwrap().0;
                if sh.to.stopping() || lane.state.lock().unwrap().closed {
                    return Err("its TCP lane closed at a fence".into());
                }
            }
            if seen[1..].contains(&u64::MAX) {
                return Err("one of its TCP lane's streams broke before a fence".into());
            }
            Ok(())
        }
        k => Err(format!("its TCP lane sent an unknown frame kind {k}")),
    }
}

/// Bytes a reducing window reads off the lane at a time: small enough to stay in the core's
/// cache between the kernel's copy and the reduction.
pub(super) const REDUCE_PART: usize = 64 << 10;
/// Bytes of a dropped write (its region gone) read at a time.
const SCRATCH: usize = 1 << 20;

/// Reads `n` bytes of a frame's data and drops them.
fn skip(rd: &mut Reader, n: usize) -> std::io::Result<()> {
    rd.scratch.resize(n.min(SCRATCH), 0);
    let mut left = n;
    while left > 0 {
        let k = left.min(rd.scratch.len());
        read_body(&mut rd.s, &mut rd.open, &mut rd.scratch[..k])?;
        left -= k;
    }
    Ok(())
}

/// Reads `n` bytes of a write in parts of [`REDUCE_PART`] and reduces each into `dst` at once.
pub(super) fn read_reducing(rd: &mut Reader, dst: usize, n: usize, f: &Reducer) -> std::io::Result<()> {
    if rd.part.is_empty() {
        // u64s: aligned for every element type.
        rd.part = vec![0u64; REDUCE_PART / 8];
    }
    let mut done = 0;
    while done < n {
        let k = (n - done).min(REDUCE_PART);
        let part = unsafe { std::slice::from_raw_parts_mut(rd.part.as_mut_ptr() as *mut u8, k) };
        read_body(&mut rd.s, &mut rd.open, part)?;
        f((dst + done) as *mut u8, part.as_ptr(), k);
        done += k;
    }
    Ok(())
}

/// The lane's reader thread: sleeps in `poll` until data arrives, then drains — unless a
/// caller is spinning in a wait, which reads it itself (the thread stands down meanwhile).
pub(super) fn read_loop(sh: &Link, lane: &Lane, gate: &Gate) {
    let fd = lane.reader.lock().unwrap().fd;
    // Extra streams (striped writes and fences) are read by their thread alone: callers
    // read the first stream only.
    let gated = lane.index == 0;
    loop {
        let open = !gated || gate.stand_down();
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let r = unsafe { libc::poll(&mut p, 1, -1) };
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
        if gated && open && gate.callers_reading() {
            // Arrived while a caller spins (or reads its own arrivals): it is reading it.
            continue;
        }
        let mut rd = lane.reader.lock().unwrap();
        drain(sh, lane, &mut rd);
        if rd.done {
            return;
        }
    }
}
