//! Rendezvous of the ranks on one host through an abstract Unix socket.
//!
//! Local rank 0 listens on `\0scalefree/<job id>` (abstract: no file to clean up after a
//! crash). Every other rank connects, presents the job token and its rank, and keeps the
//! connection open. Later set-up exchanges (`exchange`) go through rank 0 as a hub and
//! may carry one file descriptor per rank (`SCM_RIGHTS`), which is how peers map each
//! other's memfd regions without needing `/proc` permissions.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

use super::JobInfo;
use crate::error::{Error, Result};

/// One rank's contribution to an exchange: bytes and an optional descriptor.
pub struct Item {
    pub bytes: Vec<u8>,
    pub fd: Option<OwnedFd>,
}

/// Connections between the ranks of one host, used only during set-up.
pub struct Rendezvous {
    rank: u32,
    size: u32,
    /// Rank 0: a stream per peer, indexed by rank (None at index 0). Others: one stream.
    conns: Vec<Option<UnixStream>>,
    timeout: Duration,
}

const MAGIC: &[u8; 8] = b"SCLFREE2";

fn bs(msg: impl Into<String>) -> Error {
    Error::Bootstrap(msg.into())
}

impl Rendezvous {
    /// Joins the job. Blocks until every rank has arrived or `timeout` passes.
    pub fn join(job: &JobInfo, timeout: Duration) -> Result<Self> {
        if job.size == 1 {
            return Ok(Rendezvous { rank: 0, size: 1, conns: vec![None], timeout });
        }
        let name = format!("scalefree/{}", job.job_id);
        let addr = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| Error::io("abstract socket name", e))?;
        if job.rank == 0 {
            Self::host(job, &addr, &name, timeout)
        } else {
            Self::guest(job, &addr, &name, timeout)
        }
    }

    fn host(job: &JobInfo, addr: &SocketAddr, name: &str, timeout: Duration) -> Result<Self> {
        let listener = UnixListener::bind_addr(addr).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                bs(format!(
                    "another process already hosts rendezvous {name:?}: is a job with id {} still running?",
                    job.job_id
                ))
            } else {
                Error::io(format!("bind {name:?}"), e)
            }
        })?;
        listener.set_nonblocking(true).map_err(|e| Error::io("set_nonblocking", e))?;
        let deadline = Instant::now() + timeout;
        let mut conns: Vec<Option<UnixStream>> = (0..job.size).map(|_| None).collect();
        let mut joined = 1u32;
        while joined < job.size {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).map_err(|e| Error::io("set_nonblocking", e))?;
                    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                    if !same_user(&s) {
                        continue;
                    }
                    let Ok((hello, _)) = recv_frame(&mut s) else { continue };
                    let Some((rank, size)) = parse_hello(&hello, &job.token) else { continue };
                    let refusal = if size != job.size {
                        Some(format!("REFUSED: rank 0 runs a job of {} ranks, this rank was told {size}", job.size))
                    } else if rank == 0 || rank >= job.size || conns[rank as usize].is_some() {
                        Some(format!("REFUSED: rank {rank} is already taken or out of range"))
                    } else {
                        None
                    };
                    if let Some(msg) = refusal {
                        let _ = send_frame(&mut s, msg.as_bytes(), None);
                        continue;
                    }
                    s.set_read_timeout(Some(timeout)).ok();
                    conns[rank as usize] = Some(s);
                    joined += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<u32> =
                            (1..job.size).filter(|r| conns[*r as usize].is_none()).collect();
                        return Err(Error::Timeout {
                            timeout,
                            waiting_for: format!("ranks {missing:?} to join rendezvous {name:?}"),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(Error::io("accept", e)),
            }
        }
        // Welcome everybody (proves we know the token too).
        let welcome = hello_bytes(&job.token, 0, job.size);
        for s in conns.iter_mut().flatten() {
            send_frame(s, &welcome, None)?;
        }
        Ok(Rendezvous { rank: 0, size: job.size, conns, timeout })
    }

    fn guest(job: &JobInfo, addr: &SocketAddr, name: &str, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let mut delay = Duration::from_millis(1);
        let mut s = loop {
            match UnixStream::connect_addr(addr) {
                Ok(s) => break s,
                Err(e) => {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout {
                            timeout,
                            waiting_for: format!("rank 0 to open rendezvous {name:?} ({e})"),
                        });
                    }
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(50));
                }
            }
        };
        s.set_read_timeout(Some(timeout)).ok();
        send_frame(&mut s, &hello_bytes(&job.token, job.rank, job.size), None)?;
        let (reply, _) = recv_frame(&mut s)
            .map_err(|e| bs(format!("rank 0 closed the rendezvous before welcoming rank {}: {e}", job.rank)))?;
        if let Some(why) = reply.strip_prefix(b"REFUSED: ") {
            return Err(bs(format!("rank 0 refused rank {}: {}", job.rank, String::from_utf8_lossy(why))));
        }
        if parse_hello(&reply, &job.token).map(|(r, _)| r) != Some(0) {
            return Err(bs("the rendezvous host does not know this job's token"));
        }
        let mut conns: Vec<Option<UnixStream>> = (0..job.size).map(|_| None).collect();
        conns[0] = Some(s);
        Ok(Rendezvous { rank: job.rank, size: job.size, conns, timeout })
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Every rank contributes an item; every rank gets all items, indexed by rank.
    /// Descriptors are duplicated into each receiver by the kernel.
    pub fn exchange(&mut self, bytes: &[u8], fd: Option<RawFd>) -> Result<Vec<Item>> {
        let dup = |fd: RawFd| -> Result<OwnedFd> {
            let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
            if d < 0 {
                return Err(Error::last_os("dup"));
            }
            Ok(unsafe { OwnedFd::from_raw_fd(d) })
        };
        if self.size == 1 {
            return Ok(vec![Item { bytes: bytes.to_vec(), fd: fd.map(dup).transpose()? }]);
        }
        if self.rank == 0 {
            let mut items: Vec<Item> = Vec::with_capacity(self.size as usize);
            items.push(Item { bytes: bytes.to_vec(), fd: fd.map(dup).transpose()? });
            for r in 1..self.size as usize {
                let s = self.conns[r].as_mut().expect("connected");
                let (b, f) = recv_frame(s).map_err(|e| lost(r as u32, e))?;
                items.push(Item { bytes: b, fd: f });
            }
            for r in 1..self.size as usize {
                let s = self.conns[r].as_mut().expect("connected");
                for it in &items {
                    send_frame(s, &it.bytes, it.fd.as_ref().map(|f| f.as_raw_fd()))
                        .map_err(|e| lost(r as u32, e))?;
                }
            }
            Ok(items)
        } else {
            let s = self.conns[0].as_mut().expect("connected");
            send_frame(s, bytes, fd).map_err(|e| lost(0, e))?;
            let mut items = Vec::with_capacity(self.size as usize);
            for _ in 0..self.size {
                let (b, f) = recv_frame(s).map_err(|e| lost(0, e))?;
                items.push(Item { bytes: b, fd: f });
            }
            Ok(items)
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

fn lost(rank: u32, e: Error) -> Error {
    Error::Bootstrap(format!("lost rank {rank} during set-up: {e}"))
}

fn hello_bytes(token: &str, rank: u32, size: u32) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&rank.to_le_bytes());
    v.extend_from_slice(&size.to_le_bytes());
    v.extend_from_slice(token.as_bytes());
    v
}

/// (rank, world size) from a hello carrying the right token.
fn parse_hello(b: &[u8], token: &str) -> Option<(u32, u32)> {
    if b.len() < 16 || &b[..8] != MAGIC || &b[16..] != token.as_bytes() {
        return None;
    }
    Some((u32::from_le_bytes(b[8..12].try_into().unwrap()), u32::from_le_bytes(b[12..16].try_into().unwrap())))
}

fn same_user(s: &UnixStream) -> bool {
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
fn send_frame(s: &mut UnixStream, payload: &[u8], fd: Option<RawFd>) -> Result<()> {
    let mut hdr = [0u8; 8];
    hdr[..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
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

fn recv_frame(s: &mut UnixStream) -> Result<(Vec<u8>, Option<OwnedFd>)> {
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
        return Err(bs("peer closed the connection"));
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
        s.read_exact(&mut hdr[n..]).map_err(|e| Error::io("recv", e))?;
    }
    let len = u32::from_le_bytes(hdr[..4].try_into().unwrap()) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).map_err(|e| Error::io("recv", e))?;
    Ok((payload, fd))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::Launcher;

    fn job(rank: u32, size: u32, id: &str, token: &str) -> JobInfo {
        JobInfo {
            rank,
            size,
            local_rank: rank,
            local_size: size,
            job_id: id.into(),
            token: token.into(),
            launcher: Launcher::Scalefree,
        }
    }

    #[test]
    fn three_ranks_exchange_bytes_and_fds() {
        let id = format!("test-{}-x", std::process::id());
        let handles: Vec<_> = (0..3u32)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut rv = Rendezvous::join(&job(r, 3, &id, "secret"), Duration::from_secs(10)).unwrap();
                    let f = std::fs::File::open("/proc/self/stat").unwrap();
                    let items = rv.exchange(&[r as u8; 3], Some(f.as_raw_fd())).unwrap();
                    assert_eq!(items.len(), 3);
                    for (i, it) in items.iter().enumerate() {
                        assert_eq!(it.bytes, vec![i as u8; 3]);
                        assert!(it.fd.is_some());
                    }
                    let items = rv.exchange(b"", None).unwrap();
                    assert!(items.iter().all(|it| it.fd.is_none() && it.bytes.is_empty()));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn disagreeing_world_sizes_are_refused() {
        let id = format!("test-{}-size", std::process::id());
        let id2 = id.clone();
        let host = std::thread::spawn(move || Rendezvous::join(&job(0, 2, &id2, "t"), Duration::from_millis(800)).err());
        std::thread::sleep(Duration::from_millis(50));
        let mut other = job(1, 3, &id, "t");
        other.size = 3;
        let e = Rendezvous::join(&other, Duration::from_secs(5)).err().expect("refused");
        assert!(e.to_string().contains("job of 2 ranks"), "{e}");
        assert!(host.join().unwrap().is_some());
    }

    #[test]
    fn wrong_token_cannot_join() {
        let id = format!("test-{}-tok", std::process::id());
        let id2 = id.clone();
        let host = std::thread::spawn(move || {
            Rendezvous::join(&job(0, 2, &id2, "right"), Duration::from_millis(600)).err()
        });
        std::thread::sleep(Duration::from_millis(50));
        let stray = Rendezvous::join(&job(1, 2, &id, "wrong"), Duration::from_millis(400));
        assert!(stray.is_err());
        let host_err = host.join().unwrap();
        assert!(matches!(host_err, Some(Error::Timeout { .. })), "{host_err:?}");
    }
}
