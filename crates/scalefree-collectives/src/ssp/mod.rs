//! Stale-synchronous allreduce: an allreduce that may use other ranks' data up to `slack`
//! clocks old instead of waiting for it.
//!
//! A call contributes an *increment*; the result is the reduction of every contribution
//! made so far by every rank (the "history of contributions" formulation: with `sum`, the
//! model state). The caller's own contributions are always in its result; other ranks'
//! may be missing their last `slack` clocks. Nothing is lost: once every rank has called
//! [`SspReduction::flush`], every rank holds the exact reduction of all contributions.
//!
//! Three designs (see `docs/algorithms.md`):
//!
//! * [`Variant::Hypercube`] — recursive doubling where each step reuses the last partial
//!   received from its partner while it is fresh enough (`hypercube.rs`).
//! * [`Variant::Sharded`] and its Async/Thread variants — every rank hosts one shard of a
//!   parameter server; workers push *missed contributions* only when every shard can take
//!   them, shards push state only after an update from each worker (`sharded.rs`).
//! * [`Variant::Ring`] — a segmented ring whose prefix and suffix chains reuse partials
//!   while fresh enough: bandwidth-optimal for large vectors (`ring.rs`).

mod delta;
mod hypercube;
pub(crate) mod mailbox;
mod ring;
mod sharded;

use std::time::Instant;

use scalefree_transport::{Device, Error, Result};
pub(crate) use scalefree_transport::mesh::{Mesh, MESH_HEADER};

pub(crate) use crate::reduce::fill_identity;
use crate::reduce::{reduce3, reduce4, reduce4_into, reduce_into, reduce_update, DType, ReduceOp};

/// Which SSP design a reduction uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Variant {
    Hypercube = 1,
    /// Shards deliver state only after one update from every worker; workers replace all
    /// shards of their view at once (every shard holds the same set of contributions).
    Sharded = 2,
    /// Per-shard staleness: shards reduce each update on arrival and push state whenever
    /// its age grows; workers use each shard as it arrives.
    ShardedAsync = 3,
    /// `Sharded` with the shard served by a background thread.
    ShardedThread = 4,
    /// `ShardedAsync` with the shard served by a background thread.
    ShardedAsyncThread = 5,
    /// A segmented ring, bandwidth-optimal for large vectors: each segment's prefix and
    /// suffix chains reuse a partial up to `slack` clocks old (`ring.rs`).
    Ring = 6,
}

impl Variant {
    pub const ALL: [Variant; 6] = [
        Variant::Hypercube,
        Variant::Sharded,
        Variant::ShardedAsync,
        Variant::ShardedThread,
        Variant::ShardedAsyncThread,
        Variant::Ring,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Hypercube => "hypercube",
            Variant::Sharded => "sharded",
            Variant::ShardedAsync => "sharded_async",
            Variant::ShardedThread => "sharded_thread",
            Variant::ShardedAsyncThread => "sharded_async_thread",
            Variant::Ring => "ring",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        let t = s.replace('-', "_").to_ascii_lowercase();
        Variant::ALL.into_iter().find(|v| v.name() == t).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "unknown SSP variant {s:?}: expected one of auto, hypercube, sharded, sharded_async, sharded_thread, sharded_async_thread, ring"
            ))
        })
    }
    /// The variant `"auto"` stands for: the ring for vectors of at least `ring_min_bytes`
    /// over three ranks or more (it sends `2(p-1)/p` of the vector per call where the
    /// others move whole vectors), `ShardedAsyncThread` otherwise. By default
    /// `ring_min_bytes` is `usize::MAX`: no run here found a size where the ring is faster.
    pub fn auto(p: usize, nbytes: usize, ring_min_bytes: usize) -> Variant {
        if p >= 3 && nbytes >= ring_min_bytes {
            Variant::Ring
        } else {
            Variant::ShardedAsyncThread
        }
    }
    /// [`Variant::parse`], with `"auto"` resolved by [`Variant::auto`].
    pub fn resolve(s: &str, p: usize, nbytes: usize, ring_min_bytes: usize) -> Result<Self> {
        if s.eq_ignore_ascii_case("auto") {
            Ok(Variant::auto(p, nbytes, ring_min_bytes))
        } else {
            Variant::parse(s)
        }
    }
    /// True when every shard of a result holds the same set of contributions.
    pub fn consistent(self) -> bool {
        matches!(self, Variant::Sharded | Variant::ShardedThread)
    }
}

/// Default of `SCALEFREE_SSP_RING_MIN_BYTES`: `"auto"` never takes the ring. On one host
/// (and across hosts simulated on one machine) a sharded variant or the hypercube was faster
/// than the ring at every size measured (`docs/benchmarks/ssp.md`); the ring's fewer bytes on
/// the wire would pay on real links, which no run here had. Set the variable to opt in.
pub const RING_MIN_BYTES: usize = usize::MAX;

/// `SCALEFREE_SSP_RING_MIN_BYTES` (bytes), or [`RING_MIN_BYTES`].
pub fn ring_min_bytes() -> usize {
    std::env::var("SCALEFREE_SSP_RING_MIN_BYTES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(RING_MIN_BYTES)
}

/// In which order a worker of the sharded variants pushes to the shards (and a shard
/// delivers to the workers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum PushOrder {
    /// Rank `r` starts at shard `r + 1` (mod p) and ends with its own: no shard is hit by
    /// every rank at once (the SSP paper's push order; the default).
    Cyclic = 1,
    /// Every rank goes 0..p-1, so all ranks hit shard 0 first (kept to measure against).
    Fixed = 2,
}

impl PushOrder {
    pub fn name(self) -> &'static str {
        match self {
            PushOrder::Cyclic => "cyclic",
            PushOrder::Fixed => "fixed",
        }
    }
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "cyclic" => Ok(PushOrder::Cyclic),
            "fixed" => Ok(PushOrder::Fixed),
            _ => Err(Error::InvalidArgument(format!("unknown SSP push order {s:?}: expected cyclic or fixed"))),
        }
    }
    /// The peers `me` visits, in order, out of `p`.
    pub fn sequence(self, me: usize, p: usize) -> Vec<usize> {
        match self {
            PushOrder::Cyclic => (1..=p).map(|i| (me + i) % p).collect(),
            PushOrder::Fixed => (0..p).collect(),
        }
    }
}

/// What one call did, for the metrics the bench harness plots.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallStats {
    /// The caller's clock after the call (1 for the first call).
    pub clock: u64,
    /// Wall time inside the call.
    pub seconds: f64,
    /// Part of it spent blocked waiting for fresh data.
    pub wait_seconds: f64,
    /// `clock - age` of the oldest data used (0 when every rank's data is current).
    pub age_diff: u64,
}

/// A stale-synchronous reduction of `count` elements, set up once (collectively) and
/// called any number of times. Several may be live at once.
pub struct SspReduction {
    engine: Engine,
    count: usize,
    dtype: DType,
    op: ReduceOp,
    variant: Variant,
    order: PushOrder,
    clock: u64,
    flushed: bool,
    stats: Vec<CallStats>,
    /// Set by the first call: whether the reduction runs in delta mode
    /// ([`SspReduction::allreduce_delta`]) or returns results ([`SspReduction::allreduce`]).
    delta: Option<bool>,
    /// Delta mode off the two-rank path: the previous result, and a buffer for the next.
    prev: Option<(Buf, Buf)>,
}

enum Engine {
    Hypercube(hypercube::Hypercube),
    Sharded(sharded::Sharded),
    Ring(ring::Ring),
}

impl SspReduction {
    /// Collective: every rank of `dev` calls it with the same arguments (cyclic push order).
    pub fn new(dev: &Device, count: usize, dtype: DType, op: ReduceOp, variant: Variant) -> Result<Self> {
        Self::with_order(dev, count, dtype, op, variant, PushOrder::Cyclic)
    }

    /// [`SspReduction::new`] with the sharded variants' push order chosen.
    pub fn with_order(dev: &Device, count: usize, dtype: DType, op: ReduceOp, variant: Variant, order: PushOrder) -> Result<Self> {
        if dtype == DType::U8 {
            return Err(Error::InvalidArgument("uint8 buffers cannot be reduced".into()));
        }
        let mut mine = Vec::with_capacity(24);
        mine.extend_from_slice(&(count as u64).to_le_bytes());
        mine.extend_from_slice(&(dtype as u32).to_le_bytes());
        mine.extend_from_slice(&(op as u32).to_le_bytes());
        mine.extend_from_slice(&(variant as u32).to_le_bytes());
        mine.extend_from_slice(&(order as u32).to_le_bytes());
        let all = dev.exchange_bytes(&mine)?;
        for (r, theirs) in all.iter().enumerate() {
            if *theirs != mine {
                let c = u64::from_le_bytes(theirs[0..8].try_into().unwrap());
                let d = DType::from_u32(u32::from_le_bytes(theirs[8..12].try_into().unwrap())).map_or("?", |d| d.name());
                let o = ReduceOp::from_u32(u32::from_le_bytes(theirs[12..16].try_into().unwrap())).map_or("?", |o| o.name());
                let v = u32::from_le_bytes(theirs[16..20].try_into().unwrap());
                let v = Variant::ALL.iter().find(|x| **x as u32 == v).map_or("?", |x| x.name());
                let po = if u32::from_le_bytes(theirs[20..24].try_into().unwrap()) == PushOrder::Fixed as u32 { "fixed" } else { "cyclic" };
                return Err(Error::Mismatch(format!(
                    "ssp_reduction: rank {} asked for {} x {} {} ({}, {} push), rank {r} for {c} x {d} {o} ({v}, {po} push)",
                    dev.rank(), count, dtype.name(), op.name(), variant.name(), order.name()
                )));
            }
        }
        let engine = match variant {
            Variant::Hypercube => Engine::Hypercube(hypercube::Hypercube::new(dev, count, dtype, op)?),
            Variant::Ring => Engine::Ring(ring::Ring::new(dev, count, dtype, op)?),
            _ => Engine::Sharded(sharded::Sharded::new(dev, count, dtype, op, variant, order)?),
        };
        Ok(SspReduction { engine, count, dtype, op, variant, order, clock: 0, flushed: false, stats: Vec::new(), delta: None, prev: None })
    }

    pub fn count(&self) -> usize {
        self.count
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn op(&self) -> ReduceOp {
        self.op
    }
    pub fn variant(&self) -> Variant {
        self.variant
    }
    pub fn push_order(&self) -> PushOrder {
        self.order
    }
    /// Calls made so far.
    pub fn clock(&self) -> u64 {
        self.clock
    }
    /// One record per call, oldest first.
    pub fn stats(&self) -> &[CallStats] {
        &self.stats
    }
    pub fn flushed(&self) -> bool {
        self.flushed
    }

    fn check_len(&self, what: &str, n: usize) -> Result<()> {
        let want = self.count * self.dtype.size_bytes();
        if n != want {
            return Err(Error::InvalidArgument(format!(
                "{what} has {n} bytes; this reduction is {} x {} ({want} bytes)",
                self.count,
                self.dtype.name()
            )));
        }
        Ok(())
    }

    /// Adds `contribution` and writes into `out` the reduction of every contribution so
    /// far, with other ranks' data at most `slack` clocks old.
    pub fn allreduce(&mut self, contribution: &[u8], out: &mut [u8], slack: u64) -> Result<CallStats> {
        if self.flushed {
            return Err(Error::InvalidArgument("this SSP reduction was flushed; create a new one".into()));
        }
        self.mode(false)?;
        self.check_len("the contribution", contribution.len())?;
        self.check_len("the output", out.len())?;
        let t0 = Instant::now();
        self.clock += 1;
        let (wait, age) = match &mut self.engine {
            Engine::Hypercube(h) => h.allreduce(contribution, out, self.clock, slack)?,
            Engine::Sharded(s) => s.allreduce(contribution, out, self.clock, slack)?,
            Engine::Ring(r) => r.allreduce(contribution, out, self.clock, slack)?,
        };
        Ok(self.record(t0, wait, age))
    }

    /// Records one call's statistics (its clock, time, wait and the age of what it saw).
    fn record(&mut self, t0: Instant, wait: std::time::Duration, age: u64) -> CallStats {
        let st = CallStats {
            clock: self.clock,
            seconds: t0.elapsed().as_secs_f64(),
            wait_seconds: wait.as_secs_f64(),
            age_diff: self.clock.saturating_sub(age),
        };
        self.stats.push(st);
        st
    }

    fn mode(&mut self, delta: bool) -> Result<()> {
        match self.delta {
            None => {
                self.delta = Some(delta);
                Ok(())
            }
            Some(d) if d == delta => Ok(()),
            Some(_) => Err(Error::InvalidArgument(
                "an SSP reduction runs either allreduce or allreduce_delta calls, not both".into(),
            )),
        }
    }

    /// Delta mode: adds the contribution held in `inout` and writes back, in its place,
    /// the change of the result since this rank's previous call (the whole result at the
    /// first call) times `scale`, with other ranks' data at most `slack` clocks old. For
    /// callers that apply increments (DDP's SSP comm hook). Sum of float32 or float64 only;
    /// a reduction takes either these calls or [`SspReduction::allreduce`], not both.
    ///
    /// At two ranks (hypercube) this is one pass over the data, and the publish of this
    /// rank's new history is left for [`SspReduction::publish`] (call it as soon as the
    /// result is used; the next call makes it otherwise).
    pub fn allreduce_delta(&mut self, inout: &mut [u8], slack: u64, scale: f64) -> Result<CallStats> {
        if self.flushed {
            return Err(Error::InvalidArgument("this SSP reduction was flushed; create a new one".into()));
        }
        if self.op != ReduceOp::Sum || !matches!(self.dtype, DType::F32 | DType::F64) {
            return Err(Error::InvalidArgument(format!(
                "allreduce_delta needs a sum of float32 or float64, this reduction is {} of {}",
                self.op.name(),
                self.dtype.name()
            )));
        }
        self.mode(true)?;
        self.check_len("the contribution", inout.len())?;
        let t0 = Instant::now();
        self.clock += 1;
        let nbytes = inout.len();
        let (wait, age) = match &mut self.engine {
            Engine::Hypercube(h) if h.pair() => h.pair_delta(inout, self.clock, slack, scale)?,
            engine => {
                let (prev, mut cur) = self.prev.take().unwrap_or_else(|| (Buf::new(nbytes), Buf::new(nbytes)));
                let r = match engine {
                    Engine::Hypercube(h) => h.allreduce(inout, cur.bytes_mut(), self.clock, slack)?,
                    Engine::Sharded(s) => s.allreduce(inout, cur.bytes_mut(), self.clock, slack)?,
                    Engine::Ring(r) => r.allreduce(inout, cur.bytes_mut(), self.clock, slack)?,
                };
                delta::diff(self.dtype, inout, &cur, &prev, scale);
                self.prev = Some((cur, prev));
                r
            }
        };
        Ok(self.record(t0, wait, age))
    }

    /// Delta mode: publishes what the last [`SspReduction::allreduce_delta`] call left
    /// unpublished (nothing off the two-rank path).
    pub fn publish(&mut self) -> Result<()> {
        match &mut self.engine {
            Engine::Hypercube(h) if !self.flushed => h.publish_deferred(),
            _ => Ok(()),
        }
    }

    /// Delta mode, collective, once at the end: [`SspReduction::flush`], but `out`
    /// receives the change of the exact total since this rank's last call (what the
    /// other ranks' last contributions add) times `scale`.
    pub fn flush_delta(&mut self, out: &mut [u8], scale: f64) -> Result<()> {
        self.check_len("the output", out.len())?;
        if self.op != ReduceOp::Sum || !matches!(self.dtype, DType::F32 | DType::F64) {
            return Err(Error::InvalidArgument("flush_delta needs a sum of float32 or float64".into()));
        }
        self.mode(true)?;
        let nbytes = out.len();
        let mut last = Buf::new(nbytes);
        match (&self.engine, &self.prev) {
            (Engine::Hypercube(h), _) if h.pair() => h.pair_last(&mut last),
            (_, Some((prev, _))) => last.bytes_mut().copy_from_slice(prev.bytes()),
            _ => {}
        }
        let mut total = Buf::new(nbytes);
        self.flush(total.bytes_mut())?;
        delta::diff(self.dtype, out, &total, &last, scale);
        Ok(())
    }

    /// Collective: sends everything not yet sent and waits until every rank has done the
    /// same; `out` then holds the exact reduction of every contribution of every rank.
    /// The reduction cannot be used for more calls afterwards.
    pub fn flush(&mut self, out: &mut [u8]) -> Result<()> {
        self.check_len("the output", out.len())?;
        if self.flushed {
            return Err(Error::InvalidArgument("this SSP reduction was already flushed".into()));
        }
        match &mut self.engine {
            Engine::Hypercube(h) => h.flush(out, self.clock)?,
            Engine::Sharded(s) => s.flush(out)?,
            Engine::Ring(r) => r.flush(out)?,
        }
        self.flushed = true;
        Ok(())
    }
}

/// Clock value of data that will never change again (a rank that flushed).
pub(crate) const FINAL: u64 = u64::MAX;

/// A heap buffer aligned for any element type.
pub(crate) struct Buf {
    words: Vec<u64>,
    len: usize,
}

impl Buf {
    pub(crate) fn new(len: usize) -> Self {
        Buf { words: vec![0u64; len.div_ceil(8)], len }
    }
    pub(crate) fn ptr(&self) -> *const u8 {
        self.words.as_ptr() as *const u8
    }
    pub(crate) fn mut_ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr() as *mut u8
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.mut_ptr(), self.len) }
    }
}

/// Element type and operator of a reduction, with the byte-level kernels it needs.
#[derive(Clone, Copy)]
pub(crate) struct Kind {
    pub dtype: DType,
    pub op: ReduceOp,
}

impl Kind {
    /// `dst op= src` over `n` bytes.
    pub(crate) fn acc(&self, dst: *mut u8, src: *const u8, nbytes: usize) {
        unsafe { reduce_into(self.dtype, self.op, dst, src, nbytes / self.dtype.size_bytes()) }
    }
    /// `dst = a op b op c` over `n` bytes, one pass.
    pub(crate) fn acc4(&self, dst: *mut u8, a: *const u8, b: *const u8, c: *const u8, nbytes: usize) {
        unsafe { reduce4(self.dtype, self.op, dst, a, b, c, nbytes / self.dtype.size_bytes()) }
    }
    /// `dst = dst op b op c` over `n` bytes, one pass.
    pub(crate) fn acc3_into(&self, dst: *mut u8, b: *const u8, c: *const u8, nbytes: usize) {
        unsafe { reduce4_into(self.dtype, self.op, dst, b, c, nbytes / self.dtype.size_bytes()) }
    }
    /// `dst = op` over all of `srcs` (at least one), in as few passes as it takes.
    pub(crate) fn combine(&self, dst: *mut u8, srcs: &[*const u8], nbytes: usize) {
        match srcs {
            [] => {}
            [a] => unsafe { std::ptr::copy_nonoverlapping(*a, dst, nbytes) },
            [a, b] => self.acc3(dst, *a, *b, nbytes),
            [a, b, c, rest @ ..] => {
                self.acc4(dst, *a, *b, *c, nbytes);
                for pair in rest.chunks(2) {
                    match pair {
                        [x, y] => self.acc3_into(dst, *x, *y, nbytes),
                        [x] => self.acc(dst, *x, nbytes),
                        _ => unreachable!(),
                    }
                }
            }
        }
    }
    /// `h op= c`, then `dst = a op h` (or `h`) over `n` bytes, one pass.
    pub(crate) fn update(&self, h: *mut u8, c: *const u8, a: Option<*const u8>, dst: *mut u8, nbytes: usize) {
        unsafe { reduce_update(self.dtype, self.op, h, c, a, dst, nbytes / self.dtype.size_bytes()) }
    }
    /// `dst = a op b` over `n` bytes.
    pub(crate) fn acc3(&self, dst: *mut u8, a: *const u8, b: *const u8, nbytes: usize) {
        unsafe { reduce3(self.dtype, self.op, dst, a, b, nbytes / self.dtype.size_bytes()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_the_ring_only_when_opted_in() {
        assert_eq!(Variant::auto(4, 64 << 20, RING_MIN_BYTES), Variant::ShardedAsyncThread);
        assert_eq!(Variant::auto(4, 1 << 20, 1 << 20), Variant::Ring);
        assert_eq!(Variant::auto(4, (1 << 20) - 1, 1 << 20), Variant::ShardedAsyncThread);
        assert_eq!(Variant::auto(2, 64 << 20, 1 << 20), Variant::ShardedAsyncThread);
    }
}
