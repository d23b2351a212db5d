//! The connections of the rendezvous (a Unix or a TCP stream) and the frames set-up
//! messages travel in: a length, a has-descriptor flag, the payload; on a Unix socket the
//! descriptor rides on the header (`SCM_RIGHTS`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::rendezvous::bs;
use crate::error::{Error, Result};

/// A connection of the rendezvous: a Unix or a TCP stream.
pub(super) trait Conn: Read + Write + AsRawFd + Send {
    fn set_timeout(&self, t: Option<Duration>);
    fn set_write_timeout(&self, t: Option<Duration>);
    fn is_tcp(&self) -> bool;
    /// This end's IP address (TCP only).
    fn local_ip(&self) -> Option<std::net::IpAddr> {
        None
    }
    /// The other end's IP address (TCP only).
    fn peer_ip(&self) -> Option<std::net::IpAddr> {
        None
    }
    /// Has the kernel watch the other end (TCP only, see [`watch_liveness`]).
    fn watch(&self, _peer_timeout: Duration) {}
}
impl Conn for UnixStream {
    fn set_timeout(&self, t: Option<Duration>) {
        self.set_read_timeout(t).ok();
    }
    fn set_write_timeout(&self, t: Option<Duration>) {
        UnixStream::set_write_timeout(self, t).ok();
    }
    fn is_tcp(&self) -> bool {
        false
    }
}
impl Conn for TcpStream {
    fn set_timeout(&self, t: Option<Duration>) {
        self.set_read_timeout(t).ok();
    }
    fn set_write_timeout(&self, t: Option<Duration>) {
        TcpStream::set_write_timeout(self, t).ok();
    }
    fn is_tcp(&self) -> bool {
        true
    }
    fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.local_addr().ok().map(|a| a.ip())
    }
    fn peer_ip(&self) -> Option<std::net::IpAddr> {
        self.peer_addr().ok().map(|a| a.ip())
    }
    fn watch(&self, peer_timeout: Duration) {
        watch_liveness(self.as_raw_fd(), peer_timeout);
    }
}

/// Has the kernel watch a set-up connection between hosts, so that a host cut off (no reset,
/// no close: nothing arrives at all) fails it within `peer_timeout` (`SCALEFREE_PEER_TIMEOUT`)
/// instead of the set-up timeout: keepalive probes after `peer_timeout / 2` of silence, one a
/// second, and the connection dropped (reads and writes fail with `ETIMEDOUT`) once nothing
/// has been acknowledged for `peer_timeout` (`TCP_USER_TIMEOUT`, which also bounds data left
/// unacknowledged). The probes are answered by the other host's kernel, so a rank that is
/// busy, or slow to reach the next set-up step, still counts as alive.
pub(crate) fn watch_liveness(fd: RawFd, peer_timeout: Duration) {
    let secs = peer_timeout.as_secs_f64();
    let set = |level: libc::c_int, name: libc::c_int, v: libc::c_int| unsafe {
        libc::setsockopt(fd, level, name, &v as *const libc::c_int as *const libc::c_void, std::mem::size_of::<libc::c_int>() as libc::socklen_t);
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, ((secs / 2.0).ceil() as libc::c_int).clamp(1, 32767));
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1);
    // Without TCP_USER_TIMEOUT (older kernels) the probes alone end it.
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, (secs.ceil() as libc::c_int).clamp(1, 127));
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, (peer_timeout.as_millis().min(i32::MAX as u128) as libc::c_int).max(1));
}

/// Why a connection of the set-up is broken, if it is: the other end closed it or the
/// kernel dropped it (`SO_ERROR`, e.g. `ETIMEDOUT` from [`watch_liveness`]). Does not block
/// and reads nothing.
pub(crate) fn broken(fd: RawFd) -> Option<String> {
    let mut p = libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 };
    if unsafe { libc::poll(&mut p, 1, 0) } <= 0 {
        return None;
    }
    if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLRDHUP | libc::POLLNVAL) == 0 {
        return None;
    }
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, &mut err as *mut libc::c_int as *mut libc::c_void, &mut len) };
    Some(if err != 0 { describe_io(&std::io::Error::from_raw_os_error(err)) } else { "connection closed: the process ended".into() })
}

/// A connection error of the set-up in words (never a bare `EAGAIN`).
pub(crate) fn describe_io(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ETIMEDOUT) => format!(
            "connection timed out: nothing acknowledged for {:.0} s (SCALEFREE_PEER_TIMEOUT), its host is unreachable",
            crate::wait::peer_timeout_from_env().as_secs_f64()
        ),
        Some(libc::ECONNRESET) | Some(libc::EPIPE) => "connection reset: the process or its host ended".into(),
        _ => format!("connection failed: {e}"),
    }
}

pub(super) fn set_blocking(fd: RawFd) {
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// Reads one frame (no descriptor) of at most `max` bytes, all of it before `deadline`.
pub(super) fn read_frame_by(s: &mut dyn Conn, max: usize, deadline: Instant) -> std::result::Result<Vec<u8>, String> {
    let mut hdr = [0u8; 8];
    read_by(s, &mut hdr, deadline)?;
    let len = u32::from_le_bytes(hdr[..4].try_into().unwrap()) as usize;
    if len > max {
        return Err(format!("a hello of {len} bytes (at most {max} are read)"));
    }
    let mut payload = vec![0u8; len];
    read_by(s, &mut payload, deadline)?;
    Ok(payload)
}

/// `read_exact` that gives up at `deadline`, however slowly the bytes trickle in.
pub(super) fn read_by(s: &mut dyn Conn, mut buf: &mut [u8], deadline: Instant) -> std::result::Result<(), String> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("too slow".into());
        }
        s.set_timeout(Some(left));
        match s.read(buf) {
            Ok(0) => return Err("closed".into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

pub(super) fn same_user(s: &UnixStream) -> bool {
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    r == 0 && cred.uid == unsafe { libc::getuid() }
}

/// Frame: u32 payload length, u32 has-fd flag, payload. The descriptor rides on the header.
/// Bootstrap messages are small (addresses, handles, agreed specs): one of 4 GiB or more is
/// refused before anything is sent (its length would wrap the header's 32 bits).
pub(super) fn send_frame(s: &mut dyn Conn, payload: &[u8], fd: Option<RawFd>) -> Result<()> {
    let len = u32::try_from(payload.len())
        .map_err(|_| Error::InvalidArgument(format!("a bootstrap message of {} bytes: at most 2^32 - 1 fit its frame", payload.len())))?;
    let mut hdr = [0u8; 8];
    hdr[..4].copy_from_slice(&len.to_le_bytes());
    hdr[4..].copy_from_slice(&(fd.is_some() as u32).to_le_bytes());
    let mut iov = libc::iovec {
        iov_base: hdr.as_mut_ptr() as *mut libc::c_void,
        iov_len: hdr.len(),
    };
    let mut cbuf = [0u64; 4]; // room for one cmsg with one int, aligned
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space;
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
        }
    }
    loop {
        let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io("sendmsg", e));
        }
        if (n as usize) < hdr.len() {
            s.write_all(&hdr[n as usize..]).map_err(|e| Error::io("send", e))?;
        }
        break;
    }
    s.write_all(payload).map_err(|e| Error::io("send", e))
}

pub(super) fn recv_frame(s: &mut dyn Conn) -> Result<(Vec<u8>, Option<OwnedFd>)> {
    recv_frame_max(s, usize::MAX)
}

/// [`recv_frame`], refusing a frame longer than `max` before allocating it.
pub(super) fn recv_frame_max(s: &mut dyn Conn, max: usize) -> Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut hdr = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: hdr.as_mut_ptr() as *mut libc::c_void,
        iov_len: hdr.len(),
    };
    let mut cbuf = [0u64; 4];
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io("recvmsg", e));
        }
        break n as usize;
    };
    if n == 0 {
        return Err(bs(super::rendezvous::CLOSED));
    }
    let mut fd = None;
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const RawFd);
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n < hdr.len() {
        s.read_exact(&mut hdr[n..]).map_err(|e| closed_or(e, "recv"))?;
    }
    let len = u32::from_le_bytes(hdr[..4].try_into().unwrap()) as usize;
    if len > max {
        return Err(bs(format!("a message of {len} bytes where at most {max} were expected")));
    }
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).map_err(|e| closed_or(e, "recv"))?;
    Ok((payload, fd))
}

/// A read that ended early: the peer closed the connection mid-message, or `e` as it is.
fn closed_or(e: std::io::Error, what: &str) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof { bs(super::rendezvous::CLOSED) } else { Error::io(what, e) }
}
