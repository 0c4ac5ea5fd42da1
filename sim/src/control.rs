//! The configuration plane producers and workers read: the partition count and the key pins in
//! force, and the producers' pause switch used by drain-and-switch. Outside every host, like a
//! config service.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use keyorder::routing::Overrides;
use keyorder::{PartitionCount, PartitionId};

/// Shared configuration of one run.
#[derive(Debug)]
pub struct Control {
    /// The partition count producers route with.
    pub count: PartitionCount,
    /// Keys pinned to a partition of their own (whale tenants): producers route a pinned key
    /// to its pin instead of by the hash. A `BTreeMap` inside, so its order is stable.
    pub pins: Overrides,
    /// The layout epoch of `count` and `pins`: bumped by every change of either.
    pub layout: u64,
    /// The count workers lease under: `count`, or both layouts' while an online change
    /// still has old rows queued.
    pub worker_count: PartitionCount,
    /// Producers must not start a new insert while this is set.
    pub paused: bool,
    /// Open transactions per producer (past the pause check, before its end). Drain-and-switch
    /// waits for this to empty after pausing, so no insert routed with the old count is late.
    pub busy: BTreeMap<usize, usize>,
    /// Producers that have enqueued everything.
    pub finished: BTreeSet<usize>,
    /// Worker processes stopped by a pause fault: they send nothing until resumed.
    pub stopped: BTreeSet<String>,
    /// Workers whose lease renewals reach the store late, and by how much.
    pub late_renewals: BTreeMap<String, Duration>,
    /// Producers whose transactions stay open longer before they commit, and by how much.
    pub slow_commits: BTreeMap<usize, Duration>,
}

/// The control plane shared by hosts and the driver.
pub type SharedControl = Rc<RefCell<Control>>;

impl Control {
    /// Switches producers to `count` under a new layout epoch; workers follow at once unless
    /// `worker_count` says otherwise.
    pub fn switch(&mut self, count: PartitionCount, worker_count: PartitionCount) {
        self.count = count;
        self.layout += 1;
        self.worker_count = worker_count;
    }

    /// Pins `key` to `partition` (`None`: unpins it) under a new layout epoch with the count
    /// unchanged, as production does: rows enqueued from now on carry the new epoch, so the
    /// store's per-key barrier holds the key's new rows until its older rows are gone.
    pub fn set_pin(&mut self, key: &str, partition: Option<PartitionId>) {
        self.repin_in_place(key, partition);
        self.layout += 1;
    }

    /// Changes `key`'s pin under the same layout epoch: the `pin-without-barrier` design, whose
    /// new rows nothing holds behind the key's rows on its old partition.
    pub fn repin_in_place(&mut self, key: &str, partition: Option<PartitionId>) {
        match partition {
            Some(p) => {
                self.pins.pin(key, p);
            }
            None => {
                self.pins.unpin(key);
            }
        }
    }

    /// The partition producers route `key` to when it is pinned; `None`: by the hash. A pin
    /// that does not exist under the count in force is ignored (scenario validation keeps
    /// every pin below every count a run uses).
    pub fn pin_of(&self, key: &str) -> Option<PartitionId> {
        self.pins.lookup(key).filter(|p| self.count.contains(*p))
    }

    /// Whether worker `name`'s process is stopped.
    pub fn is_stopped(&self, name: &str) -> bool {
        self.stopped.contains(name)
    }

    /// Producer `index` opens a transaction.
    pub fn enter(&mut self, index: usize) {
        *self.busy.entry(index).or_default() += 1;
    }

    /// Producer `index` ended a transaction (committed, failed or never begun).
    pub fn leave(&mut self, index: usize) {
        if let Some(n) = self.busy.get_mut(&index) {
            *n -= 1;
            if *n == 0 {
                self.busy.remove(&index);
            }
        }
    }

    /// A control plane with `count` in force and producers running.
    pub fn new(count: PartitionCount) -> SharedControl {
        Rc::new(RefCell::new(Control {
            count,
            pins: Overrides::new(),
            layout: 0,
            worker_count: count,
            paused: false,
            busy: BTreeMap::new(),
            finished: BTreeSet::new(),
            stopped: BTreeSet::new(),
            late_renewals: BTreeMap::new(),
            slow_commits: BTreeMap::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_change_is_a_new_layout_with_the_count_unchanged() {
        let count = PartitionCount::new(8).expect("valid count");
        let control = Control::new(count);
        let mut c = control.borrow_mut();
        c.set_pin("whale", Some(PartitionId(3)));
        assert_eq!((c.count, c.worker_count, c.layout), (count, count, 1));
        assert_eq!(c.pin_of("whale"), Some(PartitionId(3)));
        assert_eq!(c.pin_of("minnow"), None);
        c.set_pin("whale", None);
        assert_eq!((c.layout, c.pin_of("whale")), (2, None));
        // The broken design's change keeps the epoch.
        c.repin_in_place("whale", Some(PartitionId(5)));
        assert_eq!((c.layout, c.pin_of("whale")), (2, Some(PartitionId(5))));
        // A pin beyond the count in force is not routed to.
        c.switch(PartitionCount::new(4).expect("valid count"), count);
        assert_eq!(c.pin_of("whale"), None);
    }
}
