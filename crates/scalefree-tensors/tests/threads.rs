//! Static slots and dynamic channels with ranks as threads: bit-for-bit checks, flow
//! control under a slow receiver, shapes of any rank including empty ones.

use std::time::Duration;

use scalefree_tensors::{DynamicChannel, Meta, StaticSlot, StaticSpec};
use scalefree_testing::{options, ranks};
use scalefree_transport::Device;

fn devices<F>(n: u32, f: F)
where
    F: Fn(Device) + Send + Sync + Clone + 'static,
{
    ranks(n, "tens", options(Duration::from_secs(30)), f);
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn static_slots_deliver_every_message_in_order_under_a_slow_receiver() {
    devices(3, |dev| {
        let specs = [
            StaticSpec { src: 0, dst: 1, nbytes: 100_003 },
            StaticSpec { src: 1, dst: 2, nbytes: 1 },
            StaticSpec { src: 2, dst: 0, nbytes: 4096 },
            StaticSpec { src: 0, dst: 2, nbytes: 0 },
        ];
        let mut slots = StaticSlot::create(&dev, &specs).unwrap();
        let me = dev.rank();
        for (i, s) in slots.iter_mut().enumerate() {
            let Some(s) = s else { continue };
            let n = specs[i].nbytes as usize;
            for m in 0..50u64 {
                if s.is_sender() {
                    s.send(&pattern(i as u64 * 1000 + m, n), None).unwrap();
                } else {
                    let p = s.recv(None).unwrap();
                    if m % 7 == 0 {
                        std::thread::sleep(Duration::from_millis(2)); // the sender must wait
                    }
                    let got = unsafe { std::slice::from_raw_parts(p, n) };
                    assert_eq!(got, &pattern(i as u64 * 1000 + m, n)[..], "rank {me} slot {i} message {m}");
                }
            }
        }
    });
}

#[test]
fn dynamic_channels_carry_any_shape_from_registered_and_plain_memory() {
    devices(2, |dev| {
        let mut chans = DynamicChannel::create(&dev, &[(0, 1), (1, 0)]).unwrap();
        let shapes: Vec<Vec<u64>> = vec![vec![], vec![0], vec![7], vec![3, 0, 5], vec![1000, 33], vec![2; 12], vec![1 << 20]];
        let reg = dev.alloc_region(1 << 21).unwrap();
        for (k, ch) in chans.iter_mut().enumerate() {
            let Some(ch) = ch else { continue };
            for (j, shape) in shapes.iter().enumerate() {
                let meta = Meta { dtype: 7, itemsize: 2, shape: shape.clone() };
                let n = meta.nbytes().unwrap() as usize;
                let data = pattern((k * 100 + j) as u64, n);
                if ch.is_sender() {
                    // Alternate registered and plain sources.
                    let src = if j % 2 == 0 {
                        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), reg.as_ptr(), n) };
                        reg.as_ptr() as *const u8
                    } else {
                        data.as_ptr()
                    };
                    unsafe { ch.send(src, &meta, None).unwrap() };
                    ch.wait_sent(None).unwrap();
                } else {
                    let got = ch.recv_meta(None).unwrap();
                    assert_eq!(got, meta);
                    let mut out = vec![0u8; n];
                    unsafe { ch.recv_into(out.as_mut_ptr(), n).unwrap() };
                    assert_eq!(out, data, "channel {k} shape {shape:?}");
                }
            }
            if ch.is_sender() {
                let (zero, copied, _) = ch.stats().snapshot();
                assert!(zero > 0 && copied > 0, "both paths were used: {zero} {copied}");
            }
        }
    });
}

#[test]
fn bad_specs_are_errors() {
    devices(2, |dev| {
        assert!(StaticSlot::create(&dev, &[StaticSpec { src: 0, dst: 0, nbytes: 4 }]).is_err());
        let spec = StaticSpec { src: 0, dst: 1, nbytes: 8 + dev.rank() as u64 };
        let e = StaticSlot::create(&dev, &[spec]).err().expect("ranks disagree");
        assert!(e.to_string().contains("different specs"), "{e}");
        let mut s = StaticSlot::create(&dev, &[StaticSpec { src: 0, dst: 1, nbytes: 8 }]).unwrap();
        if let Some(s) = s[0].as_mut() {
            if s.is_sender() {
                assert!(s.send(&[0u8; 7], None).is_err());
                assert!(s.recv(None).is_err());
            }
        }
    });
}

/// Back-to-back messages from plain memory (each staged into the same registered buffer):
/// the sender may refill the staging buffer only once the receiver has the previous
/// message's bytes. Every message differs from the next, so a read that sees the next
/// message's bytes fails here.
#[test]
fn staged_messages_back_to_back_each_arrive_intact() {
    let rounds: u64 = std::env::var("TENS_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    devices(2, move |dev| {
        let mut chans = DynamicChannel::create(&dev, &[(0, 1)]).unwrap();
        let Some(ch) = chans[0].as_mut() else { return };
        for (i, n) in [200_000usize, 1, 65_537, 1 << 20].into_iter().enumerate() {
            let meta = Meta { dtype: 1, itemsize: 1, shape: vec![n as u64] };
            for m in 0..rounds {
                let data = pattern(i as u64 * 1_000_000 + m, n);
                if ch.is_sender() {
                    unsafe { ch.send(data.as_ptr(), &meta, None).unwrap() };
                    ch.wait_sent(None).unwrap();
                } else {
                    assert_eq!(ch.recv_meta(None).unwrap(), meta);
                    let mut out = vec![0u8; n];
                    unsafe { ch.recv_into(out.as_mut_ptr(), n).unwrap() };
                    if out != data {
                        let bad = out.iter().zip(&data).filter(|(a, b)| a != b).count();
                        panic!("message {m} of {n} bytes: {bad} bytes differ");
                    }
                }
            }
        }
    });
}
