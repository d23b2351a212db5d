//! Opening a lane: each rank listens on the interface between hosts; a dialler proves it is
//! a rank of this job (see [`crate::auth`]: the job's key never crosses the wire).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::sealing::{Fault, Opener, Sealer, SEAL_LABEL};
use super::striping::{streams, Offer};
use crate::auth::{Key, Nonce};
use crate::error::{Error, Result};

pub(super) const HELLO_MAGIC: u32 = 0x5346_4c4e; // "SFLN"

/// A listening socket on `ip`, before the addresses are swapped.
pub(crate) struct Listener {
    listener: TcpListener,
    /// What this rank offers its peers (its address, its `SCALEFREE_TCP_LANE_STREAMS`).
    pub offer: Offer,
}

impl Listener {
    pub fn bind(ip: IpAddr, sealed: bool) -> Result<Listener> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| Error::io(format!("TCP lane: bind {ip}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("TCP lane: local address", e))?;
        Ok(Listener { listener, offer: Offer { addr, streams: streams(), sealed } })
    }
}

/// How long a connection to a lane listener may take to prove it belongs to the job.
pub(super) const LANE_HELLO_DEADLINE: Duration = Duration::from_secs(5);
pub(super) const LANE_HELLO_LEN: usize = 8 + crate::auth::NONCE_LEN;
pub(super) const LANE_CHALLENGE_LEN: usize = crate::auth::NONCE_LEN + crate::auth::TAG_LEN;

/// What both ends of a lane from `dialer` to `acceptor` bind their tags to (and whether
/// it is sealed: ranks that disagree refuse each other).
pub(super) fn lane_context(dialer: u32, acceptor: u32, sealed: bool) -> [u8; 13] {
    let mut c = [0u8; 13];
    c[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    c[4..8].copy_from_slice(&dialer.to_le_bytes());
    c[8..12].copy_from_slice(&acceptor.to_le_bytes());
    c[12] = sealed as u8;
    c
}

/// The nonces of a lane's handshake: (the dialler's, the acceptor's).
pub(super) type Nonces = (Nonce, Nonce);

/// The two halves of a sealed stream.
pub(super) type Seal = (Sealer, Opener);

/// The sealing of stream `index` from `dialer` to `acceptor` after a handshake with `nonces`,
/// seen from `me` (one of the two): what it sends with and what it opens with.
pub(super) fn seal_for(key: &Key, dialer: u32, acceptor: u32, index: usize, nonces: &Nonces, me: u32) -> Seal {
    let mut ctx = lane_context(dialer, acceptor, true).to_vec();
    ctx.extend_from_slice(&(index as u32).to_le_bytes());
    let (forth, back) = key.session_keys(SEAL_LABEL, &ctx, &nonces.0, &nonces.1);
    let (send, recv) = if me == dialer { (forth, back) } else { (back, forth) };
    (Sealer::new(&send, Fault::from_env(me)), Opener::new(&recv))
}

/// The dialling side of a lane's handshake (see [`crate::auth`]): hello with a fresh nonce,
/// check the acceptor's tag, answer with ours. The job's secret never crosses the wire.
/// Returns both nonces.
pub(crate) fn dial_handshake(s: &mut TcpStream, key: &Key, me: u32, peer: u32, sealed: bool) -> std::result::Result<Nonces, String> {
    let mine = crate::auth::nonce().map_err(|e| e.to_string())?;
    let mut hello = [0u8; LANE_HELLO_LEN];
    hello[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello[4..8].copy_from_slice(&me.to_le_bytes());
    hello[8..].copy_from_slice(&mine);
    s.write_all(&hello).map_err(|e| format!("hello: {e}"))?;
    let mut challenge = [0u8; LANE_CHALLENGE_LEN];
    s.read_exact(&mut challenge).map_err(|e| format!("rank {peer} closed the lane before proving it is of this job: {e}"))?;
    let tag = crate::auth::answer(key, &lane_context(me, peer, sealed), &mine, &challenge).ok_or_else(|| {
        format!("the process at rank {peer}'s lane address does not know this job's secret (or does not set SCALEFREE_ENCRYPT as this rank does)")
    })?;
    s.write_all(&tag).map_err(|e| format!("answer: {e}"))?;
    Ok((mine, challenge[..crate::auth::NONCE_LEN].try_into().unwrap()))
}

/// The accepting side of a lane's handshake, all within `deadline`: the dialler's rank and
/// both nonces when it proves it is a rank of this job that `wanted` (`None` for anybody
/// else).
pub(crate) fn accept_handshake(s: &mut TcpStream, key: &Key, me: u32, sealed: bool, wanted: &dyn Fn(u32) -> bool, deadline: std::time::Instant) -> Option<(u32, Nonces)> {
    let read_by = |s: &mut TcpStream, buf: &mut [u8]| -> Option<()> {
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            s.set_read_timeout(Some(left)).ok()?;
            match s.read(&mut buf[got..]) {
                Ok(0) => return None,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return None,
            }
        }
        Some(())
    };
    s.set_write_timeout(Some(LANE_HELLO_DEADLINE)).ok()?;
    let mut hello = [0u8; LANE_HELLO_LEN];
    read_by(s, &mut hello)?;
    let magic = u32::from_le_bytes(hello[0..4].try_into().unwrap());
    let r = u32::from_le_bytes(hello[4..8].try_into().unwrap());
    let theirs: crate::auth::Nonce = hello[8..].try_into().unwrap();
    if magic != HELLO_MAGIC || !wanted(r) {
        return None;
    }
    let ctx = lane_context(r, me, sealed);
    let challenge = crate::auth::challenge(key, &ctx, &theirs).ok()?;
    s.write_all(&challenge).ok()?;
    let mut answer = [0u8; crate::auth::TAG_LEN];
    read_by(s, &mut answer)?;
    if !crate::auth::accept(key, &ctx, &theirs, &challenge, &answer) {
        return None;
    }
    s.set_read_timeout(None).ok()?;
    s.set_write_timeout(None).ok()?;
    Some((r, (theirs, challenge[..crate::auth::NONCE_LEN].try_into().unwrap())))
}

/// The key of a job's lanes.
pub(crate) fn lane_key(token: &str, job_id: &str) -> Key {
    Key::derive(token, "scalefree tcp lane", job_id)
}


/// Collective: connects this rank (`me`) with every rank in `connect` (see
/// [`super::Lanes::open`]), as many streams per pair as the smaller of the two offers;
/// returns each peer's streams, in stream order (all `None` for a rank without a lane), each
/// with its sealing when `sealed`.
/// Every wait checks `alive`; a dial that gets no answer for the peer timeout (its host is
/// unreachable: every rank listens before the offers are exchanged) fails as a peer lost.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub(super) fn connect(me: usize, listener: Listener, offers: &[Option<Offer>], connect: &[bool], key: &Key, sealed: bool, timeout: Duration,
                      alive: super::Alive) -> Result<Vec<Vec<Option<(TcpStream, Option<Seal>)>>>> {
    // Streams per peer, the same number at both ends.
    let counts: Vec<usize> = offers.iter().map(|o| o.map_or(1, |o| Offer::agree(listener.offer.streams, o.streams))).collect();
    let mut streams: Vec<Vec<Option<(TcpStream, Option<Seal>)>>> = counts.iter().map(|&k| (0..k).map(|_| None).collect()).collect();
    // Accept (and admit, each on a thread of its own) while this rank dials its own.
    let want: usize = connect.iter().enumerate().filter(|&(r, &c)| c && r > me).map(|(r, _)| counts[r]).sum();
    let deadline = std::time::Instant::now() + timeout;
    let peer_timeout = crate::wait::peer_timeout_from_env();
    let acceptor = {
        let key = key.clone();
        let connect = connect.to_vec();
        let counts = counts.clone();
        let l = listener.listener;
        let alive = alive.clone();
        std::thread::Builder::new().name(format!("sf-lane-accept-{me}")).spawn(move || -> Result<Vec<(u32, usize, TcpStream, Nonces)>> {
            l.set_nonblocking(true).ok();
            let (tx, rx) = std::sync::mpsc::channel::<(u32, usize, TcpStream, Nonces)>();
            let mut got: Vec<(u32, usize, TcpStream, Nonces)> = Vec::new();
            let mut refused = 0;
            while got.len() < want {
                loop {
                    match l.accept() {
                        Ok((mut s, _)) => {
                            s.set_nonblocking(false).ok();
                            let (key, tx, connect, counts) = (key.clone(), tx.clone(), connect.clone(), counts.clone());
                            let _ = std::thread::Builder::new().name("sf-lane-admit".into()).stack_size(64 << 10).spawn(move || {
                                let ok = accept_handshake(&mut s, &key, me as u32, sealed, &|r| (r as usize) > me && (r as usize) < connect.len() && connect[r as usize],
                                                          std::time::Instant::now() + LANE_HELLO_DEADLINE);
                                let nonces = ok.map(|(_, n)| n).unwrap_or(([0; crate::auth::NONCE_LEN], [0; crate::auth::NONCE_LEN]));
                                let ok = ok.map(|(r, _)| r);
                                // Then which of the dialler's streams this is.
                                let mut idx = [0u8; 4];
                                let stream = ok.and_then(|r| {
                                    s.set_read_timeout(Some(LANE_HELLO_DEADLINE)).ok()?;
                                    s.read_exact(&mut idx).ok()?;
                                    s.set_read_timeout(None).ok()?;
                                    Some(u32::from_le_bytes(idx) as usize).filter(|&i| i < counts[r as usize])
                                });
                                // u32::MAX: refused.
                                let _ = tx.send((if stream.is_some() { ok.unwrap_or(u32::MAX) } else { u32::MAX }, stream.unwrap_or(0), s, nonces));
                            });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(Error::io("TCP lane: accept", e)),
                    }
                }
                match rx.recv_timeout(Duration::from_millis(1)) {
                    Ok((r, i, s, nonces)) => {
                        let from = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                        if r == u32::MAX || got.iter().any(|(q, j, _, _)| *q == r && *j == i) {
                            refused += 1;
                            if refused <= 3 {
                                eprintln!("scalefree: rank {me} refused a TCP lane from {from} (not a rank of this job)");
                            }
                            continue;
                        }
                        got.push((r, i, s, nonces));
                    }
                    Err(_) => {
                        alive()?;
                        if std::time::Instant::now() >= deadline {
                            return Err(Error::Timeout { timeout, waiting_for: format!("{} peers to open their TCP lanes to rank {me}", want - got.len()) });
                        }
                    }
                }
            }
            Ok(got)
        }).map_err(|e| Error::io("spawn TCP lane acceptor", e))?
    };
    for r in (0..me).filter(|&r| connect[r]) {
        let a = offers[r].ok_or_else(|| Error::Bootstrap(format!("rank {r} offered no TCP lane")))?.addr;
        for i in 0..counts[r] {
            alive()?;
            let left = deadline.saturating_duration_since(std::time::Instant::now()).max(Duration::from_millis(1));
            let mut s = TcpStream::connect_timeout(&a, left.min(peer_timeout)).map_err(|e| match e.raw_os_error() {
                Some(libc::ETIMEDOUT | libc::ENETUNREACH | libc::EHOSTUNREACH) if left > peer_timeout => Error::PeerLost {
                    rank: r as u32,
                    pid: 0,
                    detail: format!("lost during set-up, on host {} (its TCP lane: no answer for {:.0} s (SCALEFREE_PEER_TIMEOUT): {e})", a.ip(), peer_timeout.as_secs_f64()),
                },
                _ => Error::io(format!("TCP lane: connect to rank {r} at {a}"), e),
            })?;
            s.set_read_timeout(Some(left)).ok();
            let nonces = dial_handshake(&mut s, key, me as u32, r as u32, sealed).map_err(|e| Error::Bootstrap(format!("TCP lane to rank {r} at {a}: {e}")))?;
            s.write_all(&(i as u32).to_le_bytes()).map_err(|e| Error::io(format!("TCP lane to rank {r} at {a}"), e))?;
            s.set_read_timeout(None).ok();
            // The stream's index is bound into its keys: a lane whose index was changed on
            // the way fails its first record.
            let seal = sealed.then(|| seal_for(key, me as u32, r as u32, i, &nonces, me as u32));
            streams[r][i] = Some((s, seal));
        }
    }
    for (r, i, s, nonces) in acceptor.join().map_err(|_| Error::Bootstrap("the TCP lane acceptor panicked".into()))?? {
        let seal = sealed.then(|| seal_for(key, r, me as u32, i, &nonces, me as u32));
        streams[r as usize][i] = Some((s, seal));
    }
    Ok(streams)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An acceptor on a port of its own admitting ranks above 0 with `key`; returns its port
    /// and what it admitted.
    fn acceptor(key: Key, within: Duration) -> (u16, std::thread::JoinHandle<Option<u32>>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            accept_handshake(&mut s, &key, 0, false, &|r| r == 1, Instant::now() + within).map(|(r, _)| r)
        });
        (port, h)
    }

    #[test]
    fn lanes_admit_only_ranks_that_know_the_job_key() {
        let key = lane_key("tok", "job");
        let (port, h) = acceptor(key.clone(), Duration::from_secs(20));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        dial_handshake(&mut s, &key, 1, 0, false).unwrap();
        assert_eq!(h.join().unwrap(), Some(1));
        // A dialler that seals and an acceptor that does not refuse each other.
        let (port, h) = acceptor(key.clone(), Duration::from_secs(20));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(dial_handshake(&mut s, &key, 1, 0, true).unwrap_err().contains("SCALEFREE_ENCRYPT"));
        drop(s);
        assert_eq!(h.join().unwrap(), None);
        // Another job's key, or another token: neither side accepts the other.
        for other in [lane_key("tok", "job2"), lane_key("tok2", "job"), lane_key("", "job")] {
            let (port, h) = acceptor(key.clone(), Duration::from_secs(20));
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert!(dial_handshake(&mut s, &other, 1, 0, false).is_err());
            drop(s);
            assert_eq!(h.join().unwrap(), None);
        }
        // The old FNV hello (16 bytes), then nothing: refused once the deadline passes.
        let (port, h) = acceptor(key.clone(), Duration::from_millis(500));
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&[0u8; 16]).unwrap();
        let t0 = Instant::now();
        assert_eq!(h.join().unwrap(), None);
        assert!(t0.elapsed() < Duration::from_secs(30));
        drop(s);
    }

    #[test]
    fn a_lane_handshake_does_not_carry_the_token() {
        const TOKEN: &str = "0123456789abcdef0123456789abcdef";
        let key = lane_key(TOKEN, "job");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let k2 = key.clone();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let r = accept_handshake(&mut s, &k2, 0, false, &|r| r == 1, Instant::now() + Duration::from_secs(5)).map(|(r, _)| r);
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).unwrap();
            (r, rest)
        });
        // Everything the dialler sends, recorded on its way.
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        struct Tap<'a>(&'a mut TcpStream, Vec<u8>);
        let mut tap = Tap(&mut s, Vec::new());
        let mine = crate::auth::nonce().unwrap();
        let mut hello = [0u8; LANE_HELLO_LEN];
        hello[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        hello[4..8].copy_from_slice(&1u32.to_le_bytes());
        hello[8..].copy_from_slice(&mine);
        tap.0.write_all(&hello).unwrap();
        tap.1.extend_from_slice(&hello);
        let mut ch = [0u8; LANE_CHALLENGE_LEN];
        tap.0.read_exact(&mut ch).unwrap();
        let tag = crate::auth::answer(&key, &lane_context(1, 0, false), &mine, &ch).unwrap();
        tap.0.write_all(&tag).unwrap();
        tap.1.extend_from_slice(&tag);
        let sent = tap.1;
        drop(s);
        let (r, _) = h.join().unwrap();
        assert_eq!(r, Some(1));
        for bytes in [&sent[..], &ch[..]] {
            assert!(!bytes.windows(16).any(|w| w == &TOKEN.as_bytes()[..16]));
        }
        // And dial_handshake sends exactly a hello and a tag: 40 + 32 bytes.
        assert_eq!(sent.len(), LANE_HELLO_LEN + crate::auth::TAG_LEN);
    }
}
