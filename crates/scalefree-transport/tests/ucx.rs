//! The device API over UCX, with ranks as threads of one process (each its own UCX context).
//! Skipped, with the reason printed, when no UCX library can be loaded (set
//! `SCALEFREE_UCX_LIB` to the folder of `libucp.so.0`, e.g. the `libucx` wheel's `lib`).

use std::time::Duration;

use scalefree_testing::ranks;
use scalefree_transport::backends::ucx;
use scalefree_transport::{Device, DeviceOptions, Transport};

fn ucx_or_skip() -> bool {
    match ucx::describe() {
        Ok(d) => {
            eprintln!("using {d}");
            true
        }
        Err(e) => {
            eprintln!("skipping UCX tests: {e}");
            false
        }
    }
}

/// Runs `f(device)` on `size` ranks (threads) joined over UCX.
fn run<F>(size: u32, tag: &str, f: F)
where
    F: Fn(Device) + Send + Sync + Clone + 'static,
{
    let opts = DeviceOptions { timeout: Duration::from_secs(60), transport: Transport::Ucx, ..DeviceOptions::default() };
    ranks(size, &format!("ucx-{tag}-"), opts, move |dev| {
        assert_eq!(dev.transport_name(), "ucx");
        f(dev)
    });
}

/// A small deterministic generator (no dependency for tests).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn write_notify_read_and_ordering() {
    if !ucx_or_skip() {
        return;
    }
    run(3, "rw", |dev| {
        let me = dev.rank();
        let n = dev.size();
        let len = 1 << 20;
        let region = dev.alloc_region(len).unwrap();
        let all = dev.exchange_regions(&region).unwrap();
        let right = (me + 1) % n;
        let left = (me + n - 1) % n;
        let ch = dev.channel(right).unwrap();
        let src = dev.alloc_region(len).unwrap();
        let mut rng = Lcg(7 + me as u64);
        // Randomised sizes and offsets, alternating one-message write_notify and
        // put + flush + notify; the receiver checks the bytes when it sees the notification.
        for i in 1..=120u32 {
            let size = match i % 4 {
                0 => (rng.next() as usize) % 64,
                1 => (rng.next() as usize) % 4096,
                2 => (rng.next() as usize) % (64 << 10),
                _ => (rng.next() as usize) % (len / 2),
            };
            let off = (rng.next() as usize) % (len - size);
            let fill = (i as u8).wrapping_mul(31).wrapping_add(me as u8);
            unsafe { std::ptr::write_bytes(src.as_ptr(), fill, size) };
            if i % 2 == 0 {
                ch.write_notify(&src, 0, &all[right as usize], off, size, 7, i).unwrap().wait().unwrap();
            } else {
                ch.write(&src, 0, &all[right as usize], off, size).unwrap().wait().unwrap();
                ch.notify(7, i).unwrap();
            }
            // Receive the same step from the left neighbour.
            let v = dev.wait(7, Some(Duration::from_secs(30))).unwrap();
            assert_eq!(v, i, "notification order");
            let mut lrng = Lcg(7 + left as u64);
            // Replay the left rank's generator up to step i to learn its size and offset.
            let (mut lsize, mut loff) = (0, 0);
            for j in 1..=i {
                lsize = match j % 4 {
                    0 => (lrng.next() as usize) % 64,
                    1 => (lrng.next() as usize) % 4096,
                    2 => (lrng.next() as usize) % (64 << 10),
                    _ => (lrng.next() as usize) % (len / 2),
                };
                loff = (lrng.next() as usize) % (len - lsize);
            }
            let lfill = (i as u8).wrapping_mul(31).wrapping_add(left as u8);
            let got = unsafe { &region.as_slice()[loff..loff + lsize] };
            assert!(got.iter().all(|&b| b == lfill), "step {i}: data from rank {left} not in place before its notification");
            // Everyone has checked before the next step overwrites.
            dev.exchange_bytes(&[]).unwrap();
        }
        // One-sided read of the right neighbour's region.
        let dst = dev.alloc_region(4096).unwrap();
        unsafe { std::ptr::write_bytes(region.as_ptr(), 0x40 + me as u8, 4096) };
        dev.exchange_bytes(&[]).unwrap();
        ch.read(&all[right as usize], 0, &dst, 0, 4096).unwrap().wait().unwrap();
        assert!(unsafe { dst.as_slice() }.iter().all(|&b| b == 0x40 + right as u8));
        let t = dev.backend().routes(right).unwrap();
        assert!(!t.is_empty());
        eprintln!("rank {me} -> {right}: {t:?}");
        dev.exchange_bytes(&[]).unwrap();
    });
}

#[test]
fn bad_writes_are_errors() {
    if !ucx_or_skip() {
        return;
    }
    run(2, "bad", |dev| {
        let region = dev.alloc_region(4096).unwrap();
        let all = dev.exchange_regions(&region).unwrap();
        let peer = 1 - dev.rank();
        let ch = dev.channel(peer).unwrap();
        assert!(ch.write(&region, 0, &all[peer as usize], 4000, 200).is_err());
        assert!(ch.write_notify(&region, 0, &all[peer as usize], 0, 10, 5000, 1).is_err());
        assert!(ch.notify(3, 0).is_err());
        // A region of another rank through the wrong channel.
        assert!(ch.write(&region, 0, &all[dev.rank() as usize], 0, 10).is_err());
        dev.exchange_bytes(&[]).unwrap();
    });
}

/// A rank that leaves as soon as it has its data: the sender's write still completes
/// (its completion may need the receiver's acknowledgement, which the receiver's departure
/// must not drop), at sizes sent eagerly and by rendezvous.
#[test]
fn a_receiver_that_leaves_at_once_does_not_fail_the_sender() {
    if !ucx_or_skip() {
        return;
    }
    let rounds: usize = std::env::var("LEAVE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    for round in 0..rounds {
        for len in [100usize, 300_000, 4 << 20] {
            run(2, "leave", move |dev| {
                let region = dev.alloc_region(len).unwrap();
                let all = dev.exchange_regions(&region).unwrap();
                if dev.rank() == 1 {
                    let src = dev.alloc_region(len).unwrap();
                    unsafe { std::ptr::write_bytes(src.as_ptr(), 0x5a, len) };
                    let ch = dev.channel(0).unwrap();
                    ch.write_notify(&src, 0, &all[0], 0, len, 3, 1).unwrap().wait()
                        .unwrap_or_else(|e| panic!("round {round}, {len} bytes: the sender failed after the receiver left: {e}"));
                } else {
                    assert_eq!(dev.wait(3, Some(Duration::from_secs(30))).unwrap(), 1);
                    assert!(unsafe { region.as_slice() }.iter().all(|&b| b == 0x5a));
                }
            });
        }
    }
}
