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

/// The routing digests of `keys` into `out` (cleared first), in order: for callers that reduce
/// one digest by several counts (repartition planning). Exactly [`key_digest`] of each key.
///
/// Keys of at most [`LANE_KEY_MAX`] bytes (one BLAKE2b block: one compression each) are hashed
/// in SIMD lanes, four at a time where the CPU has AVX2 (detected at run time by
/// `blake2b_simd`), with the parameter block of an unkeyed 8-byte digest fixed once per call;
/// longer keys go through lanes of their own, so they never hold the one-block lanes back
/// (measured: 1.7× faster for 200-byte keys than one key at a time).
pub fn digest_many<K: AsRef<str>>(keys: &[K], out: &mut Vec<u64>) {
    digest_many_with(keys, out, Lanes::Detect);
}

/// Keys of at most this many bytes (one BLAKE2b block, one compression) share the one-block
/// lanes of the batch router; longer keys are hashed in lanes of their own.
pub const LANE_KEY_MAX: usize = blake2b_simd::BLOCKBYTES;

/// Keys gathered per call into the lanes: a multiple of every lane count, small enough that
/// the jobs and digests stay in L1.
const LANE_CHUNK: usize = 64;

/// Which BLAKE2b implementation the batch router uses. Not part of the API: it exists so the
/// tests can run the batch path with SIMD forced off.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lanes {
    /// The fastest the CPU supports (AVX2 4-way, SSE4.1 2-way, or portable), detected at run time.
    Detect,
    /// The portable implementation, one key at a time: the batch path with SIMD forced off.
    Portable,
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
    out.reserve(keys.len());
    digests_each(keys, lanes, |_, digest| out.push(reduce(digest, count)));
}

/// [`digest_many`] with the implementation chosen (tests use it to force SIMD off).
#[doc(hidden)]
pub fn digest_many_with<K: AsRef<str>>(keys: &[K], out: &mut Vec<u64>, lanes: Lanes) {
    out.clear();
    out.reserve(keys.len());
    digests_each(keys, lanes, |_, digest| out.push(digest));
}

/// The parameter block of the routing hash: unkeyed, 8-byte digest, no salt or personal.
fn lane_params(lanes: Lanes) -> blake2b_simd::Params {
    let mut params = blake2b_simd::Params::new();
    params.hash_length(8);
    if lanes == Lanes::Portable {
        // blake2b_simd's own switch to its portable code (doc-hidden, kept for its benchmarks,
        // so a minor release could drop it: the build would then fail here, not silently);
        // only the tests' and the benchmark's forced-portable runs take this branch.
        blake2b_simd::benchmarks::force_portable(&mut params);
    }
    params
}

fn digest_of(hash: &blake2b_simd::Hash) -> u64 {
    let bytes: [u8; 8] = hash.as_bytes().try_into().expect("the digest length is 8");
    u64::from_be_bytes(bytes)
}

/// Calls `emit(key, digest)` for every key of `keys`, in order. Keys of one block go through
/// the lanes together; longer keys form a second group of lanes (`hash_many` runs a long key's
/// extra blocks beside other long keys), so a short key never waits on a long one.
fn digests_each<'k, K: AsRef<str>>(
    keys: &'k [K],
    lanes: Lanes,
    mut emit: impl FnMut(&'k str, u64),
) {
    use blake2b_simd::many::{hash_many, HashManyJob};
    let params = lane_params(lanes);
    let mut short: Vec<HashManyJob<'k>> = Vec::with_capacity(LANE_CHUNK);
    let mut long: Vec<HashManyJob<'k>> = Vec::new();
    let mut digests = [0u64; LANE_CHUNK];
    // Whether each key of the chunk is long (in `long`) or short (in `short`), in order.
    let mut is_long = [false; LANE_CHUNK];
    for chunk in keys.chunks(LANE_CHUNK) {
        short.clear();
        long.clear();
        for (i, key) in chunk.iter().enumerate() {
            let key = key.as_ref().as_bytes();
            is_long[i] = key.len() > LANE_KEY_MAX;
            let group = if is_long[i] { &mut long } else { &mut short };
            group.push(HashManyJob::new(&params, key));
        }
        hash_many(short.iter_mut());
        if long.is_empty() {
            // Every key of the chunk went through the one-block lanes (the usual case).
            for (key, job) in chunk.iter().zip(&short) {
                emit(key.as_ref(), digest_of(&job.to_hash()));
            }
            continue;
        }
        hash_many(long.iter_mut());
        let (mut s, mut l) = (short.iter(), long.iter());
        for (digest, &is_long) in digests.iter_mut().zip(&is_long[..chunk.len()]) {
            let job = if is_long { l.next() } else { s.next() };
            *digest = digest_of(&job.expect("one job per key").to_hash());
        }
        for (key, &digest) in chunk.iter().zip(&digests) {
            emit(key.as_ref(), digest);
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

    /// The pin of `key`, if any.
    pub fn lookup(&self, key: &str) -> Option<PartitionId> {
        self.0.get(key).copied()
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
        out.reserve(keys.len());
        digests_each(keys, Lanes::Detect, |key, digest| {
            out.push(self.overrides.lookup(key).unwrap_or_else(|| reduce(digest, self.count)));
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
}
