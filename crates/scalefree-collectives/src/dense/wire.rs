//! Compressed allreduce between hosts (`wire=` bf16 or fp16): float32 sums whose step
//! between hosts carries 16-bit values, half the bytes of float32.
//!
//! The step between hosts is the put-based all-to-all of [`super::all_to_all`] over the
//! hosts' owners of one share (see [`super::hierarchical`]): every owner rounds the parts
//! other owners reduce to 16 bits once and sends them; each owner sums the 16-bit copies it
//! receives into its own float32 part (float32 arithmetic, its own values unrounded), rounds
//! the sum to 16 bits once, keeps that rounded value itself and sends it to every other owner,
//! which widens it into its buffer. So every rank ends with the same bits, and the result
//! is the float32 sum of `H` partials each rounded once, itself rounded once: with `u` the
//! format's unit roundoff (bf16: 2^-8, fp16: 2^-11),
//! `|result - exact| <= u·|exact| + (u + H·u_32)·(1 + u)·Σ|partial_h|`
//! (`docs/algorithms.md`, "Compressed allreduce"). fp16 overflows past 65504.
//! Over TCP lanes the first peer's pieces are summed in as they arrive and the rounded parts
//! land straight in the caller's buffer (see [`group_allreduce`]).

use scalefree_transport::{Error, Result};

use scalefree_transport::Window;

use crate::comm::Communicator;
use crate::dense::landing::{direct_landing_on, pieces, reduce_on_arrival_on, wait_all, DirectLanding};
use crate::dense::{chunk_bounds, ALIGN_ELEMS};

/// What the step between hosts carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Wire {
    /// The buffer's own dtype (no compression).
    Exact = 0,
    /// bfloat16: 8 significant bits, float32's range.
    Bf16 = 1,
    /// IEEE half precision: 11 significant bits, largest finite 65504.
    Fp16 = 2,
}

impl Wire {
    pub fn name(self) -> &'static str {
        match self {
            Wire::Exact => "exact",
            Wire::Bf16 => "bf16",
            Wire::Fp16 => "fp16",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "exact" | "none" => Wire::Exact,
            "bf16" | "bfloat16" => Wire::Bf16,
            "fp16" | "float16" => Wire::Fp16,
            _ => return Err(Error::InvalidArgument(format!("unknown wire {s:?}: expected bf16, fp16 or exact"))),
        })
    }

    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            0 => Wire::Exact,
            1 => Wire::Bf16,
            2 => Wire::Fp16,
            _ => return None,
        })
    }

    /// The unit roundoff of the format (half the distance from 1 to the next value).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Wire::Exact => 0.0,
            Wire::Bf16 => 2f64.powi(-8),
            Wire::Fp16 => 2f64.powi(-11),
        }
    }
}

/// float32 to bfloat16, rounding to nearest even (NaN stays NaN): the `half` crate's.
#[inline(always)]
fn to_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

#[inline(always)]
fn from_bf16(h: u16) -> f32 {
    half::bf16::from_bits(h).to_f32()
}

/// Rounds `src` into `dst` (same length).
pub(crate) fn narrow(wire: Wire, src: &[f32], dst: &mut [u16]) {
    match wire {
        Wire::Bf16 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = to_bf16(s);
            }
        }
        Wire::Fp16 => {
            use half::slice::HalfFloatSliceExt;
            let d: &mut [half::f16] = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut half::f16, dst.len()) };
            d.convert_from_f32_slice(src);
        }
        Wire::Exact => unreachable!("nothing to narrow"),
    }
}

/// `dst[i] = widen(src[i])`.
pub(crate) fn widen(wire: Wire, src: &[u16], dst: &mut [f32]) {
    match wire {
        Wire::Bf16 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = from_bf16(s);
            }
        }
        Wire::Fp16 => {
            use half::slice::HalfFloatSliceExt;
            let s: &[half::f16] = unsafe { std::slice::from_raw_parts(src.as_ptr() as *const half::f16, src.len()) };
            s.convert_to_f32_slice(dst);
        }
        Wire::Exact => unreachable!("nothing to widen"),
    }
}

/// `dst[i] += widen(src[i])`, in float32.
pub(crate) fn add_widened(wire: Wire, src: &[u16], dst: &mut [f32]) {
    match wire {
        Wire::Bf16 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d += from_bf16(s);
            }
        }
        Wire::Fp16 => {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d += half::f16::from_bits(s).to_f32();
            }
        }
        Wire::Exact => unreachable!("nothing to widen"),
    }
}

/// `dst[i] += widen(src[i])`, then `out[i] = narrow(dst[i])` and `dst[i] = widen(out[i])`, in
/// one pass (the last peer's piece of an owner's part, rounded as it is summed).
pub(crate) fn add_round(wire: Wire, src: &[u16], dst: &mut [f32], out: &mut [u16]) {
    match wire {
        Wire::Bf16 => {
            for ((d, &s), o) in dst.iter_mut().zip(src).zip(out.iter_mut()) {
                let h = to_bf16(*d + from_bf16(s));
                *o = h;
                *d = from_bf16(h);
            }
        }
        _ => {
            add_widened(wire, src, dst);
            round_in_place(wire, dst, out);
        }
    }
}

/// `out[i] = narrow(dst[i])`, `dst[i] = widen(out[i])`.
pub(crate) fn round_in_place(wire: Wire, dst: &mut [f32], out: &mut [u16]) {
    match wire {
        Wire::Bf16 => {
            for (d, o) in dst.iter_mut().zip(out.iter_mut()) {
                let h = to_bf16(*d);
                *o = h;
                *d = from_bf16(h);
            }
        }
        _ => {
            narrow(wire, dst, out);
            widen(wire, out, dst);
        }
    }
}

/// The reducer of a window over this rank's part at `base` whose bytes arrive as 16-bit
/// values: byte `j` of the window is element `j/2`, at `base + 2j` as float32. With
/// `rounded` (the only peer's pieces: nothing else is summed in) it also rounds the sum, as
/// [`add_round`], into `rounded + j`.
fn widening_reducer(wire: Wire, base: *mut u8, rounded: Option<*mut u16>) -> scalefree_transport::Reducer {
    let base = base as usize;
    let rounded = rounded.map(|r| r as usize);
    std::sync::Arc::new(move |d: *mut u8, src: *const u8, bytes: usize| {
        let j = d as usize - base;
        let n = bytes / 2;
        let (src, dst) = unsafe { (std::slice::from_raw_parts(src as *const u16, n), std::slice::from_raw_parts_mut((base + 2 * j) as *mut f32, n)) };
        match rounded {
            Some(r) => add_round(wire, src, dst, unsafe { std::slice::from_raw_parts_mut((r + j) as *mut u16, n) }),
            None => add_widened(wire, src, dst),
        }
    })
}

/// Sum allreduce of float32 elements `a..b` of `buf` among `group` (this rank in it) with
/// `wire` values on the network, through landing areas `areas` (scatter, gather); see the
/// module comment. The landing region must hold the largest float32 part already.
///
/// Over TCP lanes, as the float32 all-to-all does ([`super::landing`]): the first peer's
/// pieces of this rank's part are widened and summed into it as they are read off the lane
/// (`SCALEFREE_REDUCE_ON_ARRIVAL`), and, once this rank has rounded everything it sends,
/// the other owners' rounded parts land straight in the upper half of their float32 range
/// in the caller's buffer (`SCALEFREE_DIRECT_LANDING`) and are widened in place, piece by
/// piece, through a cache-sized copy (a piece widened never reaches a later piece's bytes:
/// piece `k` of a part of `n` elements lands at bytes `2n + off` and widens into `2 off ..
/// 2 (off + len)`, below `2n + off + len`).
///
/// # Safety
/// `buf` valid for `b` float32 elements.
pub(super) unsafe fn group_allreduce(c: &mut Communicator, group: &[u32], buf: *mut f32, a: usize, b: usize, wire: Wire, areas: (usize, usize)) -> Result<()> {
    const WES: usize = 2;
    let g = group.len() as u32;
    if g < 2 || b == a {
        return Ok(());
    }
    let me_idx = group.iter().position(|&r| r == c.rank).unwrap() as u32;
    let part = |i: u32| {
        let (x, y) = chunk_bounds(b - a, g, i, ALIGN_ELEMS);
        (a + x, a + y)
    };
    // Elements e0..e1 of the buffer, for a moment (a lane's reader may write other parts).
    let elems = |e0: usize, e1: usize| unsafe { std::slice::from_raw_parts_mut(buf.add(e0), e1 - e0) };
    let piece = c.net_piece_bytes() / 2; // as many elements per piece as the float32 path
    let peers: Vec<(u32, u32)> = (1..g).map(|k| (me_idx + k) % g).map(|i| (i, group[i as usize])).collect();
    let me = c.rank;
    let (x, y) = part(me_idx);
    let mine = unsafe { buf.add(x) } as *mut u8;
    // Our part rounded, as it is sent on (rounded on arrival when there is one peer).
    let mut reduced = vec![0u16; y - x];
    let only = (peers.len() == 1).then_some(reduced.as_mut_ptr());
    let reducing = || {
        let q = peers[0].1;
        Window { offset: c.area_base(areas.0) + c.slot(q), len: (y - x) * WES, dst: mine, reduce: Some(widening_reducer(wire, mine, only)) }
    };
    let mut direct: Option<DirectLanding> = None;
    if reduce_on_arrival_on() {
        unsafe { c.set_windows(&[reducing()], Some(areas.0), &mut direct) };
    }
    // Every part but ours, rounded once; sent piece by piece as it is rounded.
    let mut narrow_out = vec![0u16; b - a];
    let mut sent = Vec::new();
    for &(i, q) in &peers {
        let (px, py) = part(i);
        let bytes = (py - px) * WES;
        let (p, np) = pieces(bytes, piece, WES);
        for k in 0..np {
            let (e0, e1) = (px + k * p / WES, px + (k * p + p.min(bytes - k * p)) / WES);
            narrow(wire, elems(e0, e1), &mut narrow_out[e0 - a..e1 - a]);
            let src = narrow_out[e0 - a..].as_ptr() as *const u8;
            sent.push(unsafe { c.send_at(q, src, (e1 - e0) * WES, areas.0, c.slot(me) + k * p, k)? });
        }
    }
    // Nothing of the other parts is read any more: their rounded sums may land in place.
    if direct_landing_on() {
        let mut windows: Vec<Window> = peers
            .iter()
            .map(|&(i, q)| {
                let (px, py) = part(i);
                let n = py - px;
                Window { offset: c.area_base(areas.1) + c.slot(q), len: n * WES, dst: unsafe { buf.add(px) as *mut u8 }.wrapping_add(n * WES), reduce: None }
            })
            .collect();
        let reduces = direct.is_some() && reduce_on_arrival_on();
        if reduces {
            windows.push(reducing());
        }
        unsafe { c.set_windows(&windows, reduces.then_some(areas.0), &mut direct) };
    }
    // Our part: sum the others' rounded copies in, round the sum once, keep and send it.
    let bytes = (y - x) * WES;
    let (p, np) = pieces(bytes, piece, WES);
    let mut forwarded = Vec::new();
    for k in 0..np {
        let off = k * p;
        let len = p.min(bytes - off);
        let (e0, e1) = (x + off / WES, x + (off + len) / WES);
        let r = &mut reduced[off / WES..(off + len) / WES];
        for (j, &(_, q)) in peers.iter().enumerate() {
            let seq = c.seq;
            c.wait_landed(c.landed_word(areas.0, q, k), &|| format!("rank {q}'s {} piece {k} of allreduce call #{seq}", wire.name()))?;
            let last = j + 1 == peers.len();
            if c.reduced_on_arrival(&direct, q, k) {
                if last && only.is_none() {
                    round_in_place(wire, elems(e0, e1), r);
                }
                continue;
            }
            let got = unsafe { std::slice::from_raw_parts(c.landed(areas.0, q, off) as *const u16, len / WES) };
            if last {
                add_round(wire, got, elems(e0, e1), r);
            } else {
                add_widened(wire, got, elems(e0, e1));
            }
        }
        for &(_, q) in &peers {
            forwarded.push(unsafe { c.send_at(q, r.as_ptr() as *const u8, len, areas.1, c.slot(me) + off, k)? });
        }
    }
    wait_all(sent)?;
    drop(narrow_out);
    // The other parts, rounded by their owners.
    let mut hop = vec![0u16; piece / WES];
    for &(i, q) in &peers {
        let (qx, qy) = part(i);
        let qbytes = (qy - qx) * WES;
        let (qp, qnp) = pieces(qbytes, piece, WES);
        hop.resize(hop.len().max(qp / WES), 0);
        for k in 0..qnp {
            let off = k * qp;
            let len = qp.min(qbytes - off);
            let seq = c.seq;
            c.wait_landed(c.landed_word(areas.1, q, k), &|| format!("rank {q}'s reduced {} piece {k} of allreduce call #{seq}", wire.name()))?;
            let e0 = qx + off / WES;
            if direct.is_some() && c.landed_direct(areas.1, q, k) {
                // In the upper half of the part: through a copy where it overlaps its output.
                let at = unsafe { (buf.add(qx) as *const u8).add(qbytes + off) };
                if off + 2 * len <= qbytes {
                    widen(wire, unsafe { std::slice::from_raw_parts(at as *const u16, len / WES) }, elems(e0, e0 + len / WES));
                } else {
                    unsafe { std::ptr::copy_nonoverlapping(at, hop.as_mut_ptr() as *mut u8, len) };
                    widen(wire, &hop[..len / WES], elems(e0, e0 + len / WES));
                }
            } else {
                let got = unsafe { std::slice::from_raw_parts(c.landed(areas.1, q, off) as *const u16, len / WES) };
                widen(wire, got, elems(e0, e0 + len / WES));
            }
        }
    }
    drop(direct);
    wait_all(forwarded)?;
    drop(reduced);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        for &x in &[0.0f32, -0.0, 1.0, -2.5, 3.140625, 1e-40, f32::MAX, f32::MIN_POSITIVE, f32::INFINITY, 65504.0, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 512.0] {
            let h = to_bf16(x);
            let back = from_bf16(h);
            let want = half::bf16::from_f32(x).to_f32();
            assert_eq!(back.to_bits(), want.to_bits(), "{x}");
        }
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        // Ties go to even.
        assert_eq!(from_bf16(to_bf16(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(from_bf16(to_bf16(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
    }

    #[test]
    fn narrow_widen_within_unit_roundoff() {
        let src: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.37 + 1e-3).collect();
        for wire in [Wire::Bf16, Wire::Fp16] {
            let mut h = vec![0u16; src.len()];
            narrow(wire, &src, &mut h);
            let mut back = vec![0f32; src.len()];
            widen(wire, &h, &mut back);
            let mut acc = vec![1f32; src.len()];
            add_widened(wire, &h, &mut acc);
            let mut fused = vec![1f32; src.len()];
            let mut out = vec![0u16; src.len()];
            add_round(wire, &h, &mut fused, &mut out);
            let mut rounded = vec![0u16; src.len()];
            narrow(wire, &acc, &mut rounded);
            for i in 0..src.len() {
                let err = ((back[i] - src[i]) as f64).abs();
                assert!(err <= wire.unit_roundoff() * (src[i] as f64).abs() + 1e-30, "{wire:?} {} -> {}", src[i], back[i]);
                assert_eq!(acc[i], 1.0 + back[i]);
                assert_eq!(out[i], rounded[i]);
                let mut w = [0f32];
                widen(wire, &rounded[i..i + 1], &mut w);
                assert_eq!(fused[i], w[0]);
            }
        }
    }
}
