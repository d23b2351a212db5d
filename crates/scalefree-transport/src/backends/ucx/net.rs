//! One rank's UCX endpoint set ([`Net`]): context, worker, an endpoint per rank, the state
//! the progress thread, the handlers and callers share ([`Shared`]), and the TCP lanes that
//! carry bulk writes where UCX would use TCP anyway (see [`crate::backends::lanes`]).

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::copies::{am_write, AM_WRITE};
use super::ffi::{self, *};
use super::memory::LocalReg;
use super::notify::{am_notify, AM_NOTIFY};
use super::peers::{am_heartbeat, am_lost, err_cb, peer_timeout, AM_HEARTBEAT, AM_LOST};
use super::progress::{progress_loop, send_cb, Pending, SPIN_CREDIT_MAX};
use crate::backends::lanes::{self, Arrivals};
use crate::backends::Request;
use crate::error::{Error, Result};
use crate::wait::WaitPolicy;

/// Swaps bytes with every rank (all ranks' contributions, by rank).
pub type Exchange<'a> = dyn FnMut(&[u8]) -> Result<Vec<Vec<u8>>> + 'a;

/// The endpoint error handler's argument: the shared state and the peer.
pub(super) type ErrArg = (std::sync::Weak<Shared>, u32);

/// State the progress thread, handlers and callers share.
pub(crate) struct Shared {
    pub(super) ucp: &'static Ucp,
    pub(super) ctx: ucp_context_h,
    pub(super) worker: ucp_worker_h,
    pub(super) me: u32,
    /// An endpoint per rank (this one too: writes to itself go through UCX's `self`).
    pub(super) eps: std::sync::OnceLock<Vec<ucp_ep_h>>,
    /// The error handler's argument per endpoint; freed with the endpoints.
    #[allow(clippy::vec_box)] // boxed: UCX keeps a pointer to each
    pub(super) err_args: Mutex<Vec<Box<ErrArg>>>,
    /// Why each peer was lost (set by the endpoint error handler), if it was.
    pub(super) lost: Vec<Mutex<Option<String>>>,
    pub(super) any_lost: AtomicBool,
    /// The peer lost first: what every error reports (a peer lost later may have stopped
    /// because of it).
    pub(super) first_lost: Mutex<Option<u32>>,
    /// Losses seen here and not yet told to the other peers.
    pub(super) to_announce: Mutex<Vec<u32>>,
    pub(super) announcing: AtomicBool,
    pub(super) regions: Mutex<HashMap<u64, LocalReg>>,
    /// This rank's notification slots and their waiter count (in the device's control
    /// segment, which outlives the progress thread).
    pub(super) slots: *const AtomicU32,
    pub(super) nslots: usize,
    pub(super) waiters: *const AtomicU32,
    pub(super) stop: AtomicBool,
    /// Requests in flight (sends, and rendezvous receives into regions). While any is, the
    /// progress thread sleeps on the event descriptor for at most a millisecond.
    pub(super) inflight: AtomicU32,
    /// Heartbeats: when each peer was last heard from (ms since `epoch`), which peers are
    /// watched (those on other hosts), and after how long silence means lost.
    pub(super) epoch: std::time::Instant,
    pub(super) last_heard: Vec<std::sync::atomic::AtomicU64>,
    pub(super) watched: Mutex<Vec<bool>>,
    pub(super) peer_timeout: std::time::Duration,
    /// Each peer's TCP lane sockets, if it has any (shut down when the peer is lost).
    pub(super) lane_fds: Mutex<Vec<Vec<c_int>>>,
    /// An eventfd that wakes callers parked in `poll` on the lanes ([`Net::wait_reading`])
    /// when another thread raises a word (a lane reader, a UCX handler), and how many are
    /// parked so.
    pub(super) kick_fd: c_int,
    pub(super) pollers: AtomicU32,
    /// [`Net::wait_reading`]'s spin: waits so far, and a credit that spins ending their
    /// wait raise and spins in vain lower.
    pub(super) waits: AtomicU32,
    pub(super) spin_credit: AtomicU32,
}
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        let u = self.ucp;
        unsafe {
            for &ep in self.eps.get().map(|v| v.as_slice()).unwrap_or(&[]) {
                if !ep.is_null() {
                    let mut p = ucp_request_param_t::zeroed();
                    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
                    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
                    let r = (u.ep_close_nbx)(ep, &p);
                    if !r.is_null() && !ptr_is_err(r) {
                        while (u.request_check_status)(r) == UCS_INPROGRESS {
                            (u.worker_progress)(self.worker);
                        }
                        (u.request_free)(r);
                    }
                }
            }
            (u.worker_destroy)(self.worker);
            (u.cleanup)(self.ctx);
            libc::close(self.kick_fd);
        }
    }
}

/// The lanes' view of this rank's UCX state: arriving lane writes land, raise and report
/// losses exactly as UCX's own arrivals do.
impl Arrivals for Shared {
    fn rank(&self) -> u32 {
        self.me
    }
    fn target(&self, key: u64, offset: usize, len: usize) -> Option<(usize, usize, usize)> {
        self.region_target(key, offset, len)
    }
    fn raise(&self, region_addr: usize, region_len: usize, note: u64, index: u64, value: u32) {
        Shared::raise(self, region_addr, region_len, note, index, value)
    }
    fn publish(&self, slot: u32, value: u32) {
        Shared::publish(self, slot, value)
    }
    fn heard_from(&self, peer: u32) {
        if let Some(t) = self.last_heard.get(peer as usize) {
            t.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }
    fn lost(&self, peer: u32, why: String) {
        self.mark_lost(peer as usize, why)
    }
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
    fn lane_opened(&self, peer: u32, fd: std::os::fd::RawFd) {
        self.lane_fds.lock().unwrap()[peer as usize].push(fd);
    }
    fn lanes_closed(&self) {
        self.lane_fds.lock().unwrap().iter_mut().for_each(|f| f.clear());
    }
}

pub(super) fn ucp_static() -> &'static Ucp {
    ffi::ucp().expect("UCX callbacks run only after UCX was loaded")
}

pub(super) unsafe extern "C" fn free_cb(request: *mut c_void, _status: ucs_status_t, _user: *mut c_void) {
    unsafe { (ucp_static().request_free)(request) };
}

/// One rank's UCX endpoint set: context, worker, an endpoint per peer, and the progress
/// thread. Dropping it stops the thread; the UCX objects go when the last region or remote
/// key referring to them does.
pub struct Net {
    pub(crate) shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Plain TCP lanes for bulk writes to peers UCX reaches only over TCP (see [`lanes`]).
    pub(super) lanes: Option<lanes::Lanes>,
    /// Per peer: an operation went to it over UCX since the last flush (see [`Net::notify`]).
    pub(super) unflushed: Vec<AtomicBool>,
}

impl Net {
    /// Collective: creates the worker, swaps worker addresses with every rank through
    /// `exchange` (all ranks' bytes, by rank), and connects to every peer in `reach` (the
    /// others get no UCX endpoint: with sealed lanes, peers on other hosts are reached over
    /// their lane only, and UCX is limited to this host's transports, so it listens on no
    /// network port).
    ///
    /// # Safety
    /// `slots` (`nslots` words) and `waiters` must stay valid until the returned value drops.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn new(
        me: u32,
        size: u32,
        slots: *const AtomicU32,
        nslots: usize,
        waiters: *const AtomicU32,
        reach: &[bool],
        beat: &[bool],
        exchange: &mut Exchange,
    ) -> Result<Net> {
        let u = ffi::ucp()?;
        set_default_env(!reach.iter().all(|&r| r));
        let mut config: *mut ucp_config_t = std::ptr::null_mut();
        u.check(unsafe { (u.config_read)(std::ptr::null(), std::ptr::null(), &mut config) }, "ucp_config_read")?;
        let mut params: ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
        params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
        let name = std::ffi::CString::new(format!("scalefree-r{me}")).unwrap();
        params.name = name.as_ptr();
        let mut ctx: ucp_context_h = std::ptr::null_mut();
        let s = unsafe { (u.init_version)(API_MAJOR, API_MINOR, &params, config, &mut ctx) };
        unsafe { (u.config_release)(config) };
        u.check(s, "ucp_init")?;
        let mut wp: ucp_worker_params_t = unsafe { std::mem::zeroed() };
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_MULTI;
        let mut worker: ucp_worker_h = std::ptr::null_mut();
        let s = unsafe { (u.worker_create)(ctx, &wp, &mut worker) };
        if s != UCS_OK {
            unsafe { (u.cleanup)(ctx) };
            return Err(Error::Unsupported(format!("ucp_worker_create: {}", u.status(s))));
        }
        let mut efd: c_int = -1;
        let s = unsafe { (u.worker_get_efd)(worker, &mut efd) };
        if s != UCS_OK {
            unsafe { (u.worker_destroy)(worker); (u.cleanup)(ctx) };
            return Err(Error::Unsupported(format!("ucp_worker_get_efd: {}", u.status(s))));
        }
        // Our worker address, swapped with every rank.
        let mut attr: ucp_worker_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
        u.check(unsafe { (u.worker_query)(worker, &mut attr) }, "ucp_worker_query")?;
        let addr = unsafe { std::slice::from_raw_parts(attr.address as *const u8, attr.address_length) }.to_vec();
        unsafe { (u.worker_release_address)(worker, attr.address) };
        let all = exchange(&addr)?;
        if all.len() != size as usize {
            return Err(Error::Bootstrap(format!("address exchange returned {} of {size} ranks", all.len())));
        }
        let kick_fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if kick_fd < 0 {
            return Err(Error::io("eventfd for the UCX backend", std::io::Error::last_os_error()));
        }
        let shared = Arc::new(Shared {
            ucp: u,
            ctx,
            worker,
            me,
            eps: std::sync::OnceLock::new(),
            err_args: Mutex::new(Vec::new()),
            lost: (0..size).map(|_| Mutex::new(None)).collect(),
            any_lost: AtomicBool::new(false),
            first_lost: Mutex::new(None),
            to_announce: Mutex::new(Vec::new()),
            announcing: AtomicBool::new(false),
            regions: Mutex::new(HashMap::new()),
            slots,
            nslots,
            waiters,
            stop: AtomicBool::new(false),
            inflight: AtomicU32::new(0),
            epoch: std::time::Instant::now(),
            last_heard: (0..size).map(|_| std::sync::atomic::AtomicU64::new(0)).collect(),
            watched: Mutex::new(vec![false; size as usize]),
            peer_timeout: peer_timeout(),
            lane_fds: Mutex::new(vec![Vec::new(); size as usize]),
            kick_fd,
            pollers: AtomicU32::new(0),
            waits: AtomicU32::new(0),
            spin_credit: AtomicU32::new(SPIN_CREDIT_MAX),
        });
        let weak = Arc::downgrade(&shared);
        let mut eps = vec![std::ptr::null_mut(); size as usize];
        for (r, peer_addr) in all.iter().enumerate() {
            if !reach[r] {
                continue;
            }
            let arg = Box::new((weak.clone(), r as u32));
            let mut ep_params: ucp_ep_params_t = unsafe { std::mem::zeroed() };
            ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep_params.address = peer_addr.as_ptr() as *const c_void;
            ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
            ep_params.err_cb = Some(err_cb);
            ep_params.err_arg = &*arg as *const _ as *mut c_void;
            let mut ep: ucp_ep_h = std::ptr::null_mut();
            if let Err(e) = u.check(unsafe { (u.ep_create)(worker, &ep_params, &mut ep) }, &format!("ucp_ep_create to rank {r}")) {
                let _ = shared.eps.set(eps);
                return Err(e);
            }
            eps[r] = ep;
            shared.err_args.lock().unwrap().push(arg);
        }
        let _ = shared.eps.set(eps);
        // Active-message handlers get the shared state as their argument.
        for (id, cb) in [(AM_NOTIFY, am_notify as AmCb), (AM_WRITE, am_write as AmCb), (AM_HEARTBEAT, am_heartbeat as AmCb), (AM_LOST, am_lost as AmCb)] {
            let hp = ucp_am_handler_param_t {
                field_mask: UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
                id,
                flags: UCP_AM_FLAG_WHOLE_MSG,
                cb: Some(cb),
                arg: Arc::as_ptr(&shared) as *mut c_void,
            };
            u.check(unsafe { (u.worker_set_am_recv_handler)(worker, &hp) }, "ucp_worker_set_am_recv_handler")?;
        }
        let th = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sf-ucx-progress-{me}"))
            .spawn(move || progress_loop(&th, efd))
            .map_err(|e| Error::io("spawn UCX progress thread", e))?;
        let net = Net { shared, thread: Some(thread), lanes: None, unflushed: (0..size).map(|r| AtomicBool::new(reach[r as usize])).collect() };
        // Peers in `beat` are watched from here on: a flush to a host cut off ends within the
        // peer timeout (UCX's own transport would not fail it for minutes).
        net.watch(beat.to_vec());
        // Wire up every endpoint before anyone relies on it (connection set-up is lazy).
        for r in 0..size {
            if r != me && reach[r as usize] {
                net.flush(r)?;
            }
        }
        exchange(&[])?;
        Ok(net)
    }

    pub fn ucp(&self) -> &'static Ucp {
        self.shared.ucp
    }

    pub(super) fn ep(&self, peer: u32) -> Result<ucp_ep_h> {
        self.shared.eps.get().and_then(|v| v.get(peer as usize)).copied().filter(|e| !e.is_null())
            .ok_or_else(|| Error::InvalidArgument(format!("no UCX endpoint to rank {peer}")))
    }

    /// Issues one request and waits for its local completion (buffers reusable).
    pub(super) fn run(&self, peer: u32, what: &str, policy: &WaitPolicy, issue: &mut dyn FnMut(&ucp_request_param_t) -> ucs_status_ptr_t) -> Result<()> {
        match self.start(peer, what, issue)? {
            None => Ok(()),
            Some(req) => self.wait_request(&req, policy),
        }
    }

    /// Issues one request; `None` when it completed at once.
    pub(super) fn start(&self, peer: u32, what: &str, issue: &mut dyn FnMut(&ucp_request_param_t) -> ucs_status_ptr_t) -> Result<Option<Request>> {
        // Before it is issued: a flush that sees it clear was issued after this operation.
        if let Some(f) = self.unflushed.get(peer as usize) {
            f.store(true, Ordering::SeqCst);
        }
        self.start_unmarked(peer, what, issue)
    }

    /// [`Net::start`] without marking `peer` unflushed (for the flush itself).
    pub(super) fn start_unmarked(&self, peer: u32, what: &str, issue: &mut dyn FnMut(&ucp_request_param_t) -> ucs_status_ptr_t) -> Result<Option<Request>> {
        self.shared.inflight.fetch_add(1, Ordering::SeqCst);
        let pending = Arc::new(Pending::new(Some(self.shared.clone()), None));
        let mut p = ucp_request_param_t::zeroed();
        p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        p.cb = send_cb as *const c_void;
        let user = Arc::into_raw(pending.clone());
        p.user_data = user as *mut c_void;
        let r = issue(&p);
        if r.is_null() || ptr_is_err(r) {
            // No callback will run: undo its share.
            drop(unsafe { Arc::from_raw(user) });
            self.shared.inflight.fetch_sub(1, Ordering::SeqCst);
            if r.is_null() {
                return Ok(None);
            }
            return Err(self.lost_error(peer, what, ptr_status(r)));
        }
        Ok(Some(Request { op: pending, peer, what: what.to_string(), helper: None }))
    }

    /// Collective: opens TCP lanes (see [`lanes`]) to the peers in `remote` (true: on another
    /// host), listening on `ip`; writes to a peer go over its lane when UCX reaches it only
    /// over TCP (or always, with `SCALEFREE_TCP_LANES=1`). `SCALEFREE_TCP_LANES=0`: none.
    /// With `SCALEFREE_ENCRYPT=1` every lane is sealed and every peer on another host is
    /// reached over its lane, whatever UCX offers (lanes cannot be turned off then), and
    /// every rank must have the same setting.
    #[allow(clippy::too_many_arguments)]
    /// `alive` fails when a peer is lost meanwhile (the set-up's waits check it).
    #[allow(clippy::too_many_arguments)]
    pub fn open_lanes(&mut self, ip: std::net::IpAddr, remote: &[bool], token: &str, job_id: &str, sealed: bool, timeout: std::time::Duration,
                      alive: lanes::Alive, exchange: &mut Exchange) -> Result<()> {
        let setting = match lanes::setting() {
            None if sealed && remote.iter().any(|&r| r) => {
                return Err(Error::InvalidArgument("SCALEFREE_ENCRYPT=1 sends traffic between hosts over sealed TCP lanes: SCALEFREE_TCP_LANES=0 turns them off; unset one of them".into()));
            }
            _ if sealed => Some(true),
            s => s,
        };
        let listener = match setting {
            Some(_) if remote.iter().any(|&r| r) => Some(lanes::Listener::bind(ip, sealed)?),
            _ => None,
        };
        // Each rank's address and stream count: a pair opens the smaller count of streams.
        let mine = listener.as_ref().map(|l| l.offer.encode()).unwrap_or_default();
        let all = exchange(mine.as_bytes())?;
        let offers: Vec<Option<lanes::Offer>> = all.iter().map(|b| lanes::Offer::parse(b)).collect();
        // Sealing: all ranks alike (a rank of another host that offers no lane does not seal).
        let me = self.shared.me as usize;
        if let Some(r) = (0..remote.len()).find(|&r| remote[r] && offers[r].is_some_and(|o| o.sealed) != sealed) {
            let on = |b: bool| if b { "SCALEFREE_ENCRYPT=1" } else { "no SCALEFREE_ENCRYPT" };
            return Err(Error::Bootstrap(format!(
                "rank {r} runs with {} and rank {me} with {}: set SCALEFREE_ENCRYPT alike for every rank (scalefree run --encrypt does)",
                on(!sealed), on(sealed))));
        }
        let Some(listener) = listener else { return Ok(()) };
        let connect: Vec<bool> = (0..remote.len()).map(|r| remote[r] && offers[r].is_some()).collect();
        let mut l = lanes::Lanes::open(self.shared.clone(), listener, &offers, &connect, &lanes::lane_key(token, job_id), sealed, timeout, alive)?;
        for (r, &wanted) in connect.iter().enumerate() {
            if wanted {
                let tcp_only = self.transports(r as u32).map(|t| !t.is_empty() && t.iter().all(|x| x.starts_with("tcp/"))).unwrap_or(false);
                l.use_for(r, setting == Some(true) || tcp_only);
            }
        }
        self.lanes = Some(l);
        Ok(())
    }

    /// Whether bulk writes to some peer go over TCP lanes.
    pub fn lanes_active(&self) -> bool {
        self.lanes.as_ref().is_some_and(|l| l.active())
    }

    /// Direct landing of lane writes (see [`lanes::Landing::set`]); nothing lands directly
    /// without lanes.
    ///
    /// # Safety
    /// As [`lanes::Landing::set`].
    pub unsafe fn set_direct(&self, key: u64, windows: &[crate::backends::Window], flag_delta: usize) {
        if let Some(l) = &self.lanes {
            unsafe { l.set_direct(key, windows, flag_delta) }
        }
    }

    /// Ends direct landing (see [`lanes::Landing::clear`]).
    pub fn clear_direct(&self, timeout: std::time::Duration) {
        if let Some(l) = &self.lanes {
            l.clear_direct(timeout)
        }
    }

    /// Bytes received by direct landing since this device opened: (copied, reduced).
    pub fn direct_landed_bytes(&self) -> (u64, u64) {
        self.lanes.as_ref().map_or((0, 0), |l| l.landed_bytes())
    }

    /// The transports (`name/device`) the endpoint to `peer` uses, e.g. `["tcp/eth0"]`;
    /// `["lane/sealed"]` for a peer reached over its sealed TCP lane only (no UCX endpoint).
    pub fn transports(&self, peer: u32) -> Result<Vec<String>> {
        if self.lanes.as_ref().is_some_and(|l| l.sealed() && l.has(peer)) {
            return Ok(vec!["lane/sealed".into()]);
        }
        let ep = self.ep(peer)?;
        let u = self.shared.ucp;
        let mut attr: ucp_ep_attr_t = unsafe { std::mem::zeroed() };
        attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
        attr.entry_size = std::mem::size_of::<ucp_transport_entry_t>();
        let mut storage: Vec<ucp_transport_entry_t> = (0..16).map(|_| ucp_transport_entry_t { transport_name: std::ptr::null(), device_name: std::ptr::null() }).collect();
        attr.entries = storage.as_mut_ptr();
        attr.num_entries = storage.len() as u32;
        u.check(unsafe { (u.ep_query)(ep, &mut attr) }, "ucp_ep_query")?;
        let mut out = Vec::new();
        for e in storage.iter().take(attr.num_entries as usize) {
            let s = |p: *const std::ffi::c_char| if p.is_null() { String::from("?") } else { unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned() };
            let t = format!("{}/{}", s(e.transport_name), s(e.device_name));
            if !out.contains(&t) {
                out.push(t);
            }
        }
        Ok(out)
    }

    pub fn rank(&self) -> u32 {
        self.shared.me
    }
}


impl Drop for Net {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(mut l) = self.lanes.take() {
            l.close();
        }
        unsafe { (self.shared.ucp.worker_signal)(self.shared.worker) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Defaults that make a dead peer an error within seconds rather than minutes (each only
/// when the user did not set it). `local_only`: UCX reaches no other host (sealed lanes do),
/// so its only network device is the loopback (`UCX_NET_DEVICES=lo`, unless set): its
/// listener is out of reach of other hosts. (Shared-memory transports alone would not do:
/// UCX's peer-failure handling needs a network transport.)
pub(super) fn set_default_env(local_only: bool) {
    if local_only && std::env::var_os("UCX_NET_DEVICES").is_none() {
        // Only read by UCX at ucp_config_read, on this thread, before other threads use it.
        std::env::set_var("UCX_NET_DEVICES", "lo");
    }
    if let (Some(name), None) = (crate::config::ifname(), std::env::var_os("UCX_NET_DEVICES")) {
        // The interface the user chose for traffic between hosts (shared memory is not a net device).
        std::env::set_var("UCX_NET_DEVICES", &name);
    }
    for (k, v) in [
        ("UCX_TCP_KEEPIDLE", "2s"),
        ("UCX_TCP_KEEPINTVL", "1s"),
        ("UCX_TCP_KEEPCNT", "5"),
        ("UCX_KEEPALIVE_INTERVAL", "2s"),
        // Fewer, larger socket reads and writes for bulk data (measured: faster at 512 KiB
        // pieces on 2 cores).
        ("UCX_TCP_TX_SEG_SIZE", "256k"),
        ("UCX_TCP_RX_SEG_SIZE", "256k"),
    ] {
        if std::env::var_os(k).is_none() {
            // Only read by UCX at ucp_config_read, on this thread, before other threads use it.
            std::env::set_var(k, v);
        }
    }
}
