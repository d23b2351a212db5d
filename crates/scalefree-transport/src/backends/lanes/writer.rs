//! The sending side of a lane: frames written by the caller when the lane is idle, queued
//! large writes sent by the lane's writer thread, or by a waiter that needs one of them.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::framing::{send_now_from, write_rest, Frame};
use super::sealing::{wire_len, Sealer};
use super::{Lane, Link};
use crate::backends::OpState;

/// A queued write: the header, the source bytes (valid until `pending` completes) and its
/// completion.
pub(super) struct Job {
    pub(super) frame: Frame,
    pub(super) src: usize,
    /// Bytes of header and data already on the socket (the caller sent them).
    pub(super) sent: usize,
    pub(super) pending: Arc<OpState>,
}

pub(super) struct State {
    pub(super) queue: VecDeque<Job>,
    /// A job is being sent (by the writer thread or a waiter; nobody else may write
    /// meanwhile).
    pub(super) busy: bool,
    /// Callers waiting for a queued write of this lane, sending the queue themselves (see
    /// [`help`]): the writer thread takes no new job meanwhile.
    pub(super) helpers: u32,
    pub(super) closed: bool,
    pub(super) failed: Option<String>,
}

pub(super) fn job_data(job: &Job) -> &[u8] {
    let n = job.frame.len as usize;
    if n > 0 { unsafe { std::slice::from_raw_parts(job.src as *const u8, n) } } else { &[][..] }
}

/// Sends the rest of a queued job (what the caller did not send at once), blocking.
pub(super) fn send_job(s: &TcpStream, seal: Option<&Mutex<Sealer>>, job: &Job) -> std::io::Result<()> {
    write_rest(s, seal, &job.frame, job_data(job), job.sent)
}

/// Sends the rest of a queued job as long as the socket keeps taking bytes: false (with
/// `job.sent` advanced) when it took nothing for `patience` (a peer that stopped reading:
/// the waiter goes back to its timed wait, the writer thread carries on).
pub(super) fn send_job_within(s: &TcpStream, seal: Option<&Mutex<Sealer>>, job: &mut Job, patience: Duration) -> std::io::Result<bool> {
    let total = wire_len(job.frame.len as usize, seal.is_some());
    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
    let ms = patience.as_millis().clamp(1, i32::MAX as u128) as i32;
    loop {
        job.sent = send_now_from(s, seal, &job.frame, job_data(job), job.sent)?;
        if job.sent == total {
            return Ok(true);
        }
        let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r == 0 {
            return Ok(false);
        }
        if r < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return Err(std::io::Error::last_os_error());
        }
    }
}

/// Completes a job that was sent (or failed: then every queued job fails and the peer is
/// marked lost). `st` is the lane's state, locked again after the send; `busy` is cleared.
/// False when the lane failed.
pub(super) fn finish_job(sh: &Link, lane: &Lane, mut st: std::sync::MutexGuard<'_, State>, job: Job, r: std::io::Result<()>) -> bool {
    st.busy = false;
    let mut lost = None;
    match r {
        Ok(()) => job.pending.finish(OpState::OK),
        Err(e) => {
            let why = format!("TCP lane to rank {} failed: {e}", lane.peer);
            job.pending.finish(OpState::BROKEN);
            for j in st.queue.drain(..) {
                j.pending.finish(OpState::BROKEN);
            }
            st.failed = Some(why.clone());
            lost = (!st.closed).then_some(why);
        }
    }
    let ok = st.failed.is_none();
    let wake = !st.queue.is_empty() || !ok || st.helpers > 0;
    drop(st);
    if wake {
        // The writer thread or a helper may wait for the lane to be free (a helper waits
        // for the job it needs, perhaps this one).
        lane.cv.notify_all();
    }
    if let Some(why) = lost {
        sh.to.lost(lane.peer, why);
    }
    ok
}

/// A caller waiting for a queued write (`pending`) on `lane` sends the lane's queue itself,
/// in order, up to and including that write; while the writer thread is sending a job it
/// waits for that one. After `patience` without progress (the writer thread still busy, or
/// the socket taking nothing) it leaves the rest to the writer thread and waits as usual,
/// with its timeout and the peer checks. Meanwhile the writer thread takes no new job. Between simulated
/// hosts on 2 cores, handing every large write to the writer thread and parking until it
/// was sent cost 1.2-1.3x a plain socket's time for 8 posted 1 MiB writes, against about
/// nothing this way (`docs/benchmarks/collectives.md`, "Posted one-sided writes").
pub(super) fn help(sh: &Link, lane: &Lane, pending: &OpState, patience: Duration) {
    let mut st = lane.state.lock().unwrap();
    st.helpers += 1;
    let mut waited = Duration::ZERO;
    while !pending.is_done() && !st.closed && st.failed.is_none() {
        if st.busy {
            if waited >= patience {
                break;
            }
            let t = std::time::Instant::now();
            st = lane.cv.wait_timeout(st, patience - waited).unwrap().0;
            waited += t.elapsed();
            continue;
        }
        let Some(mut job) = st.queue.pop_front() else { break };
        st.busy = true;
        drop(st);
        let r = send_job_within(&lane.stream, lane.seal.as_ref(), &mut job, patience);
        if let Ok(false) = r {
            // Stalled: back to the head of the queue, for the writer thread.
            st = lane.state.lock().unwrap();
            st.busy = false;
            st.queue.push_front(job);
            break;
        }
        let ok = finish_job(sh, lane, lane.state.lock().unwrap(), job, r.map(|_| ()));
        st = lane.state.lock().unwrap();
        if !ok {
            break;
        }
    }
    st.helpers -= 1;
    let wake = st.helpers == 0 && !st.queue.is_empty();
    drop(st);
    if wake {
        lane.cv.notify_all();
    }
}

/// Queues `frame` (its data at `src`, valid until sent) for the lane's writer thread, from a
/// thread that must not block on the socket (a reader answering a read).
pub(super) fn enqueue(lane: &Lane, frame: Frame, src: usize) {
    let mut st = lane.state.lock().unwrap();
    if st.closed || st.failed.is_some() {
        return;
    }
    let first = st.queue.is_empty();
    st.queue.push_back(Job { frame, src, sent: 0, pending: Arc::new(OpState::default()) });
    drop(st);
    if first {
        lane.cv.notify_all();
    }
}

pub(super) fn write_loop(sh: &Link, lane: &Lane) {
    loop {
        let job = {
            let mut st = lane.state.lock().unwrap();
            loop {
                if st.closed {
                    for j in st.queue.drain(..) {
                        j.pending.finish(OpState::BROKEN);
                    }
                    return;
                }
                if st.failed.is_some() {
                    return;
                }
                if !st.busy && st.helpers == 0 {
                    if let Some(j) = st.queue.pop_front() {
                        st.busy = true;
                        break j;
                    }
                }
                st = lane.cv.wait(st).unwrap();
            }
        };
        let r = send_job(&lane.stream, lane.seal.as_ref(), &job);
        if !finish_job(sh, lane, lane.state.lock().unwrap(), job, r) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::super::framing::{send_now, write_all_vectored, FRAME_LEN, KIND_NOTIFY, KIND_WRITE};
    use std::io::Read;
    use std::net::TcpListener;
    use std::time::Instant;

    /// A frame larger than the socket takes at once: `send_now` sends part of it without
    /// blocking (the header may be cut too), `send_job_within` stops when the socket takes
    /// nothing more, `send_job` sends exactly the rest, and a frame after it arrives after
    /// it, byte for byte.
    #[test]
    fn a_frame_sent_partly_at_once_then_queued_arrives_whole_and_in_order() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut r, _) = l.accept().unwrap();
        let small: libc::c_int = 16 << 10;
        unsafe {
            libc::setsockopt(std::os::fd::AsRawFd::as_raw_fd(&s), libc::SOL_SOCKET, libc::SO_SNDBUF,
                             &small as *const libc::c_int as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t);
        }
        let n = 8 << 20;
        let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let frame = Frame { kind: KIND_WRITE, value: 9, key: 3, offset: 1 << 33, len: n as u64, note: 0, index: 5 };
        let sent = send_now(&s, None, &frame, &data).unwrap();
        assert!(sent > 0 && sent < FRAME_LEN + n, "the socket took {sent} bytes at once");
        let pending = Arc::new(OpState::default());
        let mut job = Job { frame, src: data.as_ptr() as usize, sent, pending };
        // Nobody reads yet: a waiter sending the rest gives up after its patience, with what
        // went kept in the job.
        let t0 = Instant::now();
        assert!(!send_job_within(&s, None, &mut job, Duration::from_millis(20)).unwrap());
        assert!(t0.elapsed() >= Duration::from_millis(20) && job.sent >= sent && job.sent < FRAME_LEN + n);
        let lane_stream = s.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut hdr = [0u8; FRAME_LEN];
            r.read_exact(&mut hdr).unwrap();
            let f = Frame::parse(&hdr);
            let mut got = vec![0u8; f.len as usize];
            r.read_exact(&mut got).unwrap();
            let mut hdr2 = [0u8; FRAME_LEN];
            r.read_exact(&mut hdr2).unwrap();
            (f.key, f.offset, f.index, got, Frame::parse(&hdr2).kind)
        });
        // The rest, as the writer thread or a waiter sends it, then a notification.
        send_job(&lane_stream, None, &job).unwrap();
        write_all_vectored(&lane_stream, &Frame { kind: KIND_NOTIFY, index: 1, value: 2, ..Frame::default() }.bytes(), &[]).unwrap();
        let (key, offset, index, got, next) = reader.join().unwrap();
        assert_eq!((key, offset, index), (3, 1 << 33, 5));
        assert!(got == data, "the data arrived changed");
        assert_eq!(next, KIND_NOTIFY);
    }
}
