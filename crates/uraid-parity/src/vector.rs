//! The P/Q algorithms written once, generic over a vector of bytes.
//!
//! Each kernel (SWAR u64, AVX2, AVX-512BW, GFNI) only says how to load, store, XOR,
//! multiply by g and multiply by a constant; the loops below are `#[inline(always)]`
//! so that each kernel's `#[target_feature]` entry point gets its own fully inlined copy
//! (the same pattern the `memchr` crate uses).
//!
//! Every function works on the byte range `[from, end)` where `end` is the largest
//! `from + k * V::BYTES * U` that fits, and returns `end`; the caller finishes the rest
//! with a narrower vector.
//!
//! Safety (all functions): every slice that is read or written must have at least
//! `p.len()` (or `out.len()`) bytes; the public wrappers check this before calling.

pub(crate) trait Vector: Copy {
    const BYTES: usize;
    /// Whatever the kernel needs to multiply by one constant (tables, a bit matrix).
    type Mul: Copy;

    unsafe fn zero() -> Self;
    unsafe fn load(src: *const u8) -> Self;
    unsafe fn store(self, dst: *mut u8);
    /// A store that bypasses the cache where the kernel has one; `dst` must be aligned
    /// to `BYTES` (callers check).
    #[inline(always)]
    unsafe fn store_stream(self, dst: *mut u8) {
        self.store(dst)
    }
    /// Orders streaming stores before later ordinary stores.
    #[inline(always)]
    unsafe fn stream_fence() {}
    unsafe fn xor(self, other: Self) -> Self;
    #[inline(always)]
    unsafe fn xor3(self, a: Self, b: Self) -> Self {
        self.xor(a).xor(b)
    }
    /// self * g (g = 2).
    unsafe fn mul2(self) -> Self;
    /// self * g ^ d, the Horner step.
    #[inline(always)]
    unsafe fn mul2_xor(self, d: Self) -> Self {
        self.mul2().xor(d)
    }
    /// What [`Vector::mul2_xor_biased`] adds to every byte beyond the Horner step.
    const MUL2_BIAS: u8 = 0;
    /// `self * g ^ d ^ MUL2_BIAS` in every byte: a kernel whose doubling is cheaper when
    /// it may be off by a constant uses this, and the loop takes the constant out at the
    /// end with [`Vector::xor_splat`].
    #[inline(always)]
    unsafe fn mul2_xor_biased(self, d: Self) -> Self {
        self.mul2_xor(d)
    }
    /// `self ^ b` in every byte; only called with a nonzero `MUL2_BIAS`.
    #[inline(always)]
    unsafe fn xor_splat(self, _b: u8) -> Self {
        self
    }
    unsafe fn mul_table(c: u8) -> Self::Mul;
    unsafe fn mul(self, t: Self::Mul) -> Self;
    /// Hint that the cache line at `ptr` is wanted soon; never faults.
    #[inline(always)]
    unsafe fn prefetch(_ptr: *const u8) {}
}

#[inline(always)]
unsafe fn block(data: &[&[u8]], z: usize) -> *const u8 {
    data.get_unchecked(z).as_ptr()
}

#[inline(always)]
unsafe fn ld<V: Vector, const U: usize>(base: *const u8, off: usize) -> [V; U] {
    let mut v = [V::zero(); U];
    for (u, x) in v.iter_mut().enumerate() {
        *x = V::load(base.add(off + u * V::BYTES));
    }
    v
}

#[inline(always)]
unsafe fn st<V: Vector, const U: usize>(v: [V; U], base: *mut u8, off: usize, stream: bool) {
    for (u, x) in v.iter().enumerate() {
        if stream {
            x.store_stream(base.add(off + u * V::BYTES));
        } else {
            x.store(base.add(off + u * V::BYTES));
        }
    }
}

#[inline(always)]
fn range_end<V: Vector, const U: usize>(from: usize, len: usize) -> usize {
    let step = V::BYTES * U;
    from + (len - from) / step * step
}

/// Streaming stores need every store address aligned to the vector width.
#[inline(always)]
pub(crate) fn can_stream<V: Vector>(outs: &[*const u8], from: usize) -> bool {
    outs.iter().all(|p| (*p as usize + from) & (V::BYTES - 1) == 0)
}

/// P and Q (relative to `bottom`: block z gets g^(z-bottom)) of the blocks
/// `bottom..=top` except `skip_a`/`skip_b`, for one step at `off`.
#[inline(always)]
unsafe fn horner_pq<V: Vector, const U: usize>(
    data: &[&[u8]],
    bottom: usize,
    top: usize,
    skip_a: usize,
    skip_b: usize,
    off: usize,
) -> ([V; U], [V; U]) {
    let mut z = top;
    let (mut pv, mut qv) = if z == skip_a || z == skip_b {
        ([V::zero(); U], [V::zero(); U])
    } else {
        let d = ld::<V, U>(block(data, z), off);
        (d, d)
    };
    while z > bottom {
        z -= 1;
        if z == skip_a || z == skip_b {
            for q in qv.iter_mut() {
                *q = q.mul2();
            }
        } else {
            let d = ld::<V, U>(block(data, z), off);
            for u in 0..U {
                pv[u] = pv[u].xor(d[u]);
                qv[u] = qv[u].mul2_xor(d[u]);
            }
        }
    }
    (pv, qv)
}

/// All blocks side by side, a few vectors of each per round: several streams keep more
/// misses in flight than one, so walking one block at a time (P and Q in an L1 scratch)
/// lost out of cache (docs/parity.md, "All blocks side by side, not one block at a time").
///
/// `PAIRS`: two blocks per step, so P takes one three-way XOR where the kernel has one;
/// else one block per step, with fewer vectors live: with two blocks per step and eight
/// vectors, LLVM reordered the loop for some block counts into one vector's whole Horner
/// chain after another. See kernels.rs for which is used where, and docs/parity.md,
/// "Loops: how many blocks and vectors per step".
///
/// `PREFETCH_BYTES`: how far ahead in every block to prefetch each step (0: not at all).
#[inline(always)]
pub(crate) unsafe fn gen_syndrome<
    V: Vector,
    const U: usize,
    const PAIRS: bool,
    const PREFETCH_BYTES: usize,
>(
    data: &[&[u8]],
    p: &mut [u8],
    q: &mut [u8],
    from: usize,
    stream: bool,
) -> usize {
    let end = range_end::<V, U>(from, p.len());
    let top = data.len() - 1;
    let (pp, qp) = (p.as_mut_ptr(), q.as_mut_ptr());
    let bias = horner_bias(V::MUL2_BIAS, top);
    let mut off = from;
    while off < end {
        // A hint, so it never faults even past a block's end (there it fetches what lies
        // next: in a resync that reads each member sequentially, the next stripe's block).
        if PREFETCH_BYTES > 0 {
            for z in 0..data.len() {
                for line in (0..V::BYTES * U).step_by(64) {
                    V::prefetch(block(data, z).wrapping_add(off + PREFETCH_BYTES + line));
                }
            }
        }
        let mut pv = ld::<V, U>(block(data, top), off);
        let mut qv = pv;
        let mut z = top;
        while PAIRS && z >= 2 {
            let d1 = ld::<V, U>(block(data, z - 1), off);
            let d0 = ld::<V, U>(block(data, z - 2), off);
            for u in 0..U {
                pv[u] = pv[u].xor3(d1[u], d0[u]);
                qv[u] = qv[u].mul2_xor_biased(d1[u]).mul2_xor_biased(d0[u]);
            }
            z -= 2;
        }
        while z > 0 {
            z -= 1;
            let d = ld::<V, U>(block(data, z), off);
            for u in 0..U {
                pv[u] = pv[u].xor(d[u]);
                qv[u] = qv[u].mul2_xor_biased(d[u]);
            }
        }
        if V::MUL2_BIAS != 0 {
            for x in qv.iter_mut() {
                *x = x.xor_splat(bias);
            }
        }
        st(pv, pp, off, stream);
        st(qv, qp, off, stream);
        off += V::BYTES * U;
    }
    if stream {
        V::stream_fence();
    }
    end
}

/// What `steps` biased Horner steps add to every byte of Q: each doubles what came before
/// and adds `step_bias`.
#[inline(always)]
fn horner_bias(step_bias: u8, steps: usize) -> u8 {
    if step_bias == 0 {
        return 0;
    }
    (0..steps).fold(0, |e, _| crate::gf::mul(e, 2) ^ step_bias)
}

/// P = XOR of all data blocks; two blocks per round so each P update is one three-way XOR
/// where the kernel has one. Descending order: ascending measured slower in cache with
/// blocks at a power-of-two stride (docs/parity.md, "Descending block order").
#[inline(always)]
pub(crate) unsafe fn xor_gen<V: Vector, const U: usize>(
    data: &[&[u8]],
    p: &mut [u8],
    from: usize,
    stream: bool,
) -> usize {
    let end = range_end::<V, U>(from, p.len());
    let pp = p.as_mut_ptr();
    let mut off = from;
    while off < end {
        let mut z = data.len() - 1;
        let mut pv = ld::<V, U>(block(data, z), off);
        while z >= 2 {
            let d1 = ld::<V, U>(block(data, z - 1), off);
            let d0 = ld::<V, U>(block(data, z - 2), off);
            for u in 0..U {
                pv[u] = pv[u].xor3(d1[u], d0[u]);
            }
            z -= 2;
        }
        if z == 1 {
            let d = ld::<V, U>(block(data, 0), off);
            for u in 0..U {
                pv[u] = pv[u].xor(d[u]);
            }
        }
        st(pv, pp, off, stream);
        off += V::BYTES * U;
    }
    if stream {
        V::stream_fence();
    }
    end
}

/// out = seed ^ XOR of data except `skip` (seed absent: zero).
#[inline(always)]
pub(crate) unsafe fn xor_skip<V: Vector, const U: usize>(
    data: &[&[u8]],
    skip: usize,
    seed: Option<&[u8]>,
    out: &mut [u8],
    from: usize,
    stream: bool,
) -> usize {
    let end = range_end::<V, U>(from, out.len());
    let op = out.as_mut_ptr();
    let mut off = from;
    while off < end {
        let mut acc = match seed {
            Some(s) => ld::<V, U>(s.as_ptr(), off),
            None => [V::zero(); U],
        };
        // Descending, as in gen_syndrome: measured faster than ascending when the blocks
        // sit at a large power-of-two stride (docs/parity.md, "Descending block order").
        let mut z = data.len();
        while z > 0 {
            z -= 1;
            if z != skip {
                let d = ld::<V, U>(block(data, z), off);
                for u in 0..U {
                    acc[u] = acc[u].xor(d[u]);
                }
            }
        }
        st(acc, op, off, stream);
        off += V::BYTES * U;
    }
    if stream {
        V::stream_fence();
    }
    end
}

#[inline(always)]
pub(crate) unsafe fn xor_syndrome<V: Vector, const U: usize>(
    data: &[&[u8]],
    start: usize,
    stop: usize,
    p: &mut [u8],
    q: &mut [u8],
    from: usize,
) -> usize {
    let end = range_end::<V, U>(from, p.len());
    // Horner below computes Q relative to `start`; one constant multiply shifts it up.
    let shift = V::mul_table(crate::gf::pow_g(start));
    let (pp, qp) = (p.as_mut_ptr(), q.as_mut_ptr());
    let mut off = from;
    while off < end {
        let (pv, mut qv) = horner_pq::<V, U>(data, start, stop, usize::MAX, usize::MAX, off);
        if start > 0 {
            for q in qv.iter_mut() {
                *q = q.mul(shift);
            }
        }
        let (mut po, mut qo) = (ld::<V, U>(pp, off), ld::<V, U>(qp, off));
        for u in 0..U {
            po[u] = po[u].xor(pv[u]);
            qo[u] = qo[u].xor(qv[u]);
        }
        st(po, pp, off, false);
        st(qo, qp, off, false);
        off += V::BYTES * U;
    }
    end
}

/// How far ahead rmw_update prefetches its four streams.
const RMW_PREFETCH_BYTES: usize = 1024;
/// Blocks shorter than this are not prefetched: there the prefetch instructions take load
/// slots the data needs and cost more than they bring; from 64 KiB on they pay
/// (docs/parity.md, "rmw_update prefetches only blocks of 64 KiB and more").
const RMW_PREFETCH_MIN_BYTES: usize = 64 * 1024;

/// One pass over old, new, P and Q: P ^= old^new, Q ^= coef*(old^new).
#[inline(always)]
pub(crate) unsafe fn rmw_update<V: Vector, const U: usize>(
    coef: u8,
    old: &[u8],
    new: &[u8],
    p: &mut [u8],
    q: &mut [u8],
    from: usize,
) -> usize {
    let end = range_end::<V, U>(from, p.len());
    let t = V::mul_table(coef);
    let (pp, qp) = (p.as_mut_ptr(), q.as_mut_ptr());
    let prefetch = p.len() >= RMW_PREFETCH_MIN_BYTES;
    let mut off = from;
    while off < end {
        // Four streams alone keep too few misses in flight to fill the memory pipe; ask
        // for every line a few steps ahead (a hint: it never faults, even past the end).
        if prefetch {
            let ahead = off + RMW_PREFETCH_BYTES;
            for line in (0..V::BYTES * U).step_by(64) {
                V::prefetch(old.as_ptr().wrapping_add(ahead + line));
                V::prefetch(new.as_ptr().wrapping_add(ahead + line));
                V::prefetch(pp.wrapping_add(ahead + line));
                V::prefetch(qp.wrapping_add(ahead + line));
            }
        }
        let o = ld::<V, U>(old.as_ptr(), off);
        let n = ld::<V, U>(new.as_ptr(), off);
        let (mut po, mut qo) = (ld::<V, U>(pp, off), ld::<V, U>(qp, off));
        for u in 0..U {
            let delta = o[u].xor(n[u]);
            po[u] = po[u].xor(delta);
            qo[u] = qo[u].xor(delta.mul(t));
        }
        st(po, pp, off, false);
        st(qo, qp, off, false);
        off += V::BYTES * U;
    }
    end
}

#[inline(always)]
pub(crate) unsafe fn recover_q<V: Vector, const U: usize>(
    data: &[&[u8]],
    lost: usize,
    q: &[u8],
    out: &mut [u8],
    from: usize,
    stream: bool,
) -> usize {
    let end = range_end::<V, U>(from, out.len());
    let unscale = V::mul_table(crate::gf::inv(crate::gf::pow_g(lost)));
    let op = out.as_mut_ptr();
    let mut off = from;
    while off < end {
        let (_, qv) = horner_pq::<V, U>(data, 0, data.len() - 1, lost, lost, off);
        let mut qo = ld::<V, U>(q.as_ptr(), off);
        for u in 0..U {
            qo[u] = qo[u].xor(qv[u]).mul(unscale);
        }
        st(qo, op, off, stream);
        off += V::BYTES * U;
    }
    if stream {
        V::stream_fence();
    }
    end
}

/// Requires lost_a != lost_b. See `reference::recover_2data_from` for the algebra.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn recover_2data<V: Vector, const U: usize, const PREFETCH_BYTES: usize>(
    data: &[&[u8]],
    lost_a: usize,
    lost_b: usize,
    p: &[u8],
    q: &[u8],
    out_a: &mut [u8],
    out_b: &mut [u8],
    from: usize,
    stream: bool,
) -> usize {
    use crate::gf::{inv, mul, pow_g};
    let end = range_end::<V, U>(from, out_a.len());
    let (ga, gb) = (pow_g(lost_a), pow_g(lost_b));
    let denom_inv = inv(ga ^ gb);
    let (tq, tp) = (V::mul_table(denom_inv), V::mul_table(mul(gb, denom_inv)));
    let (ap, bp) = (out_a.as_mut_ptr(), out_b.as_mut_ptr());
    let mut off = from;
    while off < end {
        // As in gen_syndrome; the lost blocks are not read (they may be empty).
        if PREFETCH_BYTES > 0 {
            let ahead = off + PREFETCH_BYTES;
            for line in (0..V::BYTES * U).step_by(64) {
                for (z, d) in data.iter().enumerate() {
                    if z != lost_a && z != lost_b {
                        V::prefetch(d.as_ptr().wrapping_add(ahead + line));
                    }
                }
                V::prefetch(p.as_ptr().wrapping_add(ahead + line));
                V::prefetch(q.as_ptr().wrapping_add(ahead + line));
            }
        }
        let (pv, qv) = horner_pq::<V, U>(data, 0, data.len() - 1, lost_a, lost_b, off);
        let (mut pxy, mut qxy) = (ld::<V, U>(p.as_ptr(), off), ld::<V, U>(q.as_ptr(), off));
        for u in 0..U {
            pxy[u] = pxy[u].xor(pv[u]);
            qxy[u] = qxy[u].xor(qv[u]);
            let da = qxy[u].mul(tq).xor(pxy[u].mul(tp));
            qxy[u] = da;
            pxy[u] = pxy[u].xor(da);
        }
        st(qxy, ap, off, stream);
        st(pxy, bp, off, stream);
        off += V::BYTES * U;
    }
    if stream {
        V::stream_fence();
    }
    end
}

/// The portable kernel: eight bytes at a time in a u64 (SWAR), products by table.
#[derive(Clone, Copy)]
pub(crate) struct Swar(u64);

impl Vector for Swar {
    const BYTES: usize = 8;
    type Mul = &'static [u8; 256];

    #[inline(always)]
    unsafe fn zero() -> Self {
        Swar(0)
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Swar((src as *const u64).read_unaligned())
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        (dst as *mut u64).write_unaligned(self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Swar(self.0 ^ other.0)
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        let high = self.0 & 0x8080_8080_8080_8080;
        // Each byte whose top bit falls off gets the polynomial folded back in.
        let reduce = (high >> 7).wrapping_mul(crate::gf::POLY_LOW as u64);
        Swar(((self.0 << 1) & 0xfefe_fefe_fefe_fefe) ^ reduce)
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::Mul {
        &crate::gf::MUL[c as usize]
    }
    #[inline(always)]
    unsafe fn mul(self, t: Self::Mul) -> Self {
        Swar(u64::from_le_bytes(self.0.to_le_bytes().map(|b| t[b as usize])))
    }
}
