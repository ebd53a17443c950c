//! One module of entry points per kernel, each a chain of ever narrower passes:
//! the kernel's vector unrolled, the kernel's vector once, u64 words, then bytes.
//! Callers (lib.rs) have checked lengths, indexes and CPU support.

#[cfg(target_arch = "x86_64")]
use crate::x86::{Avx2, Avx512, GfniAvx, GfniAvx512};
use crate::{reference, vector, vector::Swar};

/// `data` with its length known at compile time (it must be `N`), so that the loops over
/// the blocks inlined below unroll and every block gets load instructions of its own. The
/// result is a slice again, but the checked conversion tells the optimizer its length is
/// `N`: the assembly of the 6-block path has six block pointers, each with its own loads.
#[inline(always)]
fn fixed<'a, 'b, const N: usize>(data: &'a [&'b [u8]]) -> &'a [&'b [u8]] {
    let blocks: &'a [&'b [u8]; N] = data.try_into().expect("block count checked by the caller");
    blocks
}

/// Evaluates `$body` with `$data` rebound to a fixed-length slice for the block counts
/// arrays commonly have (2..=16), and as it is for the rest.
///
/// Why: one load instruction for every block makes the stride prefetcher take the block
/// spacing for the stride; unrolled, each instruction walks one block sequentially, which
/// the prefetcher follows (docs/parity.md, "Unrolled over the blocks").
macro_rules! with_fixed_count {
    ($data:ident, $body:expr) => {
        with_fixed_count!(@counts $data, $body, 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    };
    (@counts $data:ident, $body:expr, $($n:literal)*) => {
        match $data.len() {
            $($n => {
                let $data = fixed::<$n>($data);
                $body
            })*
            _ => $body,
        }
    };
}

macro_rules! kernel_entries {
    ($name:ident, [$($attr:meta),*], $V:ty, $U:literal, $HOT_U:literal, $SINGLE_MAX:literal, $XOR_U:literal, $STREAM_PREFETCH:literal) => {
        pub(crate) mod $name {
            use super::*;

            $(#[$attr])*
            pub(crate) unsafe fn gen_syndrome(data: &[&[u8]], p: &mut [u8], q: &mut [u8], stream: bool) {
                let stream = stream && vector::can_stream::<$V>(&[p.as_ptr(), q.as_ptr()], 0);
                // `$SINGLE_MAX` is 0 for a kernel with no one-block path: that branch folds away.
                let from = if stream {
                    with_fixed_count!(data, vector::gen_syndrome::<$V, $U, true, $STREAM_PREFETCH>(data, p, q, 0, true))
                } else if $SINGLE_MAX > 0 && data.len() <= $SINGLE_MAX {
                    with_fixed_count!(data, vector::gen_syndrome::<$V, $HOT_U, false, 0>(data, p, q, 0, false))
                } else {
                    with_fixed_count!(data, vector::gen_syndrome::<$V, $U, true, 0>(data, p, q, 0, false))
                };
                let from = vector::gen_syndrome::<$V, 1, true, 0>(data, p, q, from, false);
                let from = vector::gen_syndrome::<Swar, 1, true, 0>(data, p, q, from, false);
                reference::gen_syndrome_from(data, p, q, from);
            }

            $(#[$attr])*
            pub(crate) unsafe fn xor_gen(data: &[&[u8]], p: &mut [u8], stream: bool) {
                let stream = stream && vector::can_stream::<$V>(&[p.as_ptr()], 0);
                let from = if stream {
                    with_fixed_count!(data, vector::xor_gen::<$V, $U>(data, p, 0, true))
                } else {
                    with_fixed_count!(data, vector::xor_gen::<$V, $XOR_U>(data, p, 0, false))
                };
                let from = vector::xor_gen::<$V, 1>(data, p, from, false);
                let from = vector::xor_gen::<Swar, 1>(data, p, from, false);
                reference::xor_gen_from(data, p, from);
            }

            $(#[$attr])*
            pub(crate) unsafe fn xor_skip(
                data: &[&[u8]],
                skip: usize,
                seed: Option<&[u8]>,
                out: &mut [u8],
                stream: bool,
            ) {
                let stream = stream && vector::can_stream::<$V>(&[out.as_ptr()], 0);
                let from = vector::xor_skip::<$V, $U>(data, skip, seed, out, 0, stream);
                let from = vector::xor_skip::<$V, 1>(data, skip, seed, out, from, false);
                let from = vector::xor_skip::<Swar, 1>(data, skip, seed, out, from, false);
                // The byte tail: fold the seed in as one more source.
                for off in from..out.len() {
                    let mut b = seed.map_or(0, |s| s[off]);
                    for (z, d) in data.iter().enumerate() {
                        if z != skip {
                            b ^= d[off];
                        }
                    }
                    out[off] = b;
                }
            }

            $(#[$attr])*
            pub(crate) unsafe fn xor_syndrome(
                data: &[&[u8]],
                start: usize,
                stop: usize,
                p: &mut [u8],
                q: &mut [u8],
            ) {
                let from = vector::xor_syndrome::<$V, $U>(data, start, stop, p, q, 0);
                let from = vector::xor_syndrome::<$V, 1>(data, start, stop, p, q, from);
                let from = vector::xor_syndrome::<Swar, 1>(data, start, stop, p, q, from);
                reference::xor_syndrome_from(data, start, stop, p, q, from);
            }

            $(#[$attr])*
            pub(crate) unsafe fn rmw_update(coef: u8, old: &[u8], new: &[u8], p: &mut [u8], q: &mut [u8]) {
                let from = vector::rmw_update::<$V, $U>(coef, old, new, p, q, 0);
                let from = vector::rmw_update::<$V, 1>(coef, old, new, p, q, from);
                let from = vector::rmw_update::<Swar, 1>(coef, old, new, p, q, from);
                reference::rmw_update_from(coef, old, new, p, q, from);
            }

            $(#[$attr])*
            pub(crate) unsafe fn recover_q(data: &[&[u8]], lost: usize, q: &[u8], out: &mut [u8], stream: bool) {
                let stream = stream && vector::can_stream::<$V>(&[out.as_ptr()], 0);
                let from = vector::recover_q::<$V, $U>(data, lost, q, out, 0, stream);
                let from = vector::recover_q::<$V, 1>(data, lost, q, out, from, false);
                let from = vector::recover_q::<Swar, 1>(data, lost, q, out, from, false);
                reference::recover_q_from(data, lost, q, out, from);
            }

            $(#[$attr])*
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn recover_2data(
                data: &[&[u8]],
                lost_a: usize,
                lost_b: usize,
                p: &[u8],
                q: &[u8],
                out_a: &mut [u8],
                out_b: &mut [u8],
                stream: bool,
            ) {
                let stream = stream && vector::can_stream::<$V>(&[out_a.as_ptr(), out_b.as_ptr()], 0);
                let from = if stream {
                    vector::recover_2data::<$V, $U, $STREAM_PREFETCH>(data, lost_a, lost_b, p, q, out_a, out_b, 0, true)
                } else {
                    vector::recover_2data::<$V, $U, 0>(data, lost_a, lost_b, p, q, out_a, out_b, 0, false)
                };
                let from = vector::recover_2data::<$V, 1, 0>(data, lost_a, lost_b, p, q, out_a, out_b, from, false);
                let from = vector::recover_2data::<Swar, 1, 0>(data, lost_a, lost_b, p, q, out_a, out_b, from, false);
                reference::recover_2data_from(data, lost_a, lost_b, p, q, out_a, out_b, from);
            }
        }
    };
}

// Vectors per block per round: `$U` for every loop that streams its output and for the
// other operations; `$HOT_U` for gen_syndrome with cached stores and at most
// `$SINGLE_MAX` data blocks, in one-block steps; `$XOR_U` for xor_gen with cached
// stores. Each was chosen by measurement (docs/parity.md, "Loops: how many blocks and
// vectors per step"):
// - gen_syndrome, 64-byte vectors, cached: one-block steps of eight vectors up to 11 data
//   blocks, because two-block steps let LLVM serialize the Horner chains at some counts;
//   past 11 blocks two-block steps of four win at 4 KiB. avx512bw showed no difference.
// - gen_syndrome streaming: two-block steps of four vectors. The 256-bit kernels showed
//   no difference between four and eight and keep two-block steps of four.
// - xor_gen, 64-byte vectors: two in cache (why two beat four is not established), four
//   when streaming.
// `$STREAM_PREFETCH`: bytes ahead that gen_syndrome and recover_2data with streaming
// stores prefetch each block they read (0: none). The AVX2 loop spends about three times the instructions of the GFNI
// one per byte, so out of order execution reaches fewer lines ahead on its own and the
// blocks' misses queue up at each page (docs/parity.md, "AVX2 without GFNI").
kernel_entries!(scalar, [], Swar, 4, 4, 0, 4, 0);
#[cfg(target_arch = "x86_64")]
kernel_entries!(avx2, [target_feature(enable = "avx2")], Avx2, 4, 4, 0, 4, 1024);
#[cfg(target_arch = "x86_64")]
kernel_entries!(avx512bw, [target_feature(enable = "avx512f,avx512bw")], Avx512, 4, 8, 11, 2, 0);
#[cfg(target_arch = "x86_64")]
kernel_entries!(gfni_avx512, [target_feature(enable = "avx512f,avx512bw,gfni")], GfniAvx512, 4, 8, 11, 2, 0);
#[cfg(target_arch = "x86_64")]
kernel_entries!(gfni_avx, [target_feature(enable = "avx2,gfni")], GfniAvx, 4, 4, 0, 4, 0);
