//! Sealing the connections between hosts (`SCALEFREE_ENCRYPT=1`; `scalefree run --encrypt`
//! sets it for its ranks; see `docs/security.md`): AES-256-GCM records, each `counter (8
//! bytes, little-endian) ‖ ciphertext ‖ tag (16)`.
//!
//! Keys: one per connection and direction, derived from the job's key for the purpose and
//! both nonces of the connection's handshake ([`Key::session_keys`], HKDF-SHA256). A
//! record's nonce is 4 zero bytes ‖ its counter; each direction numbers its records from 0
//! and never reuses a number (a `u64` does not wrap). The counter is also the record's
//! associated data, and the receiver takes only the next number: a replayed or reordered
//! record is refused by name before its tag is even checked, and a modified one fails its
//! tag. Both are `InvalidData` errors whose message says which.
//!
//! Used by the rendezvous over TCP (`bootstrap`, every set-up message one record) and by the
//! TCP lanes (`backends::lanes::sealing`, frames sealed in chunks).
//!
//! AES-256-GCM from `ring`: on this machine's CPU (AES-NI, VAES, VPCLMULQDQ) it seals 3.4-3.7
//! GB/s on one core in 64 KiB records, against 0.4-0.6 GB/s for RustCrypto's `aes-gcm` 0.10
//! and 0.4-0.9 GB/s for ChaCha20-Poly1305 (RustCrypto's or `ring`'s), measured side by side
//! while the machine was busy (`docs/security.md`).

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};

use crate::auth::{Key, Nonce as HandshakeNonce};

/// The tag of a record.
pub const TAG_LEN: usize = 16;
/// What a record adds to its plaintext: the counter and the tag.
pub const OVERHEAD: usize = 8 + TAG_LEN;

/// Whether this rank seals its traffic between hosts (`SCALEFREE_ENCRYPT=1`, `on`, `yes`,
/// `true`).
pub fn enabled() -> bool {
    matches!(std::env::var("SCALEFREE_ENCRYPT").ok().as_deref().map(str::trim), Some("1" | "on" | "yes" | "true"))
}

/// One direction of a sealed connection: its key and the number of its next record.
pub struct Cipher {
    key: LessSafeKey,
    next: u64,
}

impl std::fmt::Debug for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cipher(next {})", self.next)
    }
}

/// Why a sealed record is refused: an `InvalidData` error whose message names what happened.
fn refused(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

impl Cipher {
    pub fn new(key: &[u8; 32]) -> Cipher {
        Cipher { key: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256 key")), next: 0 }
    }

    /// Appends the next record, `plain` sealed, to `out`; returns where its body starts in
    /// `out` and its number.
    pub fn seal_onto(&mut self, out: &mut Vec<u8>, plain: &[u8]) -> (usize, u64) {
        let counter = self.next;
        self.next += 1;
        out.extend_from_slice(&counter.to_le_bytes());
        let body = out.len();
        out.extend_from_slice(plain);
        let tag = self.key.seal_in_place_separate_tag(nonce(counter), Aad::from(counter.to_le_bytes()), &mut out[body..]).expect("a record within AES-GCM's limits");
        out.extend_from_slice(tag.as_ref());
        (body, counter)
    }

    /// Checks that record `counter` is the next one and opens `ct` with `tag` in place.
    pub fn open(&mut self, counter: u64, ct: &mut [u8], tag: &[u8; TAG_LEN]) -> std::io::Result<()> {
        if counter != self.next {
            let what = if counter < self.next { "replayed or reordered" } else { "out of order (records missing)" };
            return Err(refused(format!("a sealed record arrived {what}: record {counter}, expected {}", self.next)));
        }
        self.key
            .open_in_place_separate_tag(nonce(counter), Aad::from(counter.to_le_bytes()), Tag::from(*tag), ct, 0..)
            .map_err(|_| refused(format!("sealed record {counter} failed authentication (modified on the way, or not sealed with this job's key)")))?;
        self.next += 1;
        Ok(())
    }

    /// Opens a whole record (`counter ‖ ciphertext ‖ tag`) in place; returns the plaintext.
    pub fn open_record<'a>(&mut self, rec: &'a mut [u8]) -> std::io::Result<&'a mut [u8]> {
        if rec.len() < OVERHEAD {
            return Err(refused(format!("a sealed record of {} bytes (at least {OVERHEAD})", rec.len())));
        }
        let counter = u64::from_le_bytes(rec[..8].try_into().unwrap());
        let n = rec.len() - OVERHEAD;
        let (body, tag) = rec[8..].split_at_mut(n);
        let tag: [u8; TAG_LEN] = (&*tag).try_into().unwrap();
        self.open(counter, body, &tag)?;
        Ok(body)
    }
}

/// The two directions of one sealed connection after its handshake: (what this end sends
/// with, what it opens with). `initiator`: this end opened the connection. The two ends of a
/// connection get the same pair, crossed.
pub fn session(key: &Key, label: &str, context: &[u8], nonces: (&HandshakeNonce, &HandshakeNonce), initiator: bool) -> (Cipher, Cipher) {
    let (forth, back) = key.session_keys(label, context, nonces.0, nonces.1);
    let (send, recv) = if initiator { (forth, back) } else { (back, forth) };
    (Cipher::new(&send), Cipher::new(&recv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_open_once_in_order_and_only_unmodified() {
        let key = Key::derive("tok", "purpose", "job");
        let (a, b) = (crate::auth::nonce().unwrap(), crate::auth::nonce().unwrap());
        let (mut tx, _) = session(&key, "test", b"ctx", (&a, &b), true);
        let (_, mut rx) = session(&key, "test", b"ctx", (&a, &b), false);
        let mut recs: Vec<Vec<u8>> = Vec::new();
        for msg in [&b"hello"[..], b"", &[7u8; 1000]] {
            let mut out = Vec::new();
            tx.seal_onto(&mut out, msg);
            assert_eq!(out.len(), msg.len() + OVERHEAD);
            assert!(msg.len() < 5 || !out.windows(msg.len()).any(|w| w == msg), "the plaintext shows");
            recs.push(out);
        }
        let mut first = recs[0].clone();
        assert_eq!(rx.open_record(&mut first).unwrap(), b"hello");
        // Replayed: refused by its number, whatever its tag.
        let e = rx.open_record(&mut recs[0].clone()).unwrap_err();
        assert!(e.to_string().contains("replayed or reordered: record 0, expected 1"), "{e}");
        // Skipped ahead (reordered).
        let e = rx.open_record(&mut recs[2].clone()).unwrap_err();
        assert!(e.to_string().contains("out of order"), "{e}");
        // One bit flipped anywhere: refused; the record is still expected.
        for at in [0, 8, recs[1].len() - 1] {
            let mut bad = recs[1].clone();
            bad[at] ^= 1;
            assert!(rx.open_record(&mut bad).is_err(), "flip at {at}");
        }
        assert_eq!(rx.open_record(&mut recs[1].clone()).unwrap(), b"");
        assert_eq!(rx.open_record(&mut recs[2].clone()).unwrap(), &[7u8; 1000][..]);
        // The other direction's key opens nothing of this one.
        let (_, mut wrong) = session(&key, "test", b"ctx", (&a, &b), true);
        assert!(wrong.open_record(&mut recs[0].clone()).unwrap_err().to_string().contains("failed authentication"));
        assert!(rx.open_record(&mut [0u8; 3]).is_err());
    }
}
