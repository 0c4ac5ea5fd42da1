//! Four one-block keys hashed at once in the 64-bit lanes of AVX2 registers.
//!
//! This is the only module of the crate allowed `unsafe`: `std::arch` intrinsics are `unsafe`
//! to call because executing an AVX2 instruction on a CPU without AVX2 is undefined behaviour,
//! and the function compiled with `#[target_feature(enable = "avx2")]` is `unsafe` for the same
//! reason. Safe Rust cannot express "this CPU has AVX2", so the proof is a value: [`Avx2`] is
//! created only by [`Avx2::detect`] after `is_x86_feature_detected!("avx2")` said yes (the
//! answer is cached), and is the one way into the AVX2 code. The remaining `unsafe` is the
//! unaligned loads and stores, each from or into a fixed-size array it fits in.
//!
//! The compression itself is the portable one of [`super::oneblock`], generic over
//! [`Word`]: here a [`Word`] is four lanes, lane `l` holding the state of key `l`.
#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m256i, _mm256_add_epi64, _mm256_loadu_si256, _mm256_or_si256, _mm256_permute2x128_si256,
    _mm256_set1_epi64x, _mm256_setr_epi64x, _mm256_shuffle_epi32, _mm256_shuffle_epi8,
    _mm256_srli_epi64, _mm256_storeu_si256, _mm256_unpackhi_epi64, _mm256_unpacklo_epi64,
    _mm256_xor_si256,
};
use std::sync::OnceLock;

use super::oneblock::{first_word, to_digest, Word, BLOCK};

/// Proof that the CPU has AVX2: the only way to reach the AVX2 code.
#[derive(Clone, Copy, Debug)]
pub(super) struct Avx2 {
    _detected: (),
}

impl Avx2 {
    /// `Some` when the CPU has AVX2 (detected once per process, then cached).
    pub(super) fn detect() -> Option<Self> {
        static HAS_AVX2: OnceLock<bool> = OnceLock::new();
        let has = *HAS_AVX2.get_or_init(|| is_x86_feature_detected!("avx2"));
        has.then_some(Self { _detected: () })
    }

    /// The routing digests of four keys of at most `8 * W` bytes (`W` is 4, 8 or 16): key `l`
    /// zero-padded in `blocks[l]` (at least up to byte `8 * W`), `lens[l]` its length.
    #[inline]
    pub(super) fn digest4<const W: usize>(
        self,
        blocks: &[[u8; BLOCK]; 4],
        lens: [u64; 4],
    ) -> [u64; 4] {
        // SAFETY: `self` exists only if `detect` found AVX2 on this CPU, which is what
        // `digest4_avx2`'s `#[target_feature(enable = "avx2")]` requires.
        unsafe { digest4_avx2::<W>(blocks, lens) }
    }
}

/// [`Avx2::digest4`], compiled for AVX2.
///
/// # Safety
///
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn digest4_avx2<const W: usize>(blocks: &[[u8; BLOCK]; 4], lens: [u64; 4]) -> [u64; 4] {
    const { assert!(W % 4 == 0 && W <= 16, "whole rows of four words within one block") };
    let m: [Lanes; W] = transposed(blocks);
    let len = Lanes::set4(lens);
    let words = first_word::<Lanes, W>(&m, len).to_array();
    words.map(to_digest)
}

/// Message word `i` of the four keys in lanes: a 4×4 transposition of 64-bit words per four
/// words, from rows of 32 bytes of each block.
#[inline(always)]
fn transposed<const W: usize>(blocks: &[[u8; BLOCK]; 4]) -> [Lanes; W] {
    let mut m = [Lanes::splat(0); W];
    for j in (0..W).step_by(4) {
        let row = |l: usize| {
            let bytes: &[u8; 32] =
                blocks[l][8 * j..8 * j + 32].try_into().expect("a row within the block");
            Lanes::load(bytes)
        };
        let [a, b, c, d] = [row(0), row(1), row(2), row(3)];
        [m[j], m[j + 1], m[j + 2], m[j + 3]] = Lanes::transpose4(a, b, c, d);
    }
    m
}

/// Four 64-bit words, one per key. Values of this type are made only inside
/// [`digest4_avx2`] (the one caller of `first_word::<Lanes, _>`, `transposed` and the
/// constructors below), so every method runs on a CPU with AVX2: that is what makes the
/// intrinsic calls in these safe functions sound. Every method is `#[inline(always)]`, so it is
/// compiled into `digest4_avx2`'s AVX2 code.
#[derive(Clone, Copy)]
struct Lanes(__m256i);

impl Lanes {
    #[inline(always)]
    fn set4(x: [u64; 4]) -> Self {
        let [a, b, c, d] = x.map(|w| w as i64);
        // SAFETY: AVX2 is present (see the type's docs).
        Self(unsafe { _mm256_setr_epi64x(a, b, c, d) })
    }

    #[inline(always)]
    fn load(bytes: &[u8; 32]) -> Self {
        // SAFETY: AVX2 is present (see the type's docs); the unaligned load reads exactly the
        // 32 bytes of `bytes`.
        Self(unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) })
    }

    #[inline(always)]
    fn to_array(self) -> [u64; 4] {
        let mut out = [0u64; 4];
        // SAFETY: AVX2 is present (see the type's docs); the unaligned store writes exactly the
        // 32 bytes of `out`.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), self.0) };
        out
    }

    /// Rows `a..d` (word `k` of key `l` in lane `k` of row `l`) to columns (word `k` of every
    /// key, key `l` in lane `l`).
    #[inline(always)]
    fn transpose4(a: Self, b: Self, c: Self, d: Self) -> [Self; 4] {
        // SAFETY: AVX2 is present (see the type's docs); no memory is touched.
        unsafe {
            let ab_even = _mm256_unpacklo_epi64(a.0, b.0); // a0 b0 a2 b2
            let ab_odd = _mm256_unpackhi_epi64(a.0, b.0); // a1 b1 a3 b3
            let cd_even = _mm256_unpacklo_epi64(c.0, d.0); // c0 d0 c2 d2
            let cd_odd = _mm256_unpackhi_epi64(c.0, d.0); // c1 d1 c3 d3
            [
                Self(_mm256_permute2x128_si256(ab_even, cd_even, 0x20)), // a0 b0 c0 d0
                Self(_mm256_permute2x128_si256(ab_odd, cd_odd, 0x20)),   // a1 b1 c1 d1
                Self(_mm256_permute2x128_si256(ab_even, cd_even, 0x31)), // a2 b2 c2 d2
                Self(_mm256_permute2x128_si256(ab_odd, cd_odd, 0x31)),   // a3 b3 c3 d3
            ]
        }
    }

    /// Rotation right by a whole number of bytes: a byte shuffle within each 64-bit lane.
    #[inline(always)]
    fn ror_bytes(self, mask: &[u8; 32]) -> Self {
        // SAFETY: AVX2 is present (see the type's docs); `load` reads only `mask`.
        Self(unsafe { _mm256_shuffle_epi8(self.0, Self::load(mask).0) })
    }
}

/// The byte shuffle that rotates each 64-bit lane right by `n` bytes: output byte `i` of a lane
/// is its input byte `(i + n) % 8`.
const fn ror_mask(n: usize) -> [u8; 32] {
    let mut mask = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        mask[i] = (i - i % 8 + (i % 8 + n) % 8) as u8;
        i += 1;
    }
    mask
}

const ROR24: [u8; 32] = ror_mask(3);
const ROR16: [u8; 32] = ror_mask(2);

impl Word for Lanes {
    #[inline(always)]
    fn splat(x: u64) -> Self {
        // SAFETY: AVX2 is present (see the type's docs).
        Self(unsafe { _mm256_set1_epi64x(x as i64) })
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        // SAFETY: AVX2 is present (see the type's docs).
        Self(unsafe { _mm256_add_epi64(self.0, other.0) })
    }
    #[inline(always)]
    fn xor(self, other: Self) -> Self {
        // SAFETY: AVX2 is present (see the type's docs).
        Self(unsafe { _mm256_xor_si256(self.0, other.0) })
    }
    #[inline(always)]
    fn ror32(self) -> Self {
        // Swapping the 32-bit halves of each lane.
        // SAFETY: AVX2 is present (see the type's docs).
        Self(unsafe { _mm256_shuffle_epi32(self.0, 0b10_11_00_01) })
    }
    #[inline(always)]
    fn ror24(self) -> Self {
        self.ror_bytes(&ROR24)
    }
    #[inline(always)]
    fn ror16(self) -> Self {
        self.ror_bytes(&ROR16)
    }
    #[inline(always)]
    fn ror63(self) -> Self {
        // (x >> 63) | (x << 1), with x << 1 as x + x.
        // SAFETY: AVX2 is present (see the type's docs).
        Self(unsafe {
            _mm256_or_si256(_mm256_srli_epi64(self.0, 63), _mm256_add_epi64(self.0, self.0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::oneblock;
    use super::*;

    #[test]
    fn four_lanes_equal_the_scalar_compression() {
        let Some(avx2) = Avx2::detect() else { return };
        let bytes: Vec<u8> = (0..=BLOCK as u8).map(|i| i.wrapping_mul(91) ^ 0xc3).collect();
        for base in 0..=BLOCK - 3 {
            let lens = [base, base + 1, base + 3, (base * 7) % (BLOCK + 1)];
            let mut blocks = [[0u8; BLOCK]; 4];
            for (block, &len) in blocks.iter_mut().zip(&lens) {
                block[..len].copy_from_slice(&bytes[..len]);
            }
            let got = match lens.iter().map(|&l| oneblock::words_for(l)).max() {
                Some(4) => avx2.digest4::<4>(&blocks, lens.map(|l| l as u64)),
                Some(8) => avx2.digest4::<8>(&blocks, lens.map(|l| l as u64)),
                _ => avx2.digest4::<16>(&blocks, lens.map(|l| l as u64)),
            };
            let want = lens.map(|len| oneblock::digest(&bytes[..len]));
            assert_eq!(got, want, "lengths {lens:?}");
        }
    }
}
