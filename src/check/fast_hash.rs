//! The hasher of the checker's lookup tables: FxHash's rotate-xor-multiply (as in rustc),
//! several times faster than the standard SipHash on the short keys a history has (seqs, keys,
//! event ids). The tables are only looked up, never iterated, so no result depends on it. It
//! does not resist chosen collisions: a history is the checking user's own data.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher's state.
#[derive(Clone, Copy, Default)]
pub(crate) struct Fx(u64);

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("eight bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_i64(&mut self, n: i64) {
        self.add(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A hash map with [`Fx`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// A hash set with [`Fx`].
pub(crate) type FastSet<K> = HashSet<K, BuildHasherDefault<Fx>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_hash_alike_and_different_keys_apart() {
        let mut set: FastSet<&str> = FastSet::default();
        for k in ["a", "b", "sub_1", "sub_10", "sub_100000000", "sub_100000001"] {
            assert!(set.insert(k), "{k} is new");
        }
        assert!(!set.insert("sub_10"));
        let hash = |s: &str| {
            let mut h = Fx::default();
            h.write(s.as_bytes());
            h.finish()
        };
        assert_ne!(hash("sub_100000000"), hash("sub_100000001"));
        assert_ne!(hash("abcdefgh"), hash("abcdefgi"));
    }
}
