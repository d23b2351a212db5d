//! The rendezvous with ranks as threads: exchanges with descriptors, refused tokens, world
//! sizes and versions, silent and oversized connections, a token that never crosses the wire.

use std::io::{Read, Write};

use super::*;

#[test]
fn a_bootstrap_frame_of_4_gib_is_refused_before_sending() {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let n = 1usize << 32;
    // An untouched anonymous mapping: no memory, never read.
    let map = unsafe { libc::mmap(std::ptr::null_mut(), n, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
    assert_ne!(map, libc::MAP_FAILED);
    let big = unsafe { std::slice::from_raw_parts(map as *const u8, n) };
    let e = send_frame(&mut a, big, None).unwrap_err().to_string();
    assert!(e.contains("4294967296 bytes") && e.contains("2^32 - 1"), "{e}");
    send_frame(&mut a, &big[..3], None).unwrap();
    assert_eq!(recv_frame(&mut b).unwrap().0, vec![0, 0, 0], "nothing of the refused frame was sent");
    unsafe { libc::munmap(map, n) };
}
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
        master: None,
        sealed: false,
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn tcp_job(rank: u32, size: u32, port: u16, token: &str) -> JobInfo {
    JobInfo { master: Some(("127.0.0.1".into(), port)), local_size: 1, local_rank: 0, ..job(rank, size, "tcp", token) }
}

#[test]
fn four_ranks_meet_over_tcp() {
    let port = free_port();
    let handles: Vec<_> = (0..4u32)
        .map(|r| {
            std::thread::spawn(move || {
                let mut rv = Rendezvous::join(&tcp_job(r, 4, port, "s"), Duration::from_secs(20)).unwrap();
                assert!(rv.is_tcp());
                // Threads of one process: one host.
                assert_eq!(rv.hosts(), &[0, 0, 0, 0]);
                let f = std::fs::File::open("/proc/self/stat").unwrap();
                let items = rv.exchange(&[r as u8; 5], Some(f.as_raw_fd())).unwrap();
                for (i, it) in items.iter().enumerate() {
                    assert_eq!(it.bytes, vec![i as u8; 5]);
                    assert!(it.fd.is_none(), "descriptors do not cross TCP");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn tcp_refuses_wrong_token_and_other_versions() {
    let port = free_port();
    let host = std::thread::spawn(move || Rendezvous::join(&tcp_job(0, 2, port, "right"), Duration::from_secs(3)).err());
    std::thread::sleep(Duration::from_millis(100));
    let e = Rendezvous::join(&tcp_job(1, 2, port, "wrong"), Duration::from_secs(2)).err().expect("refused");
    assert!(e.to_string().contains("wrong job token"), "{e}");
    // No secret at all, or one derived from what everybody knows: refused alike.
    for t in ["", "slurm:4242.0", "tcp"] {
        let e = Rendezvous::join(&tcp_job(1, 2, port, t), Duration::from_secs(2)).err().expect("refused");
        assert!(e.to_string().contains("wrong job token"), "{e}");
    }
    // A hello from another scalefree version.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&1u32.to_le_bytes());
    hello.extend_from_slice(&2u32.to_le_bytes());
    hello.extend_from_slice(&5u16.to_le_bytes());
    hello.extend_from_slice(b"0.0.1");
    hello.push(0);
    hello.extend_from_slice(&[7u8; 32]);
    send_frame(&mut s, &hello, None).unwrap();
    let (reply, _) = recv_frame(&mut s).unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    assert!(reply.contains("runs scalefree 0.0.1 but rank 0 runs"), "{reply}");
    // A joiner that skips checking rank 0's tag and answers with a made-up one.
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let hello = hello_bytes(1, 2, false, &[9u8; 32]);
    send_frame(&mut s, &hello, None).unwrap();
    let (challenge, _) = recv_frame(&mut s).unwrap();
    assert_eq!(challenge.len(), 64);
    send_frame(&mut s, &[0u8; 32], None).unwrap();
    let (reply, _) = recv_frame(&mut s).unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    assert!(reply.contains("REFUSED: rank 1 presented the wrong job token"), "{reply}");
    let host_err = host.join().unwrap();
    assert!(matches!(host_err, Some(Error::Timeout { .. })), "{host_err:?}");
}

/// Rank 0 of a 2-rank TCP job on a free port, started in a thread; returns the port.
fn tcp_host(token: &'static str, timeout: Duration) -> (u16, std::thread::JoinHandle<Result<Rendezvous>>) {
    let port = free_port();
    let h = std::thread::spawn(move || Rendezvous::join(&tcp_job(0, 2, port, token), timeout));
    // Until it listens.
    let t0 = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "rank 0 does not listen");
        std::thread::sleep(Duration::from_millis(5));
    }
    (port, h)
}

#[test]
fn fifty_silent_connections_do_not_delay_a_join() {
    let (port, host) = tcp_host("s", Duration::from_secs(60));
    let silent: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    // One that trickles a byte every 0.3 s, forever.
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let trickle = std::thread::spawn(move || {
        for _ in 0..20 {
            if slow.write_all(&[0]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let t0 = Instant::now();
    let mut rv = Rendezvous::join(&tcp_job(1, 2, port, "s"), Duration::from_secs(60)).unwrap();
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(2), "the join took {took:?} behind 50 silent connections");
    let mut host = host.join().unwrap().unwrap();
    let h = std::thread::spawn(move || host.exchange(b"a", None).map(|v| v.len()));
    assert_eq!(rv.exchange(b"b", None).unwrap().len(), 2);
    assert_eq!(h.join().unwrap().unwrap(), 2);
    drop(silent);
    trickle.join().unwrap();
}

#[test]
fn an_oversized_hello_is_refused_unread() {
    let (port, host) = tcp_host("s", Duration::from_secs(30));
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // Claims 4 GiB - 1 and sends none of it.
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (reply, _) = recv_frame(&mut s).unwrap();
    let reply = String::from_utf8_lossy(&reply).into_owned();
    assert!(reply.starts_with("REFUSED: a hello of 4294967295 bytes"), "{reply}");
    // The real rank still joins.
    Rendezvous::join(&tcp_job(1, 2, port, "s"), Duration::from_secs(20)).unwrap();
    host.join().unwrap().unwrap();
}

/// Forwards one connection from a port of its own to `to`, recording what the
/// connecting side sends and what it receives.
fn proxy(to: u16) -> (u16, std::thread::JoinHandle<(Vec<u8>, Vec<u8>)>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = std::thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = TcpStream::connect(("127.0.0.1", to)).unwrap();
        let pump = |mut a: TcpStream, mut b: TcpStream| {
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                a.set_read_timeout(Some(Duration::from_secs(3))).ok();
                while let Ok(n) = a.read(&mut buf) {
                    if n == 0 || b.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    seen.extend_from_slice(&buf[..n]);
                }
                seen
            })
        };
        let up = pump(client.try_clone().unwrap(), server.try_clone().unwrap());
        let down = pump(server, client);
        (up.join().unwrap(), down.join().unwrap())
    });
    (port, h)
}

#[test]
fn the_token_never_crosses_the_wire() {
    const TOKEN: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
    let (port, host) = tcp_host(TOKEN, Duration::from_secs(30));
    let (via, recorded) = proxy(port);
    let mut rv = Rendezvous::join(&tcp_job(1, 2, via, TOKEN), Duration::from_secs(20)).unwrap();
    let mut host = host.join().unwrap().unwrap();
    let h = std::thread::spawn(move || host.exchange(b"x", None).map(|_| ()));
    rv.exchange(b"y", None).unwrap();
    h.join().unwrap().unwrap();
    drop(rv);
    let (sent, received) = recorded.join().unwrap();
    assert!(sent.len() > 40 && received.len() > 40, "{} {}", sent.len(), received.len());
    for bytes in [&sent, &received] {
        assert!(!bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()), "the token crossed the wire");
        // Nor half of it, nor the key derived from it.
        assert!(!bytes.windows(16).any(|w| w == &TOKEN.as_bytes()[..16]));
    }
}

/// Like [`proxy`], but flips one bit of what the connecting side sends at byte `flip_at`.
fn flipping_proxy(to: u16, flip_at: usize) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (client, _) = l.accept().unwrap();
        let server = TcpStream::connect(("127.0.0.1", to)).unwrap();
        let pump = |mut a: TcpStream, mut b: TcpStream, flip: Option<usize>| {
            std::thread::spawn(move || {
                let (mut buf, mut at) = ([0u8; 4096], 0usize);
                a.set_read_timeout(Some(Duration::from_secs(5))).ok();
                while let Ok(n) = a.read(&mut buf) {
                    if let Some(f) = flip.filter(|&f| f >= at && f < at + n) {
                        buf[f - at] ^= 0x10;
                    }
                    at += n;
                    if n == 0 || b.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            })
        };
        pump(client.try_clone().unwrap(), server.try_clone().unwrap(), Some(flip_at));
        pump(server, client, None);
    });
    port
}

fn sealed_job(rank: u32, port: u16, sealed: bool) -> JobInfo {
    JobInfo { sealed, ..tcp_job(rank, 2, port, "s3cret") }
}

#[test]
fn a_sealed_rendezvous_hides_its_messages_and_refuses_changed_ones() {
    const PAYLOAD: &[u8] = b"a set-up message nobody on the path may read";
    // Sealed on both sides, through a recording proxy: the messages arrive, none shows.
    let port = free_port();
    let host = std::thread::spawn(move || {
        let mut rv = Rendezvous::join(&sealed_job(0, port, true), Duration::from_secs(20))?;
        rv.exchange(PAYLOAD, None)
    });
    std::thread::sleep(Duration::from_millis(100));
    let (via, recorded) = proxy(port);
    let mut rv = Rendezvous::join(&sealed_job(1, via, true), Duration::from_secs(20)).unwrap();
    let got = rv.exchange(b"and its answer", None).unwrap();
    assert_eq!(got[0].bytes, PAYLOAD);
    assert_eq!(host.join().unwrap().unwrap()[1].bytes, b"and its answer");
    drop(rv);
    let (sent, received) = recorded.join().unwrap();
    let names = host_identity();
    for bytes in [&sent, &received] {
        assert!(!bytes.windows(14).any(|w| w == &PAYLOAD[..14] || w == b"and its answer"), "a sealed message crossed in the clear");
        let name = names.rsplit('|').next().unwrap().as_bytes();
        assert!(name.len() < 4 || !bytes.windows(name.len()).any(|w| w == name), "the host identity crossed in the clear");
    }
    // One sealed, one not: refused at once, saying why.
    let port = free_port();
    let host = std::thread::spawn(move || Rendezvous::join(&sealed_job(0, port, true), Duration::from_secs(3)).err());
    std::thread::sleep(Duration::from_millis(100));
    let e = Rendezvous::join(&sealed_job(1, port, false), Duration::from_secs(3)).err().expect("refused");
    assert!(e.to_string().contains("without SCALEFREE_ENCRYPT") && e.to_string().contains("rank 0 with SCALEFREE_ENCRYPT=1"), "{e}");
    drop(host.join());
    // One bit of the first sealed message flipped on the way: rank 0 refuses it.
    let port = free_port();
    let host = std::thread::spawn(move || Rendezvous::join(&sealed_job(0, port, true), Duration::from_secs(10)).err());
    std::thread::sleep(Duration::from_millis(100));
    let handshake = 8 + hello_bytes(1, 2, true, &[0u8; 32]).len() + 8 + crate::auth::TAG_LEN;
    let via = flipping_proxy(port, handshake + 8 + 8 + 3);
    let _ = Rendezvous::join(&sealed_job(1, via, true), Duration::from_secs(10));
    let e = host.join().unwrap().expect("refused");
    assert!(e.to_string().contains("sealed rendezvous message was refused") && e.to_string().contains("failed authentication"), "{e}");
}

/// Rank 0 and rank 1 of a job over TCP with set-up timeout `timeout`; rank 1 runs `then`
/// on its joined rendezvous.
fn two_over_tcp(timeout: Duration, then: impl FnOnce(Rendezvous) + Send + 'static) -> (Rendezvous, std::thread::JoinHandle<()>) {
    let port = free_port();
    let one = std::thread::spawn(move || then(Rendezvous::join(&tcp_job(1, 2, port, "s"), Duration::from_secs(20)).unwrap()));
    (Rendezvous::join(&tcp_job(0, 2, port, "s"), timeout).unwrap(), one)
}

#[test]
fn a_live_rank_silent_in_a_set_up_exchange_is_a_named_timeout_not_eagain() {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (mut rv, one) = two_over_tcp(Duration::from_secs(20), move |rv| {
        rx.recv().unwrap(); // stays connected, and silent, until rank 0 has given up
        drop(rv);
    });
    rv.set_timeout(Duration::from_millis(300));
    let host = rv.host_names()[1].clone(); // this machine's name: its ranks are threads here
    let Err(e) = rv.exchange(b"x", None) else { panic!("the exchange went through") };
    let text = e.to_string();
    assert!(matches!(e, Error::Timeout { .. }), "{text}");
    assert!(text.contains(&format!("rank 1 on host {host} in a set-up exchange")), "{text}");
    assert!(!text.contains("os error 11") && !text.contains("temporarily unavailable"), "{text}");
    tx.send(()).unwrap();
    one.join().unwrap();
}

#[test]
fn a_rank_gone_during_set_up_is_peer_lost_in_the_exchange_and_in_the_watch() {
    let (mut rv, one) = two_over_tcp(Duration::from_secs(20), drop);
    one.join().unwrap();
    let host = rv.host_names()[1].clone();
    let watch = rv.watcher().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let e = loop {
        match watch.check() {
            Err(e) => break e.to_string(),
            Ok(()) => assert!(std::time::Instant::now() < deadline, "rank 1's end never reached rank 0"),
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(e.contains(&format!("rank 1 is gone: lost during set-up, on host {host} (connection")), "{e}");
    let Err(e) = rv.exchange(b"x", None) else { panic!("the exchange went through") };
    assert!(matches!(e, Error::PeerLost { rank: 1, .. }), "{e}");
    assert!(e.to_string().contains("lost during set-up"), "{e}");
}

#[test]
fn a_connection_the_kernel_dropped_is_a_peer_lost_naming_the_peer_timeout() {
    let e = lost(3, "node7", Duration::from_secs(120), Error::io("recvmsg", std::io::Error::from_raw_os_error(libc::ETIMEDOUT)));
    let text = e.to_string();
    assert!(matches!(e, Error::PeerLost { rank: 3, .. }), "{text}");
    assert!(text.contains("on host node7 (connection timed out") && text.contains("SCALEFREE_PEER_TIMEOUT"), "{text}");
    let e = lost(3, "node7", Duration::from_secs(120), Error::io("recvmsg", std::io::Error::from_raw_os_error(libc::EAGAIN)));
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
}
