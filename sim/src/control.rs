//! The configuration plane producers and workers read: the partition count in force and the
//! producers' pause switch used by drain-and-switch. Outside every host, like a config service.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use keyorder::PartitionCount;

/// Shared configuration of one run.
#[derive(Debug)]
pub struct Control {
    /// The partition count producers route with.
    pub count: PartitionCount,
    /// The layout epoch of `count`: bumped by every change of count.
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
            layout: 0,
            worker_count: count,
            paused: false,
            busy: BTreeMap::new(),
            finished: BTreeSet::new(),
            stopped: BTreeSet::new(),
            late_renewals: BTreeMap::new(),
        }))
    }
}
