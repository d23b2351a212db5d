//! Striping large posted writes over several sockets per peer pair, and the fences that keep
//! notes and notifications behind every earlier write.

use std::net::SocketAddr;
use std::sync::{Condvar, Mutex};

/// Posted writes without a note from this size on are striped over a peer's streams (when
/// `SCALEFREE_TCP_LANE_STREAMS` > 1).
pub(super) const STRIPE_MIN: usize = 256 << 10;

/// Striping (N > 1 streams: the smaller of the pair's two `SCALEFREE_TCP_LANE_STREAMS`, see
/// [`Offer`]): a peer pair has N sockets, each with its own writer and reader thread. Posted writes without a note of at least [`STRIPE_MIN`]
/// bytes go round-robin to the N streams (queued, so they progress in parallel); every other
/// frame goes on the first stream. Before the first such frame after a striped write, a
/// fence numbered F is queued on every extra stream and on the first one: the first
/// stream's reader reads on past it only once every extra stream's reader has read its
/// fence F, so a note or notification is still raised after every earlier write landed.
/// Posted writes to one peer may land in any order among themselves.
#[derive(Default)]
pub(super) struct Stripe {
    pub(super) next: usize,
    pub(super) dirty: bool,
    pub(super) fence: u64,
}

/// The highest fence read on each extra stream of a peer (index 0 unused); `u64::MAX` once
/// the stream closed or broke.
pub(super) struct Fences {
    pub(super) seen: Mutex<Vec<u64>>,
    pub(super) cv: Condvar,
}

/// The most sockets a peer pair may use.
pub(super) const MAX_STREAMS: usize = 8;

/// Sockets a rank offers each peer unless `SCALEFREE_TCP_LANE_STREAMS` says otherwise: one
/// (striping off). Between 2 simulated hosts on 2 cores, 4 streams did not make 8 posted
/// 1 MiB writes reliably faster than one (`docs/benchmarks/collectives.md`, "Striped lanes").
pub(super) const DEFAULT_STREAMS: usize = 1;

/// The number of sockets this rank offers each peer (`SCALEFREE_TCP_LANE_STREAMS`, 1..=8,
/// default [`DEFAULT_STREAMS`]). A pair uses the smaller of its two offers (see [`Offer`]).
pub(super) fn streams() -> usize {
    std::env::var("SCALEFREE_TCP_LANE_STREAMS").ok().and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(DEFAULT_STREAMS).clamp(1, MAX_STREAMS)
}

/// What a rank tells every other rank before the lanes open: where it listens, how many
/// streams it offers and whether it seals them, as `"ADDR STREAMS"` or `"ADDR STREAMS
/// sealed"`. Both ends of a pair read both offers and use the smaller count
/// ([`Offer::agree`]), so ranks with different settings still agree; on sealing they must
/// agree (checked before the lanes open).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Offer {
    pub addr: SocketAddr,
    pub streams: usize,
    pub sealed: bool,
}

impl Offer {
    pub fn encode(&self) -> String {
        format!("{} {}{}", self.addr, self.streams, if self.sealed { " sealed" } else { "" })
    }

    /// `None` for a rank that offers no lane (empty) or sent something else.
    pub fn parse(b: &[u8]) -> Option<Offer> {
        let mut it = std::str::from_utf8(b).ok()?.split_ascii_whitespace();
        let addr = it.next()?.parse().ok()?;
        let streams = it.next()?.parse::<usize>().ok().filter(|&k| (1..=MAX_STREAMS).contains(&k))?;
        let sealed = match it.next() {
            None => false,
            Some("sealed") => true,
            Some(_) => return None,
        };
        it.next().is_none().then_some(Offer { addr, streams, sealed })
    }

    /// The streams a pair uses: the smaller offer.
    pub fn agree(mine: usize, theirs: usize) -> usize {
        mine.min(theirs).clamp(1, MAX_STREAMS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_agrees_on_the_smaller_stream_count() {
        let addr: SocketAddr = "10.0.0.2:4711".parse().unwrap();
        let o = Offer { addr, streams: 4, sealed: false };
        assert_eq!(Offer::parse(o.encode().as_bytes()), Some(o));
        let sealed = Offer { sealed: true, ..o };
        assert_eq!(Offer::parse(sealed.encode().as_bytes()), Some(sealed));
        assert_eq!(Offer::parse(b"[::1]:9 8"), Some(Offer { addr: "[::1]:9".parse().unwrap(), streams: 8, sealed: false }));
        // No lane offered, or not an offer: no lane to that rank.
        for bad in [&b""[..], b"10.0.0.2:4711", b"10.0.0.2:4711 0", b"10.0.0.2:4711 9", b"10.0.0.2:4711 4 4", b"10.0.0.2:4711 4 sealed x", b"x 4", b"\xff"] {
            assert_eq!(Offer::parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        for (a, b, k) in [(1, 1, 1), (1, 4, 1), (4, 1, 1), (4, 8, 4), (8, 8, 8), (3, 5, 3)] {
            assert_eq!(Offer::agree(a, b), k);
            assert_eq!(Offer::agree(b, a), k);
        }
    }
}
