//! Routing: key → partition, byte-for-byte compatible with the reference Python design.
//!
//! `partition = u64::from_be_bytes(BLAKE2b(key_utf8, digest_size = 8)) % count`, exactly
//! `int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % count`.
//! BLAKE2b with an 8-byte digest writes the length into its parameter block, so it is *not*
//! the first 8 bytes of a 64-byte digest; `testdata/routing_vectors.jsonl` pins the answers.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use blake2::digest::consts::U8;
use blake2::{Blake2b, Digest};
use serde::{Deserialize, Serialize};

use crate::ids::PartitionId;

#[cfg(target_arch = "x86_64")]
mod avx2;
mod oneblock;

use avx2::Avx2;

/// BLAKE2b parameterised for an 8-byte digest (the reference's `digest_size=8`).
type Blake2b64 = Blake2b<U8>;

/// Errors of routing configuration. Every variant names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RoutingError {
    /// The partition count is outside `1..=32767` (the schema stores partitions as SMALLINT).
    #[error("partition count {value} is out of range: it must be between 1 and {max}", max = PartitionCount::MAX)]
    CountOutOfRange {
        /// The count as given.
        value: i64,
    },
    /// The partition count is not a whole number.
    #[error("partition count {text:?} is not a whole number between 1 and {max}", max = PartitionCount::MAX)]
    CountNotANumber {
        /// The text as given.
        text: String,
    },
    /// An override pins a key to a partition that does not exist under the count.
    #[error("override pins key {key:?} to partition {partition}, but the count is {count} (partitions 0..{count})")]
    OverrideOutOfRange {
        /// The pinned key.
        key: String,
        /// The partition it was pinned to.
        partition: u16,
        /// The partition count in force.
        count: u16,
    },
}

/// A validated partition count: `1..=32767`. Division by zero and SMALLINT overflow are
/// impossible once one of these exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "u16")]
pub struct PartitionCount(u16);

impl PartitionCount {
    /// The largest count: partitions are stored in a PostgreSQL `SMALLINT`.
    pub const MAX: u16 = i16::MAX as u16;

    /// Validates `value` as a count; any integer type converts through `i64`.
    pub fn new(value: i64) -> Result<Self, RoutingError> {
        match u16::try_from(value) {
            Ok(n) if (1..=Self::MAX).contains(&n) => Ok(Self(n)),
            _ => Err(RoutingError::CountOutOfRange { value }),
        }
    }

    /// The count as a number.
    pub fn get(self) -> u16 {
        self.0
    }

    /// Every partition under this count, in ascending order.
    pub fn partitions(self) -> impl Iterator<Item = PartitionId> {
        (0..self.0).map(PartitionId)
    }

    /// Whether `partition` exists under this count.
    pub fn contains(self, partition: PartitionId) -> bool {
        partition.0 < self.0
    }
}

impl TryFrom<i64> for PartitionCount {
    type Error = RoutingError;

    fn try_from(value: i64) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<PartitionCount> for u16 {
    fn from(count: PartitionCount) -> u16 {
        count.0
    }
}

impl FromStr for PartitionCount {
    type Err = RoutingError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let value: i64 = text
            .trim()
            .parse()
            .map_err(|_| RoutingError::CountNotANumber { text: text.to_owned() })?;
        Self::new(value)
    }
}

impl fmt::Display for PartitionCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The full 64-bit routing value of `key`: the 8-byte BLAKE2b digest read big-endian.
pub fn key_digest(key: &str) -> u64 {
    digest_with(&mut Blake2b64::new(), key)
}

/// The partition of `key` under `count`, identical to the reference Python `partition_for`.
pub fn partition_for(key: &str, count: PartitionCount) -> PartitionId {
    reduce(key_digest(key), count)
}

/// Routes every key of `keys` into `out` (cleared first), in order. Gives exactly the answers
/// of [`partition_for`]; the keys are hashed several at a time in SIMD lanes (see
/// [`digest_many`]).
pub fn route_many<K: AsRef<str>>(keys: &[K], count: PartitionCount, out: &mut Vec<PartitionId>) {
    route_many_with(keys, count, out, Lanes::Detect);
}

/// Routes `keys[i]` into `out[i]` for every `i`, the answers of [`partition_for`], into a slice
/// the caller owns: nothing is allocated unless a key is longer than [`LANE_KEY_MAX`] bytes.
///
/// # Panics
///
/// If `out` is not exactly as long as `keys`.
pub fn route_into<K: AsRef<str>>(keys: &[K], count: PartitionCount, out: &mut [PartitionId]) {
    route_into_with(keys, count, out, Lanes::Detect);
}

/// The routing digests of `keys` into `out` (cleared first), in order: for callers that reduce
/// one digest by several counts (repartition planning). Exactly [`key_digest`] of each key.
///
/// Keys of at most [`LANE_KEY_MAX`] bytes (one BLAKE2b block) go through a compression
/// specialised for routing's fixed parameter block and single final block, four keys at a time
/// in AVX2 lanes where the CPU has AVX2 (detected at run time, once), else one at a time in
/// portable code. Longer keys are hashed by `blake2b_simd`'s general multi-lane code, gathered
/// apart so they never hold the one-block lanes back.
pub fn digest_many<K: AsRef<str>>(keys: &[K], out: &mut Vec<u64>) {
    digest_many_with(keys, out, Lanes::Detect);
}

/// [`digest_many`] into a slice the caller owns: `out[i]` is [`key_digest`] of `keys[i]`.
///
/// # Panics
///
/// If `out` is not exactly as long as `keys`.
pub fn digest_into<K: AsRef<str>>(keys: &[K], out: &mut [u64]) {
    digest_into_with(keys, out, Lanes::Detect);
}

/// Keys of at most this many bytes (one BLAKE2b block, one compression) take the specialised
/// one-block router; longer keys take the general BLAKE2b code.
pub const LANE_KEY_MAX: usize = oneblock::BLOCK;

/// Long keys gathered per call into `blake2b_simd`'s lanes: a multiple of every lane count,
/// small enough that the jobs stay in L1.
const LONG_CHUNK: usize = 64;

/// Which implementation the batch router uses. Not part of the API: it exists so the tests and
/// the benchmark can run the batch path with SIMD forced off.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    /// The fastest the CPU supports, detected at run time: AVX2 four-way for one-block keys
    /// (scalar without AVX2), `blake2b_simd`'s best for longer keys.
    Detect,
    /// SIMD forced off: the portable one-block compression one key at a time, and
    /// `blake2b_simd`'s portable code for longer keys.
    Portable,
}

/// The implementation the one-block keys take under `lanes` on this CPU: `"avx2"` or
/// `"portable"` (for the tests and the benchmark's labels).
#[doc(hidden)]
pub fn one_block_backend(lanes: Lanes) -> &'static str {
    match (lanes, Avx2::detect()) {
        (Lanes::Detect, Some(_)) => "avx2",
        _ => "portable",
    }
}

/// [`route_many`] with the implementation chosen (tests use it to force SIMD off).
#[doc(hidden)]
pub fn route_many_with<K: AsRef<str>>(
    keys: &[K],
    count: PartitionCount,
    out: &mut Vec<PartitionId>,
    lanes: Lanes,
) {
    out.clear();
    out.resize(keys.len(), PartitionId(0));
    route_into_with(keys, count, out, lanes);
}

/// [`route_into`] with the implementation chosen (tests use it to force SIMD off).
#[doc(hidden)]
pub fn route_into_with<K: AsRef<str>>(
    keys: &[K],
    count: PartitionCount,
    out: &mut [PartitionId],
    lanes: Lanes,
) {
    assert_eq!(keys.len(), out.len(), "one output slot per key");
    let modulus = Modulus::new(count);
    for_each_digest(keys, lanes, |i, digest| out[i] = modulus.reduce(digest));
}

/// [`digest_many`] with the implementation chosen (tests use it to force SIMD off).
#[doc(hidden)]
pub fn digest_many_with<K: AsRef<str>>(keys: &[K], out: &mut Vec<u64>, lanes: Lanes) {
    out.clear();
    out.resize(keys.len(), 0);
    digest_into_with(keys, out, lanes);
}

/// [`digest_into`] with the implementation chosen (tests use it to force SIMD off).
#[doc(hidden)]
pub fn digest_into_with<K: AsRef<str>>(keys: &[K], out: &mut [u64], lanes: Lanes) {
    assert_eq!(keys.len(), out.len(), "one output slot per key");
    for_each_digest(keys, lanes, |i, digest| out[i] = digest);
}

/// Calls `emit(i, digest)` once for every index `i` of `keys`: in order within the one-block
/// keys and within the long keys, but a long key's digest may come after later short keys'.
/// One-block keys go four at a time through the AVX2 lanes (or one at a time through the
/// portable compression); long keys are gathered [`LONG_CHUNK`] at a time for `blake2b_simd`.
fn for_each_digest<K: AsRef<str>>(keys: &[K], lanes: Lanes, mut emit: impl FnMut(usize, u64)) {
    let avx2 = match lanes {
        Lanes::Detect => Avx2::detect(),
        Lanes::Portable => None,
    };
    let mut group = Group::new();
    let mut long = LongKeys::new(lanes);
    for (i, key) in keys.iter().enumerate() {
        let key = key.as_ref().as_bytes();
        if key.len() > LANE_KEY_MAX {
            long.push(i, key, &mut emit);
        } else if let Some(avx2) = avx2 {
            group.push(avx2, i, key, &mut emit);
        } else {
            emit(i, oneblock::digest(key));
        }
    }
    if let Some(avx2) = avx2 {
        group.flush(avx2, &mut emit);
    }
    long.flush(&mut emit);
}

/// Up to four one-block keys waiting for the AVX2 lanes, each copied into a zero-padded block.
struct Group {
    blocks: [[u8; oneblock::BLOCK]; 4],
    lens: [usize; 4],
    /// The index of each waiting key in the caller's slice.
    at: [usize; 4],
    waiting: usize,
}

impl Group {
    fn new() -> Self {
        Self { blocks: [[0; oneblock::BLOCK]; 4], lens: [0; 4], at: [0; 4], waiting: 0 }
    }

    /// Adds key `i` (at most one block), hashing the group when it is full.
    #[inline]
    fn push(&mut self, avx2: Avx2, i: usize, key: &[u8], emit: &mut impl FnMut(usize, u64)) {
        let lane = self.waiting;
        let block = &mut self.blocks[lane];
        // Invariant: every block is zero past its lane's `lens`. Clearing a fixed 32 bytes
        // (one store) keeps it for short keys; otherwise the whole block is cleared.
        if self.lens[lane] <= 32 && key.len() <= 32 {
            block[..32].fill(0);
        } else {
            block.fill(0);
        }
        block[..key.len()].copy_from_slice(key);
        self.lens[lane] = key.len();
        self.at[lane] = i;
        self.waiting += 1;
        if self.waiting == 4 {
            self.flush(avx2, emit);
        }
    }

    /// Hashes the waiting keys (lanes past them hash stale blocks, and are ignored).
    fn flush(&mut self, avx2: Avx2, emit: &mut impl FnMut(usize, u64)) {
        let n = self.waiting;
        if n == 0 {
            return;
        }
        self.waiting = 0;
        let longest = self.lens[..n].iter().copied().max().unwrap_or(0);
        let lens = self.lens.map(|l| l as u64);
        let digests = match oneblock::words_for(longest) {
            4 => avx2.digest4::<4>(&self.blocks, lens),
            8 => avx2.digest4::<8>(&self.blocks, lens),
            _ => avx2.digest4::<16>(&self.blocks, lens),
        };
        for (&i, &digest) in self.at[..n].iter().zip(&digests) {
            emit(i, digest);
        }
    }
}

/// Keys longer than one block waiting for `blake2b_simd`'s general multi-lane code.
struct LongKeys<'k> {
    params: blake2b_simd::Params,
    jobs: Vec<(usize, blake2b_simd::many::HashManyJob<'k>)>,
}

impl<'k> LongKeys<'k> {
    fn new(lanes: Lanes) -> Self {
        let mut params = blake2b_simd::Params::new();
        params.hash_length(8);
        if lanes == Lanes::Portable {
            // blake2b_simd's own switch to its portable code (doc-hidden, kept for its
            // benchmarks, so a minor release could drop it: the build would then fail here,
            // not silently); only the tests' and the benchmark's forced-portable runs take it.
            blake2b_simd::benchmarks::force_portable(&mut params);
        }
        // No allocation until a long key comes.
        Self { params, jobs: Vec::new() }
    }

    fn push(&mut self, i: usize, key: &'k [u8], emit: &mut impl FnMut(usize, u64)) {
        if self.jobs.capacity() == 0 {
            self.jobs.reserve_exact(LONG_CHUNK);
        }
        self.jobs.push((i, blake2b_simd::many::HashManyJob::new(&self.params, key)));
        if self.jobs.len() == LONG_CHUNK {
            self.flush(emit);
        }
    }

    fn flush(&mut self, emit: &mut impl FnMut(usize, u64)) {
        blake2b_simd::many::hash_many(self.jobs.iter_mut().map(|(_, job)| job));
        for (i, job) in self.jobs.drain(..) {
            let hash = job.to_hash();
            let bytes: [u8; 8] = hash.as_bytes().try_into().expect("the digest length is 8");
            emit(i, u64::from_be_bytes(bytes));
        }
    }
}

/// Off x86-64 there is no AVX2 path: the one-block keys take the portable compression.
#[cfg(not(target_arch = "x86_64"))]
mod avx2 {
    use super::oneblock::BLOCK;

    /// Never constructed: no AVX2 here.
    #[derive(Clone, Copy, Debug)]
    pub(super) enum Avx2 {}

    impl Avx2 {
        pub(super) fn detect() -> Option<Self> {
            None
        }

        pub(super) fn digest4<const W: usize>(self, _: &[[u8; BLOCK]; 4], _: [u64; 4]) -> [u64; 4] {
            match self {}
        }
    }
}

/// The partition of a routing digest under `count` (see [`key_digest`]).
pub fn partition_of_digest(digest: u64, count: PartitionCount) -> PartitionId {
    reduce(digest, count)
}

fn digest_with(hasher: &mut Blake2b64, key: &str) -> u64 {
    hasher.update(key.as_bytes());
    u64::from_be_bytes(hasher.finalize_reset().into())
}

fn reduce(value: u64, count: PartitionCount) -> PartitionId {
    // The remainder is below `count`, which is at most 32767: it fits in a u16.
    PartitionId((value % u64::from(count.0)) as u16)
}

/// [`reduce`] for many digests by one count without a division each (a 64-bit `div` was half
/// of the batch router's non-hashing time): Lemire, Kaser and Kurz, "Faster remainder by direct
/// computation" (2019). With `m = ceil(2^128 / d)`, `x % d` is the high 128 bits of
/// `(m * x mod 2^128) * d`, exact for every 64-bit `x` since 128 >= 64 + log2(d). For `d = 1`,
/// `m` wraps to 0 and the answer is 0, as it should be.
#[derive(Clone, Copy, Debug)]
struct Modulus {
    m: u128,
    d: u64,
}

impl Modulus {
    fn new(count: PartitionCount) -> Self {
        let d = u64::from(count.0);
        Self { m: (u128::MAX / u128::from(d)).wrapping_add(1), d }
    }

    #[inline]
    fn reduce(self, value: u64) -> PartitionId {
        let low = self.m.wrapping_mul(u128::from(value));
        let d = u128::from(self.d);
        // The high half of the 256-bit product `low * d`, from two 128-bit products.
        let high = ((low >> 64) * d + (((low as u64) as u128 * d) >> 64)) >> 64;
        // The remainder is below `count`, which is at most 32767: it fits in a u16.
        PartitionId(high as u16)
    }
}

/// Explicit key → partition pins, consulted before the hash (for a whale tenant whose hash
/// position would crowd a partition). Kept in a `BTreeMap`, so iteration order is stable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Overrides(BTreeMap<String, PartitionId>);

impl Overrides {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pins `key` to `partition`, replacing an earlier pin of the same key.
    pub fn pin(&mut self, key: impl Into<String>, partition: PartitionId) -> &mut Self {
        self.0.insert(key.into(), partition);
        self
    }

    /// Removes the pin of `key` (it routes by the hash again); the partition it was pinned to.
    pub fn unpin(&mut self, key: &str) -> Option<PartitionId> {
        self.0.remove(key)
    }

    /// The pin of `key`, if any.
    pub fn lookup(&self, key: &str) -> Option<PartitionId> {
        self.0.get(key).copied()
    }

    /// Every pin, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&String, PartitionId)> {
        self.0.iter().map(|(k, p)| (k, *p))
    }

    /// How many keys are pinned.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no key is pinned.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks that every pin exists under `count`; the first one that does not is the error.
    pub fn validate(&self, count: PartitionCount) -> Result<(), RoutingError> {
        match self.0.iter().find(|(_, p)| !count.contains(**p)) {
            Some((key, p)) => Err(RoutingError::OverrideOutOfRange {
                key: key.clone(),
                partition: p.0,
                count: count.get(),
            }),
            None => Ok(()),
        }
    }
}

/// A routing configuration: a count plus overrides, validated together at construction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Router {
    count: PartitionCount,
    overrides: Overrides,
}

impl Router {
    /// A router with no overrides.
    pub fn new(count: PartitionCount) -> Self {
        Self { count, overrides: Overrides::new() }
    }

    /// A router with `overrides`, refused if a pin does not exist under `count`.
    pub fn with_overrides(
        count: PartitionCount,
        overrides: Overrides,
    ) -> Result<Self, RoutingError> {
        overrides.validate(count)?;
        Ok(Self { count, overrides })
    }

    /// The count this router reduces by.
    pub fn count(&self) -> PartitionCount {
        self.count
    }

    /// The pins this router consults first.
    pub fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The partition of `key`: its pin if it has one, else the hash.
    pub fn route(&self, key: &str) -> PartitionId {
        self.overrides.lookup(key).unwrap_or_else(|| partition_for(key, self.count))
    }

    /// Routes `keys` into `out` (cleared first); the same answers as [`Router::route`].
    pub fn route_many<K: AsRef<str>>(&self, keys: &[K], out: &mut Vec<PartitionId>) {
        if self.overrides.is_empty() {
            return route_many(keys, self.count, out);
        }
        out.clear();
        out.resize(keys.len(), PartitionId(0));
        for_each_digest(keys, Lanes::Detect, |i, digest| {
            let key = keys[i].as_ref();
            out[i] = self.overrides.lookup(key).unwrap_or_else(|| reduce(digest, self.count));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: i64) -> PartitionCount {
        PartitionCount::new(n).expect("valid count")
    }

    #[test]
    fn reference_examples() {
        // From python3: int.from_bytes(hashlib.blake2b(b"sub_42", digest_size=8).digest(), "big")
        assert_eq!(key_digest("sub_42"), 0xf5b2_4497_245f_fd82);
        assert_eq!(partition_for("sub_42", count(16)), PartitionId(2));
        assert_eq!(partition_for("sub_7", count(16)), PartitionId(10));
    }

    #[test]
    fn the_division_free_remainder_equals_the_remainder() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut values = vec![0, 1, u64::MAX, u64::MAX - 1, 1 << 63, (1 << 63) - 1];
        for _ in 0..64 {
            // xorshift64: arbitrary digests, reproducibly.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            values.push(rng);
        }
        for n in 1..=32767 {
            let modulus = Modulus::new(count(n));
            let d = n as u64;
            let edges = [d - 1, d, d + 1, u64::MAX / d * d, (u64::MAX / d * d).wrapping_sub(1)];
            for &v in values.iter().chain(&edges) {
                assert_eq!(modulus.reduce(v), reduce(v, count(n)), "{v} % {n}");
            }
        }
    }

    #[test]
    fn counts_outside_the_smallint_range_are_refused() {
        for bad in [0, -1, -32768, 32768, 40000, i64::MAX, i64::MIN] {
            assert_eq!(PartitionCount::new(bad), Err(RoutingError::CountOutOfRange { value: bad }));
        }
        assert_eq!(count(1).get(), 1);
        assert_eq!(count(32767).get(), 32767);
        assert!(matches!(
            "abc".parse::<PartitionCount>(),
            Err(RoutingError::CountNotANumber { .. })
        ));
        assert_eq!("16".parse::<PartitionCount>(), Ok(count(16)));
        let msg = PartitionCount::new(40000).unwrap_err().to_string();
        assert!(msg.contains("between 1 and 32767"), "{msg}");
    }

    #[test]
    fn batch_equals_single() {
        let keys: Vec<String> = (0..500).map(|i| format!("sub_{i}")).collect();
        let mut out = vec![PartitionId(9999)];
        route_many(&keys, count(64), &mut out);
        let single: Vec<_> = keys.iter().map(|k| partition_for(k, count(64))).collect();
        assert_eq!(out, single);
    }

    /// Keys of every length 0..=300 in a fixed shuffle, so one-block groups of four mix
    /// lengths across the 32/64/128-byte word counts (and stale longer keys sit in the lanes
    /// before short ones), and more than a chunk of long keys queue up between them.
    #[test]
    fn batches_of_every_length_equal_single_keys_with_and_without_simd() {
        let text: String = (0..300u32).map(|i| char::from(b'a' + (i * 7 % 26) as u8)).collect();
        let mut keys: Vec<&str> = Vec::new();
        for round in 0..3 {
            for len in 0..=300 {
                keys.push(&text[(round * 11) % (301 - len).max(1)..][..len]);
            }
        }
        // A deterministic shuffle: multiply the index by a unit modulo the length.
        let n = keys.len();
        let shuffled: Vec<&str> = (0..n).map(|i| keys[(i * 389) % n]).collect();
        let single: Vec<PartitionId> =
            shuffled.iter().map(|k| partition_for(k, count(61))).collect();
        let digests: Vec<u64> = shuffled.iter().map(|k| key_digest(k)).collect();
        for lanes in [Lanes::Detect, Lanes::Portable] {
            let mut out = Vec::new();
            route_many_with(&shuffled, count(61), &mut out, lanes);
            assert_eq!(out, single, "{lanes:?}");
            let mut ds = Vec::new();
            digest_many_with(&shuffled, &mut ds, lanes);
            assert_eq!(ds, digests, "{lanes:?}");
            // Batch sizes that end mid-group and mid-chunk.
            for size in [1, 3, 5, 63, 65, 130] {
                route_many_with(&shuffled[..size], count(61), &mut out, lanes);
                assert_eq!(out, single[..size], "{lanes:?}, {size} keys");
            }
        }
    }

    #[test]
    fn overrides_win_and_are_validated() {
        let mut pins = Overrides::new();
        pins.pin("whale", PartitionId(3));
        let router = Router::with_overrides(count(16), pins.clone()).expect("pin in range");
        assert_eq!(router.route("whale"), PartitionId(3));
        assert_eq!(router.route("sub_42"), partition_for("sub_42", count(16)));
        let mut out = Vec::new();
        router.route_many(&["sub_42", "whale"], &mut out);
        assert_eq!(out, vec![partition_for("sub_42", count(16)), PartitionId(3)]);
        let err = Router::with_overrides(count(3), pins).unwrap_err();
        assert!(matches!(err, RoutingError::OverrideOutOfRange { partition: 3, count: 3, .. }));
    }

    // Mutation-testing kills: each test pins behaviour a mutant broke unseen.

    #[test]
    fn a_count_lists_converts_and_prints_its_partitions() {
        let c = count(3);
        let all: Vec<PartitionId> = c.partitions().collect();
        assert_eq!(all, vec![PartitionId(0), PartitionId(1), PartitionId(2)]);
        assert!(c.contains(PartitionId(2)));
        assert!(!c.contains(PartitionId(3)), "a partition equal to the count does not exist");
        assert_eq!(u16::from(count(7)), 7);
        assert_eq!(count(16).to_string(), "16");
        assert_eq!(PartitionCount::try_from(12i64), Ok(count(12)));
        // JSON carries the count as a bare number, both ways.
        assert_eq!(serde_json::to_string(&count(64)).unwrap(), "64");
        assert_eq!(serde_json::from_str::<PartitionCount>("64").unwrap(), count(64));
        assert!(serde_json::from_str::<PartitionCount>("0").is_err());
    }

    #[test]
    fn the_backend_label_names_the_path_taken() {
        let detected = if Avx2::detect().is_some() { "avx2" } else { "portable" };
        assert_eq!(one_block_backend(Lanes::Detect), detected);
        assert_eq!(one_block_backend(Lanes::Portable), "portable");
        #[cfg(target_arch = "x86_64")]
        assert_eq!(Avx2::detect().is_some(), std::is_x86_feature_detected!("avx2"));
    }

    #[test]
    fn digests_of_a_batch_equal_the_single_digests() {
        let keys = ["sub_42", "sub_7", ""];
        let mut out = vec![1, 2, 3, 4];
        digest_many(&keys, &mut out);
        assert_eq!(out, vec![key_digest("sub_42"), key_digest("sub_7"), key_digest("")]);
        let mut slots = [0u64; 3];
        digest_into(&keys, &mut slots);
        assert_eq!(slots.to_vec(), out);
        let mut parts = [PartitionId(99); 3];
        route_into(&keys, count(16), &mut parts);
        assert_eq!(parts, keys.map(|k| partition_for(k, count(16))));
        let d = key_digest("sub_42");
        assert_eq!(partition_of_digest(d, count(16)), PartitionId(2));
        assert_eq!(partition_of_digest(d, count(1000)), PartitionId((d % 1000) as u16));
    }

    #[test]
    fn overrides_count_replace_and_look_up_their_pins() {
        let mut pins = Overrides::new();
        assert!(pins.is_empty());
        assert_eq!(pins.len(), 0);
        assert_eq!(pins.lookup("whale"), None);
        pins.pin("whale", PartitionId(3)).pin("orca", PartitionId(1));
        assert!(!pins.is_empty());
        assert_eq!(pins.len(), 2);
        pins.pin("whale", PartitionId(5));
        assert_eq!(pins.len(), 2, "a second pin of a key replaces the first");
        assert_eq!(pins.lookup("whale"), Some(PartitionId(5)));
        assert_eq!(pins.lookup("orca"), Some(PartitionId(1)));
        assert_eq!(pins.validate(count(6)), Ok(()));
        let router = Router::with_overrides(count(6), pins.clone()).expect("pins in range");
        assert_eq!(router.count(), count(6));
        assert_eq!(router.overrides(), &pins);
        let plain = Router::new(count(16));
        assert!(plain.overrides().is_empty());
        let mut out = Vec::new();
        plain.route_many(&["sub_42", "sub_7"], &mut out);
        assert_eq!(out, vec![PartitionId(2), PartitionId(10)]);
        assert_eq!(pins.unpin("whale"), Some(PartitionId(5)));
        assert_eq!(pins.unpin("whale"), None, "an unpinned key has no pin to remove");
        assert_eq!((pins.len(), pins.lookup("whale")), (1, None));
    }
}
