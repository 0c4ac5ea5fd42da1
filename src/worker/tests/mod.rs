//! The worker loop against an in-memory store and endpoint, on tokio's paused clock: every
//! wait is a timer, so each test runs in microseconds and the same way every time.
//!
//! The fake store keeps the semantics the loop relies on: a lease is held by one session at a
//! time and every queue statement is fenced by it (a statement of a session that no longer
//! holds the lease is refused); a session that ends (is dropped) gives its lease up; each
//! acquisition gets a larger epoch; a lease is recorded unclean while held and cleaned only by
//! a hand-back that says clean; the membership count is the open membership sessions plus
//! `others` (workers the test pretends exist).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;
use crate::clock::TokioClock;
use crate::deliver::DeliverError;
use crate::drain::{Head, ParkedKeys};
use crate::ids::{Epoch, Seq, Time};
use crate::routing::PartitionCount;
use crate::store::StoredHead;

mod conformance;
mod delivery;
mod endpoint;
mod fake_store;
mod formatting;
mod harness;
mod leases;
mod refusals;
mod takeover;

use endpoint::*;
use fake_store::*;
use harness::*;
