//! Lease ownership: how many partitions one worker may hold, and which to take or give back.
//!
//! The lease itself lives in the store (a PostgreSQL session advisory lock, or a lease row
//! with an epoch); this module only decides. A worker that grabs every free partition starves
//! the workers that start after it (the reference's `run` does exactly that), so a worker
//! holds at most its fair share `ceil(partitions / live workers)` and gives back the excess.

use std::collections::BTreeSet;

use crate::ids::PartitionId;
use crate::routing::PartitionCount;

/// The most partitions one worker may hold while `live_workers` workers are alive (at least
/// one worker is assumed: the caller is alive).
pub fn fair_share(count: PartitionCount, live_workers: usize) -> usize {
    usize::from(count.get()).div_ceil(live_workers.max(1))
}

/// What a worker should do to reach its fair share.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rebalance {
    /// Partitions to give back: those beyond the count, then the excess over the fair share
    /// (highest first, so every worker gives back the same way).
    pub release: Vec<PartitionId>,
    /// Partitions to try, in order, until the worker holds `want` (a try may fail: another
    /// worker may hold it).
    pub candidates: Vec<PartitionId>,
    /// How many partitions the worker should hold after rebalancing.
    pub want: usize,
}

/// Decides the moves of a worker that holds `owned`, under `count`, with `live_workers` alive.
/// Candidates are tried from `start` onward (wrapping), so workers that start at different
/// offsets do not all contend for partition 0 first.
pub fn rebalance(
    owned: &BTreeSet<PartitionId>,
    count: PartitionCount,
    live_workers: usize,
    start: u16,
) -> Rebalance {
    let want = fair_share(count, live_workers);
    let (mut keep, mut release): (Vec<_>, Vec<_>) = owned.iter().partition(|p| count.contains(**p));
    while keep.len() > want {
        // `keep` is ascending, so this gives back the highest partition first.
        release.extend(keep.pop());
    }
    let n = count.get();
    let candidates = if keep.len() < want {
        (0..n).map(|i| PartitionId((start % n + i) % n)).filter(|p| !owned.contains(p)).collect()
    } else {
        Vec::new()
    };
    Rebalance { release, candidates, want }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(n: i64) -> PartitionCount {
        PartitionCount::new(n).unwrap()
    }

    #[test]
    fn fair_share_is_the_ceiling() {
        assert_eq!(fair_share(count(16), 1), 16);
        assert_eq!(fair_share(count(16), 3), 6);
        assert_eq!(fair_share(count(16), 16), 1);
        assert_eq!(fair_share(count(16), 40), 1);
        assert_eq!(fair_share(count(16), 0), 16, "the caller counts as alive");
    }

    #[test]
    fn excess_and_vanished_partitions_are_given_back() {
        let owned: BTreeSet<_> = [0, 1, 2, 3, 20].into_iter().map(PartitionId).collect();
        let r = rebalance(&owned, count(16), 8, 0);
        assert_eq!(r.want, 2);
        assert_eq!(r.release, vec![PartitionId(20), PartitionId(3), PartitionId(2)]);
        assert!(r.candidates.is_empty());
    }

    #[test]
    fn candidates_rotate_from_the_start_and_skip_owned() {
        let owned: BTreeSet<_> = [5].into_iter().map(PartitionId).collect();
        let r = rebalance(&owned, count(8), 2, 4);
        assert_eq!(r.want, 4);
        let got: Vec<u16> = r.candidates.iter().map(|p| p.0).collect();
        assert_eq!(got, vec![4, 6, 7, 0, 1, 2, 3]);
    }

    #[test]
    fn any_start_offset_wraps_into_the_count() {
        // Offsets are arbitrary u16s (a worker may derive its own); the largest must wrap, not
        // overflow, at the largest count.
        let r = rebalance(&BTreeSet::new(), count(32767), 1, u16::MAX);
        assert_eq!(r.want, 32767);
        assert_eq!(r.candidates.len(), 32767);
        assert_eq!(r.candidates.first(), Some(&PartitionId(1)), "65535 % 32767 = 1");
        assert_eq!(r.candidates.last(), Some(&PartitionId(0)));
        let r = rebalance(&BTreeSet::new(), count(8), 1, 13);
        let got: Vec<u16> = r.candidates.iter().map(|p| p.0).collect();
        assert_eq!(got, vec![5, 6, 7, 0, 1, 2, 3, 4]);
    }
}
