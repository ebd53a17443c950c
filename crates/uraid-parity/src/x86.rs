//! x86-64 vectors: AVX2 and AVX-512BW (multiply by g with compare/add/xor, constants by
//! nibble-table shuffles) and GFNI (every multiply, by g or by a constant, is one
//! GF2P8AFFINEQB with a constant bit matrix; GF2P8MULB is not usable, it reduces by the
//! AES polynomial 0x11b, not md's 0x11d).

use core::arch::x86_64::*;

use crate::gf::{affine_matrix, mul, POLY_LOW};
use crate::vector::Vector;

/// Products c*x for x in 0..16 and c*(x<<4) for x in 0..16, for PSHUFB lookups.
fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut lo = [0u8; 16];
    let mut hi = [0u8; 16];
    for x in 0..16u8 {
        lo[x as usize] = mul(c, x);
        hi[x as usize] = mul(c, x << 4);
    }
    (lo, hi)
}

const MUL2_MATRIX: i64 = affine_matrix(2) as i64;

#[derive(Clone, Copy)]
pub(crate) struct Avx2(__m256i);

impl Vector for Avx2 {
    #[inline(always)]
    unsafe fn prefetch(ptr: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(ptr as *const i8)
    }
    const BYTES: usize = 32;
    type Mul = (__m256i, __m256i);

    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx2(_mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Avx2(_mm256_loadu_si256(src as *const __m256i))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm256_storeu_si256(dst as *mut __m256i, self.0)
    }
    #[inline(always)]
    unsafe fn store_stream(self, dst: *mut u8) {
        _mm256_stream_si256(dst as *mut __m256i, self.0)
    }
    #[inline(always)]
    unsafe fn stream_fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Avx2(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        // Signed compare marks the bytes whose top bit the doubling shifts out.
        let carry = _mm256_cmpgt_epi8(_mm256_setzero_si256(), self.0);
        let doubled = _mm256_add_epi8(self.0, self.0);
        Avx2(_mm256_xor_si256(doubled, _mm256_and_si256(carry, _mm256_set1_epi8(POLY_LOW as i8))))
    }
    const MUL2_BIAS: u8 = POLY_LOW;
    #[inline(always)]
    unsafe fn mul2_xor_biased(self, d: Self) -> Self {
        // PSHUFB gives 0 where an index byte has its top bit set, so a table of POLY_LOW
        // yields the reduction inverted: one instruction instead of compare and AND, and
        // the POLY_LOW it leaves in every byte is taken out once at the end.
        let not_carry = _mm256_shuffle_epi8(_mm256_set1_epi8(POLY_LOW as i8), self.0);
        let doubled = _mm256_add_epi8(self.0, self.0);
        Avx2(_mm256_xor_si256(_mm256_xor_si256(doubled, not_carry), d.0))
    }
    #[inline(always)]
    unsafe fn xor_splat(self, b: u8) -> Self {
        Avx2(_mm256_xor_si256(self.0, _mm256_set1_epi8(b as i8)))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::Mul {
        let (lo, hi) = nibble_tables(c);
        (
            _mm256_broadcastsi128_si256(_mm_loadu_si128(lo.as_ptr() as *const __m128i)),
            _mm256_broadcastsi128_si256(_mm_loadu_si128(hi.as_ptr() as *const __m128i)),
        )
    }
    #[inline(always)]
    unsafe fn mul(self, t: Self::Mul) -> Self {
        let mask = _mm256_set1_epi8(0x0f);
        let lo = _mm256_and_si256(self.0, mask);
        let hi = _mm256_and_si256(_mm256_srli_epi16(self.0, 4), mask);
        Avx2(_mm256_xor_si256(_mm256_shuffle_epi8(t.0, lo), _mm256_shuffle_epi8(t.1, hi)))
    }
}

#[derive(Clone, Copy)]
pub(crate) struct Avx512(__m512i);

impl Vector for Avx512 {
    #[inline(always)]
    unsafe fn prefetch(ptr: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(ptr as *const i8)
    }
    const BYTES: usize = 64;
    type Mul = (__m512i, __m512i);

    #[inline(always)]
    unsafe fn zero() -> Self {
        Avx512(_mm512_setzero_si512())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Avx512(_mm512_loadu_si512(src as *const _))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm512_storeu_si512(dst as *mut _, self.0)
    }
    #[inline(always)]
    unsafe fn store_stream(self, dst: *mut u8) {
        _mm512_stream_si512(dst as *mut _, self.0)
    }
    #[inline(always)]
    unsafe fn stream_fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Avx512(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn xor3(self, a: Self, b: Self) -> Self {
        Avx512(_mm512_ternarylogic_epi64::<0x96>(self.0, a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        let carry = _mm512_movepi8_mask(self.0);
        let doubled = _mm512_add_epi8(self.0, self.0);
        Avx512(_mm512_xor_si512(doubled, _mm512_maskz_mov_epi8(carry, _mm512_set1_epi8(POLY_LOW as i8))))
    }
    #[inline(always)]
    unsafe fn mul2_xor(self, d: Self) -> Self {
        let carry = _mm512_movepi8_mask(self.0);
        let doubled = _mm512_add_epi8(self.0, self.0);
        let reduce = _mm512_maskz_mov_epi8(carry, _mm512_set1_epi8(POLY_LOW as i8));
        Avx512(_mm512_ternarylogic_epi64::<0x96>(doubled, reduce, d.0))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::Mul {
        let (lo, hi) = nibble_tables(c);
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(lo.as_ptr() as *const __m128i)),
            _mm512_broadcast_i32x4(_mm_loadu_si128(hi.as_ptr() as *const __m128i)),
        )
    }
    #[inline(always)]
    unsafe fn mul(self, t: Self::Mul) -> Self {
        let mask = _mm512_set1_epi8(0x0f);
        let lo = _mm512_and_si512(self.0, mask);
        let hi = _mm512_and_si512(_mm512_srli_epi16(self.0, 4), mask);
        Avx512(_mm512_xor_si512(_mm512_shuffle_epi8(t.0, lo), _mm512_shuffle_epi8(t.1, hi)))
    }
}

#[derive(Clone, Copy)]
pub(crate) struct GfniAvx512(__m512i);

impl Vector for GfniAvx512 {
    #[inline(always)]
    unsafe fn prefetch(ptr: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(ptr as *const i8)
    }
    const BYTES: usize = 64;
    type Mul = __m512i;

    #[inline(always)]
    unsafe fn zero() -> Self {
        GfniAvx512(_mm512_setzero_si512())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        GfniAvx512(_mm512_loadu_si512(src as *const _))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm512_storeu_si512(dst as *mut _, self.0)
    }
    #[inline(always)]
    unsafe fn store_stream(self, dst: *mut u8) {
        _mm512_stream_si512(dst as *mut _, self.0)
    }
    #[inline(always)]
    unsafe fn stream_fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        GfniAvx512(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn xor3(self, a: Self, b: Self) -> Self {
        GfniAvx512(_mm512_ternarylogic_epi64::<0x96>(self.0, a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        GfniAvx512(_mm512_gf2p8affine_epi64_epi8::<0>(self.0, _mm512_set1_epi64(MUL2_MATRIX)))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::Mul {
        _mm512_set1_epi64(affine_matrix(c) as i64)
    }
    #[inline(always)]
    unsafe fn mul(self, t: Self::Mul) -> Self {
        GfniAvx512(_mm512_gf2p8affine_epi64_epi8::<0>(self.0, t))
    }
}

#[derive(Clone, Copy)]
pub(crate) struct GfniAvx(__m256i);

impl Vector for GfniAvx {
    #[inline(always)]
    unsafe fn prefetch(ptr: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(ptr as *const i8)
    }
    const BYTES: usize = 32;
    type Mul = __m256i;

    #[inline(always)]
    unsafe fn zero() -> Self {
        GfniAvx(_mm256_setzero_si256())
    }
    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        GfniAvx(_mm256_loadu_si256(src as *const __m256i))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm256_storeu_si256(dst as *mut __m256i, self.0)
    }
    #[inline(always)]
    unsafe fn store_stream(self, dst: *mut u8) {
        _mm256_stream_si256(dst as *mut __m256i, self.0)
    }
    #[inline(always)]
    unsafe fn stream_fence() {
        _mm_sfence()
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        GfniAvx(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2(self) -> Self {
        GfniAvx(_mm256_gf2p8affine_epi64_epi8::<0>(self.0, _mm256_set1_epi64x(MUL2_MATRIX)))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::Mul {
        _mm256_set1_epi64x(affine_matrix(c) as i64)
    }
    #[inline(always)]
    unsafe fn mul(self, t: Self::Mul) -> Self {
        GfniAvx(_mm256_gf2p8affine_epi64_epi8::<0>(self.0, t))
    }
}
