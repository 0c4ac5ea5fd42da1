//! The configuration plane producers and workers read: the partition count in force and the
//! producers' pause switch used by drain-and-switch. Outside every host, like a config service.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;

use keyorder::PartitionCount;

/// Shared configuration of one run.
#[derive(Debug)]
pub struct Control {
    /// The partition count producers route with and workers lease under.
    pub count: PartitionCount,
    /// Producers must not start a new insert while this is set.
    pub paused: bool,
    /// Producers inside a transaction (past the pause check, before its end). Drain-and-switch
    /// waits for this to empty after pausing, so no insert routed with the old count is late.
    pub busy: BTreeSet<usize>,
    /// Producers that have enqueued everything.
    pub finished: BTreeSet<usize>,
}

/// The control plane shared by hosts and the driver.
pub type SharedControl = Rc<RefCell<Control>>;

impl Control {
    /// A control plane with `count` in force and producers running.
    pub fn new(count: PartitionCount) -> SharedControl {
        Rc::new(RefCell::new(Control {
            count,
            paused: false,
            busy: BTreeSet::new(),
            finished: BTreeSet::new(),
        }))
    }
}
