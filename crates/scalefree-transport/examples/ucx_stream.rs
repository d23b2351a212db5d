//! Raw throughput of one-sided writes over UCX between two ranks (threads of this process):
//! `cargo run --release --example ucx_stream -- [piece_bytes] [total_bytes]`.

use std::time::{Duration, Instant};

use scalefree_transport::{Device, DeviceOptions, JobInfo, Transport};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let piece = *args.first().unwrap_or(&(512 << 10));
    let total = *args.get(1).unwrap_or(&(64 << 20));
    let id = format!("ucx-stream-{}", std::process::id());
    let hs: Vec<_> = (0..2u32)
        .map(|r| {
            let id = id.clone();
            std::thread::spawn(move || {
                let job = JobInfo { rank: r, size: 2, local_rank: r, local_size: 2, job_id: id, token: "t".into(), ..JobInfo::single() };
                let dev = Device::new(job, DeviceOptions { transport: Transport::Ucx, ..DeviceOptions::default() }).unwrap();
                let region = dev.alloc_region(total + 4096).unwrap();
                let all = dev.exchange_regions(&region).unwrap();
                let src = vec![7u8; total];
                for round in 1..=5u32 {
                    dev.exchange_bytes(&[]).unwrap();
                    let t = Instant::now();
                    if r == 0 {
                        let ch = dev.channel(1).unwrap();
                        let mut cs = Vec::new();
                        let np = total.div_ceil(piece);
                        for k in 0..np {
                            let off = k * piece;
                            let n = piece.min(total - off);
                            if std::env::var_os("PUT").is_some() {
                                unsafe { ch.write_from(src.as_ptr().add(off), &all[1], 4096 + off, n).unwrap() };
                            } else {
                                cs.push(unsafe { ch.start_write_raise(src.as_ptr().add(off), &all[1], 4096 + off, n, 4 * (k % 1000), round).unwrap() });
                            }
                        }
                        for c in cs {
                            c.wait().unwrap();
                        }
                        if std::env::var_os("PUT").is_some() {
                            ch.notify(2, round).unwrap();
                        }
                        dev.wait(1, Some(Duration::from_secs(30))).unwrap();
                        let dt = t.elapsed();
                        eprintln!("round {round}: {} MiB in {:.2} ms = {:.2} GB/s", total >> 20, dt.as_secs_f64() * 1e3, total as f64 / dt.as_secs_f64() / 1e9);
                    } else {
                        let np = total.div_ceil(piece);
                        for k in 0..np {
                            if std::env::var_os("PUT").is_some() {
                                break;
                            }
                            let w = unsafe { &*(region.as_ptr().add(4 * (k % 1000)) as *const std::sync::atomic::AtomicU32) };
                            dev.wait_word(w, dev.my_waiters(), |v| v == round, &|| "piece".into()).unwrap();
                        }
                        if std::env::var_os("PUT").is_some() {
                            dev.wait(2, Some(Duration::from_secs(30))).unwrap();
                        }
                        dev.channel(0).unwrap().notify(1, round).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}
