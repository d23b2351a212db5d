//! Mutual challenge and response between two ends that share a job secret.
//!
//! Both ends prove they know the job's secret without sending it: the end that opens the
//! connection (the *initiator*) sends a fresh random nonce with its hello; the other end
//! (the *responder*) answers with a nonce of its own and `HMAC-SHA256(key, "responder",
//! context, both nonces)`; the initiator checks that tag and answers with the same MAC under
//! the label `"initiator"`. Tags are compared in constant time (`hmac`'s `verify_slice`).
//! Fresh nonces on both sides make a recorded exchange useless later, and the labels keep one
//! side's tag from passing as the other's.
//!
//! Keys are derived per job and per purpose: `HMAC-SHA256(secret, purpose ‖ job id)`
//! ([`Key::derive`]); the tags of one connection cover both of its nonces, so every
//! connection proves itself afresh. A connection that is sealed (`SCALEFREE_ENCRYPT=1`, see
//! `docs/security.md`) takes its keys from the same handshake ([`Key::session_keys`]).

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::{Error, Result};

pub const NONCE_LEN: usize = 32;
pub const TAG_LEN: usize = 32;
pub type Nonce = [u8; NONCE_LEN];
pub type Tag = [u8; TAG_LEN];

type HmacSha256 = Hmac<Sha256>;

/// A fresh random nonce from the operating system.
pub fn nonce() -> Result<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| Error::Bootstrap(format!("no randomness for a nonce: {e}")))?;
    Ok(n)
}

/// A key for one purpose of one job.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// `HMAC-SHA256(secret, purpose ‖ 0 ‖ job_id)`.
    pub fn derive(secret: &str, purpose: &str, job_id: &str) -> Key {
        let mut m = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
        m.update(purpose.as_bytes());
        m.update(&[0]);
        m.update(job_id.as_bytes());
        Key(m.finalize().into_bytes().into())
    }

    fn mac_of(&self, label: &str, context: &[u8], initiator: &Nonce, responder: &Nonce) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        // Length-prefixed, so no two different inputs concatenate alike.
        for part in [label.as_bytes(), context, initiator, responder] {
            m.update(&(part.len() as u64).to_le_bytes());
            m.update(part);
        }
        m
    }

    /// The tag one side sends: `label` is `"responder"` or `"initiator"`.
    pub fn tag(&self, label: &str, context: &[u8], initiator: &Nonce, responder: &Nonce) -> Tag {
        self.mac_of(label, context, initiator, responder).finalize().into_bytes().into()
    }

    /// The two keys that seal one connection after its handshake, one per direction:
    /// (initiator to responder, responder to initiator). `HKDF-SHA256` with both nonces as
    /// salt, this key as input and `label ‖ context ‖ direction` as info: every connection
    /// and direction of a job gets keys of its own, and nobody without the job's secret can
    /// compute them from what crossed the wire.
    pub fn session_keys(&self, label: &str, context: &[u8], initiator: &Nonce, responder: &Nonce) -> ([u8; 32], [u8; 32]) {
        let mut salt = [0u8; 2 * NONCE_LEN];
        salt[..NONCE_LEN].copy_from_slice(initiator);
        salt[NONCE_LEN..].copy_from_slice(responder);
        let hk = hkdf::Hkdf::<Sha256>::new(Some(&salt), &self.0);
        let key = |direction: &[u8]| {
            let mut k = [0u8; 32];
            let info = [&(label.len() as u64).to_le_bytes()[..], label.as_bytes(), &(context.len() as u64).to_le_bytes(), context, direction];
            hk.expand_multi_info(&info, &mut k).expect("32 bytes is a valid HKDF-SHA256 length");
            k
        };
        (key(b"initiator to responder"), key(b"responder to initiator"))
    }

    /// Whether `tag` is the other side's tag (constant-time comparison).
    pub fn verify(&self, label: &str, context: &[u8], initiator: &Nonce, responder: &Nonce, tag: &[u8]) -> bool {
        self.mac_of(label, context, initiator, responder).verify_slice(tag).is_ok()
    }
}

pub const RESPONDER: &str = "responder";
pub const INITIATOR: &str = "initiator";

/// What a responder sends: its nonce and its tag.
pub fn challenge(key: &Key, context: &[u8], initiator: &Nonce) -> Result<[u8; NONCE_LEN + TAG_LEN]> {
    let mine = nonce()?;
    let mut out = [0u8; NONCE_LEN + TAG_LEN];
    out[..NONCE_LEN].copy_from_slice(&mine);
    out[NONCE_LEN..].copy_from_slice(&key.tag(RESPONDER, context, initiator, &mine));
    Ok(out)
}

/// The initiator checks a responder's `challenge` and returns its own tag, or `None` when
/// the responder does not know the key.
pub fn answer(key: &Key, context: &[u8], initiator: &Nonce, challenge: &[u8]) -> Option<Tag> {
    if challenge.len() != NONCE_LEN + TAG_LEN {
        return None;
    }
    let theirs: Nonce = challenge[..NONCE_LEN].try_into().unwrap();
    if !key.verify(RESPONDER, context, initiator, &theirs, &challenge[NONCE_LEN..]) {
        return None;
    }
    Some(key.tag(INITIATOR, context, initiator, &theirs))
}

/// The responder checks the initiator's answer to its `challenge`.
pub fn accept(key: &Key, context: &[u8], initiator: &Nonce, challenge: &[u8; NONCE_LEN + TAG_LEN], answer: &[u8]) -> bool {
    let mine: Nonce = challenge[..NONCE_LEN].try_into().unwrap();
    key.verify(INITIATOR, context, initiator, &mine, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_prove_the_key_and_nothing_else_passes() {
        let k = Key::derive("s3cret", "rendezvous", "job1");
        let ni = nonce().unwrap();
        let ch = challenge(&k, b"ctx", &ni).unwrap();
        let ans = answer(&k, b"ctx", &ni, &ch).expect("responder knows the key");
        assert!(accept(&k, b"ctx", &ni, &ch, &ans));
        // Another secret, another job or another purpose: refused both ways.
        for other in [Key::derive("s3cret!", "rendezvous", "job1"), Key::derive("s3cret", "rendezvous", "job2"),
                      Key::derive("s3cret", "lane", "job1")] {
            assert!(answer(&other, b"ctx", &ni, &ch).is_none());
            let theirs = answer(&other, b"ctx", &ni, &challenge(&other, b"ctx", &ni).unwrap()).unwrap();
            assert!(!accept(&k, b"ctx", &ni, &ch, &theirs));
        }
        // A responder's tag does not pass as the initiator's, nor a tag for other nonces.
        assert!(!accept(&k, b"ctx", &ni, &ch, &ch[NONCE_LEN..]));
        assert!(!accept(&k, b"ctx", &nonce().unwrap(), &ch, &ans));
        assert!(!accept(&k, b"ctx2", &ni, &ch, &ans));
        assert!(!accept(&k, b"ctx", &ni, &ch, &ans[..31]));
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }

    #[test]
    fn session_keys_differ_per_direction_connection_and_job() {
        let k = Key::derive("s3cret", "lane", "job1");
        let (a, b) = (nonce().unwrap(), nonce().unwrap());
        let (ab, ba) = k.session_keys("seal", b"ctx", &a, &b);
        assert_eq!((ab, ba), k.session_keys("seal", b"ctx", &a, &b), "both ends compute the same keys");
        assert_ne!(ab, ba);
        let others = [k.session_keys("seal", b"ctx", &b, &a), k.session_keys("seal", b"ctx", &a, &nonce().unwrap()),
                      k.session_keys("seal", b"ctx2", &a, &b), k.session_keys("seal2", b"ctx", &a, &b),
                      Key::derive("s3cret", "lane", "job2").session_keys("seal", b"ctx", &a, &b)];
        for (x, y) in others {
            assert!(![ab, ba].contains(&x) && ![ab, ba].contains(&y));
        }
    }
}
