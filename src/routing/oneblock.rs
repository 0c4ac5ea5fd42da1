//! The routing hash of a key of at most one BLAKE2b block (128 bytes), specialised for the one
//! parameter block routing uses: unkeyed, 8-byte digest, fanout 1, depth 1, no salt or personal.
//!
//! With that parameter block fixed, `h` is a constant; a key of at most [`BLOCK`] bytes is one
//! compression of its zero-padded bytes (a 0-byte key is one zero block), with the byte counter
//! `t0` = the key length, `t1` = 0 and the last-block flag set. Only the first output word
//! `h[0] ^ v[0] ^ v[8]` is needed (it holds the 8 digest bytes), so nothing else is finalised;
//! since the state lives in locals, the compiler also drops the parts of the last round that
//! feed only the unused words (two of its eight G functions and some final rotations).
//!
//! The compression is written once, generic over [`Word`]: `u64` gives the portable scalar
//! router (any target), and the AVX2 module implements [`Word`] for four keys in the lanes of
//! one 256-bit register. The message words past `W` are known to be zero (keys of at most
//! `8 * W` bytes), so their additions are left out at compile time.

/// Bytes in one BLAKE2b block: keys up to this length take one compression.
pub(crate) const BLOCK: usize = 128;

/// The BLAKE2b initialisation vector (RFC 7693, section 2.6).
const IV: [u64; 8] = [
    0x6A09_E667_F3BC_C908,
    0xBB67_AE85_84CA_A73B,
    0x3C6E_F372_FE94_F82B,
    0xA54F_F53A_5F1D_36F1,
    0x510E_527F_ADE6_82D1,
    0x9B05_688C_2B3E_6C1F,
    0x1F83_D9AB_FB41_BD6B,
    0x5BE0_CD19_137E_2179,
];

/// The message schedule of the twelve rounds (RFC 7693, section 2.7).
const SIGMA: [[usize; 16]; 12] = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
    [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
    [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
    [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
    [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
    [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
    [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
    [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
    [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
    [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
];

/// The first word of the parameter block: digest length 8, key length 0, fanout 1, depth 1
/// (little-endian bytes `08 00 01 01`). The other seven words are zero.
const PARAM0: u64 = 0x0101_0008;

/// `h[0]` after initialisation; `h[1..8]` are `IV[1..8]` unchanged.
const H0: u64 = IV[0] ^ PARAM0;

/// One 64-bit word of the state, or several side by side in SIMD lanes.
pub(super) trait Word: Copy {
    /// Every lane set to `x`.
    fn splat(x: u64) -> Self;
    /// Lane-wise wrapping addition.
    fn add(self, other: Self) -> Self;
    /// Lane-wise exclusive or.
    fn xor(self, other: Self) -> Self;
    /// Lane-wise rotation right by 32 bits.
    fn ror32(self) -> Self;
    /// Lane-wise rotation right by 24 bits.
    fn ror24(self) -> Self;
    /// Lane-wise rotation right by 16 bits.
    fn ror16(self) -> Self;
    /// Lane-wise rotation right by 63 bits.
    fn ror63(self) -> Self;
}

impl Word for u64 {
    #[inline(always)]
    fn splat(x: u64) -> Self {
        x
    }
    #[inline(always)]
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    #[inline(always)]
    fn xor(self, other: Self) -> Self {
        self ^ other
    }
    #[inline(always)]
    fn ror32(self) -> Self {
        self.rotate_right(32)
    }
    #[inline(always)]
    fn ror24(self) -> Self {
        self.rotate_right(24)
    }
    #[inline(always)]
    fn ror16(self) -> Self {
        self.rotate_right(16)
    }
    #[inline(always)]
    fn ror63(self) -> Self {
        self.rotate_right(63)
    }
}

/// `x + m[i]`, or `x` when word `i` is past the `W` words that can be non-zero. `i` is a
/// constant once the rounds are inlined, so the test disappears.
#[inline(always)]
fn add_msg<V: Word, const W: usize>(x: V, m: &[V; W], i: usize) -> V {
    if i < W {
        x.add(m[i])
    } else {
        x
    }
}

/// The G mixing function on `v[a], v[b], v[c], v[d]` with message words `x`, `y`.
#[inline(always)]
fn g<V: Word, const W: usize>(
    v: &mut [V; 16],
    [a, b, c, d]: [usize; 4],
    m: &[V; W],
    xy: [usize; 2],
) {
    v[a] = add_msg(v[a].add(v[b]), m, xy[0]);
    v[d] = v[d].xor(v[a]).ror32();
    v[c] = v[c].add(v[d]);
    v[b] = v[b].xor(v[c]).ror24();
    v[a] = add_msg(v[a].add(v[b]), m, xy[1]);
    v[d] = v[d].xor(v[a]).ror16();
    v[c] = v[c].add(v[d]);
    v[b] = v[b].xor(v[c]).ror63();
}

/// Round `R`: the four column G functions, then the four diagonal ones.
#[inline(always)]
fn round<V: Word, const W: usize, const R: usize>(v: &mut [V; 16], m: &[V; W]) {
    let s = &SIGMA[R];
    g(v, [0, 4, 8, 12], m, [s[0], s[1]]);
    g(v, [1, 5, 9, 13], m, [s[2], s[3]]);
    g(v, [2, 6, 10, 14], m, [s[4], s[5]]);
    g(v, [3, 7, 11, 15], m, [s[6], s[7]]);
    g(v, [0, 5, 10, 15], m, [s[8], s[9]]);
    g(v, [1, 6, 11, 12], m, [s[10], s[11]]);
    g(v, [2, 7, 8, 13], m, [s[12], s[13]]);
    g(v, [3, 4, 9, 14], m, [s[14], s[15]]);
}

/// The first output word of the one compression of a key: `m` its first `W` message words
/// (little-endian, zero past the key; every later word is zero), `len` its length in bytes.
/// Read big-endian, that is the routing digest (see [`to_digest`]).
#[inline(always)]
pub(super) fn first_word<V: Word, const W: usize>(m: &[V; W], len: V) -> V {
    let s = V::splat;
    let mut v = [
        s(H0),
        s(IV[1]),
        s(IV[2]),
        s(IV[3]),
        s(IV[4]),
        s(IV[5]),
        s(IV[6]),
        s(IV[7]),
        s(IV[0]),
        s(IV[1]),
        s(IV[2]),
        s(IV[3]),
        // t0 = the key length; t1 = 0 leaves v[13] alone.
        s(IV[4]).xor(len),
        s(IV[5]),
        // The last-block flag: the block is the final one.
        s(!IV[6]),
        // The last-node flag is clear (no tree hashing).
        s(IV[7]),
    ];
    round::<V, W, 0>(&mut v, m);
    round::<V, W, 1>(&mut v, m);
    round::<V, W, 2>(&mut v, m);
    round::<V, W, 3>(&mut v, m);
    round::<V, W, 4>(&mut v, m);
    round::<V, W, 5>(&mut v, m);
    round::<V, W, 6>(&mut v, m);
    round::<V, W, 7>(&mut v, m);
    round::<V, W, 8>(&mut v, m);
    round::<V, W, 9>(&mut v, m);
    round::<V, W, 10>(&mut v, m);
    round::<V, W, 11>(&mut v, m);
    s(H0).xor(v[0]).xor(v[8])
}

/// The routing digest from the first output word: its little-endian bytes are the 8-byte
/// BLAKE2b digest, which routing reads big-endian.
#[inline(always)]
pub(super) fn to_digest(word: u64) -> u64 {
    word.swap_bytes()
}

/// Message words (past the `8 * W` bytes a lane group needs) that are kept: keys of at most
/// 32, 64 or 128 bytes. Returns `W` for a key of `len` bytes (`len <= BLOCK`).
pub(super) fn words_for(len: usize) -> usize {
    debug_assert!(len <= BLOCK, "one block");
    if len <= 32 {
        4
    } else if len <= 64 {
        8
    } else {
        16
    }
}

/// The routing digest of a key of at most [`BLOCK`] bytes, portable scalar code.
pub(super) fn digest(key: &[u8]) -> u64 {
    let mut block = [0u8; BLOCK];
    block[..key.len()].copy_from_slice(key);
    let len = key.len() as u64;
    match words_for(key.len()) {
        4 => to_digest(first_word::<u64, 4>(&words(&block), len)),
        8 => to_digest(first_word::<u64, 8>(&words(&block), len)),
        _ => to_digest(first_word::<u64, 16>(&words(&block), len)),
    }
}

/// The first `W` little-endian message words of a zero-padded block.
#[inline(always)]
fn words<const W: usize>(block: &[u8; BLOCK]) -> [u64; W] {
    std::array::from_fn(|i| {
        let bytes: [u8; 8] = block[8 * i..8 * i + 8].try_into().expect("8 bytes within the block");
        u64::from_le_bytes(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(key: &[u8]) -> u64 {
        let hash = blake2b_simd::Params::new().hash_length(8).hash(key);
        u64::from_be_bytes(hash.as_bytes().try_into().expect("8 bytes"))
    }

    #[test]
    fn every_length_of_one_block_matches_the_general_hash() {
        let bytes: Vec<u8> = (0..=BLOCK as u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for len in 0..=BLOCK {
            assert_eq!(digest(&bytes[..len]), reference(&bytes[..len]), "length {len}");
        }
        assert_eq!(digest(b"sub_42"), 0xf5b2_4497_245f_fd82);
    }
}
