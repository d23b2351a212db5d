//! TCP lanes (bulk writes over plain sockets between hosts, `SCALEFREE_TCP_LANES=1` forces
//! them here, where every rank is a thread of this process over UCX): many writes in flight
//! at once, large and small, each raising its own word; a notification after them all.
//! Skipped when no UCX library can be loaded.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use scalefree_testing::ranks;
use scalefree_transport::backends::ucx;
use scalefree_transport::{Device, DeviceOptions, Transport};

#[test]
fn bulk_writes_over_lanes() {
    if let Err(e) = ucx::describe() {
        eprintln!("skipping TCP lane tests: {e}");
        return;
    }
    // The only test of this binary: the setting is read when each device opens its lanes.
    std::env::set_var("SCALEFREE_TCP_LANES", "1");
    let opts = DeviceOptions { timeout: Duration::from_secs(60), transport: Transport::Ucx, ..DeviceOptions::default() };
    ranks(3, "lanes-", opts, |dev| {
        let net = &dev.backend().as_any().downcast_ref::<ucx::Ucx>().expect("the UCX backend").net;
        assert!(net.lanes_active(), "lanes forced on");
        body(dev);
    });
}

fn body(dev: Device) {
    let (me, n) = (dev.rank(), dev.size());
    // Pieces of every kind: below the lane threshold (UCX), inline on the lane, queued.
    let pieces: Vec<usize> = vec![0, 1, 1000, 64 << 10, (64 << 10) + 3, 700_001, 1 << 20, (1 << 20) + 1, 3 << 20, 5_000_000];
    let words = 4096;
    let total: usize = pieces.iter().sum();
    let len = words + total;
    let region = dev.alloc_region(len).unwrap();
    let all = dev.exchange_regions(&region).unwrap();
    let src = dev.alloc_region(total.max(1)).unwrap();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let ch = dev.channel(right).unwrap();
    for round in 1..=3u32 {
        let fill = |k: usize, i: usize, who: u32| (k as u32 * 7 + i as u32 * 13 + who * 101 + round * 31) as u8;
        let s = unsafe { std::slice::from_raw_parts_mut(src.as_ptr(), total) };
        let mut off = 0;
        for (k, &p) in pieces.iter().enumerate() {
            for i in 0..p {
                s[off + i] = fill(k, i % 251, me);
            }
            off += p;
        }
        // Everything in flight at once, then wait for all.
        let mut cs = Vec::new();
        let mut off = 0;
        for (k, &p) in pieces.iter().enumerate() {
            cs.push(unsafe { ch.start_write_raise(src.as_ptr().add(off), &all[right as usize], words + off, p, 4 * k, round).unwrap() });
            off += p;
        }
        for c in cs {
            c.wait().unwrap();
        }
        ch.notify(3, round).unwrap();
        // From the left: each piece's word, then its bytes; then the notification.
        let mut off = 0;
        for (k, &p) in pieces.iter().enumerate() {
            let w = unsafe { &*(region.as_ptr().add(4 * k) as *const AtomicU32) };
            dev.wait_word(w, dev.my_waiters(), |v| v == round, &|| format!("piece {k}")).unwrap();
            let got = unsafe { &region.as_slice()[words + off..words + off + p] };
            for (i, &b) in got.iter().enumerate() {
                assert_eq!(b, fill(k, i % 251, left), "round {round} piece {k} byte {i} from rank {left}");
            }
            off += p;
        }
        assert_eq!(dev.wait(3, Some(Duration::from_secs(30))).unwrap(), round);
        assert_eq!(unsafe { &*(region.as_ptr() as *const AtomicU32) }.load(Ordering::Acquire), round);
        dev.exchange_bytes(&[]).unwrap();
    }
}
