//! An oversized hello is refused before anything is allocated for it: this test binary
//! counts the largest allocation while rank 0 of a TCP rendezvous receives a hello that
//! claims 4 GiB, then lets the real rank 1 join.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use scalefree_transport::bootstrap::rendezvous::Rendezvous;
use scalefree_transport::{JobInfo, Launcher};

struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::SeqCst);
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::SeqCst);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LARGEST.fetch_max(n, Ordering::SeqCst);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn job(rank: u32, port: u16) -> JobInfo {
    JobInfo {
        rank,
        size: 2,
        local_rank: 0,
        local_size: 1,
        job_id: "alloc".into(),
        token: "s3cret".into(),
        launcher: Launcher::Scalefree,
        master: Some(("127.0.0.1".into(), port)),
        sealed: false,
    }
}

#[test]
fn a_4_gib_hello_allocates_nothing() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let host = std::thread::spawn(move || Rendezvous::join(&job(0, port), Duration::from_secs(30)).map(|_| ()));
    let t0 = Instant::now();
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("rank 0 does not listen: {e}"),
        }
    };
    LARGEST.store(0, Ordering::SeqCst);
    s.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let largest = LARGEST.load(Ordering::SeqCst);
    assert!(largest < 1 << 20, "rank 0 allocated {largest} bytes for a hello");
    assert!(String::from_utf8_lossy(&reply).contains("a hello of 4294967295 bytes"), "{reply:?}");
    Rendezvous::join(&job(1, port), Duration::from_secs(20)).unwrap();
    host.join().unwrap().unwrap();
}
