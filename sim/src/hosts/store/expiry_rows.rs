//! SQLite's lease rows: a row per partition with holder, epoch (incremented at each acquisition:
//! the fencing token) and expiry by the store's clock, kept across restarts. A lease is free
//! once its expiry passed; every fenced statement checks holder and epoch and renews the lease
//! in the same step, and answers with the new expiry. Membership is a row per worker, renewed
//! by its calls and ended with its session. The queue takes its seqs at commit, since SQLite
//! serialises its writers (the expiry drain's cursor depends on it).

use std::collections::BTreeMap;
use std::time::Duration;

use keyorder::check::LeaseEvent;
use keyorder::{Epoch, PartitionId, Time};

use super::{lease_change, Durable, Volatile};
use crate::protocol::{Granted, StoreResponse};
use crate::trace::SharedRecorder;

/// How a fenced statement's lease is matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpiryFence {
    /// This holder's epoch, unexpired: SQLite's fence.
    Epoch,
    /// Any unexpired holder's lease (the `unfenced-expiry` design's queue statements).
    AnyHolder,
}

/// The lease rows and member rows of an expiry-lease store.
#[derive(Debug)]
pub struct ExpiryRows {
    /// How long a lease lasts after its last renewal.
    length: Duration,
    /// A row per partition ever leased.
    rows: BTreeMap<PartitionId, LeaseRow>,
    /// Membership: worker → (its registering session, expiry).
    members: BTreeMap<String, (u64, Time)>,
}

/// An expiry lease's row.
#[derive(Clone, Debug)]
pub struct LeaseRow {
    /// The holder, `None` once handed back.
    pub holder: Option<String>,
    /// The epoch of the last acquisition.
    pub epoch: Epoch,
    /// When it expires, by the store's clock.
    pub expires_at: Time,
}

impl ExpiryRows {
    /// No lease taken yet; each lasts `length` after its last renewal.
    pub fn new(length: Duration) -> Self {
        Self { length, rows: BTreeMap::new(), members: BTreeMap::new() }
    }

    /// How long a lease lasts after its last renewal.
    pub fn length(&self) -> Duration {
        self.length
    }

    /// `partition`'s lease row, if it was ever leased.
    pub fn row(&self, partition: PartitionId) -> Option<&LeaseRow> {
        self.rows.get(&partition)
    }

    /// Renews `partition`'s lease if `fence` matches it unexpired: its new expiry, or `None`
    /// when the statement must be refused.
    pub(super) fn renew(
        &mut self,
        partition: PartitionId,
        epoch: Epoch,
        at: Time,
        fence: ExpiryFence,
    ) -> Option<Time> {
        let row = self.rows.get_mut(&partition)?;
        let theirs = fence == ExpiryFence::AnyHolder || row.epoch == epoch;
        if row.holder.is_none() || row.expires_at <= at || !theirs {
            return None;
        }
        row.expires_at = at.saturating_add(self.length);
        Some(row.expires_at)
    }

    /// Takes `partition`'s lease if it has no holder or its expiry passed (recording the
    /// expired holder's loss).
    pub(super) fn try_lease(
        &mut self,
        durable: &mut Durable,
        partition: PartitionId,
        worker: String,
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let mut rec = rec.borrow_mut();
        if let Some(row) = self.rows.get(&partition) {
            match &row.holder {
                Some(_) if row.expires_at > at => return StoreResponse::Lock(None),
                Some(old) => {
                    rec.log(
                        at,
                        "store",
                        format_args!("lease p{partition} epoch {} of {old} expired", row.epoch),
                    );
                    lease_change(&mut rec, partition, old.clone(), row.epoch, LeaseEvent::Lost);
                    rec.fault("expired_takeover");
                }
                None => {}
            }
        }
        let epoch = durable.epochs.entry(partition).or_default();
        *epoch += 1;
        let epoch = Epoch(*epoch);
        let clean = durable.unclean.insert(partition);
        let expires_at = at.saturating_add(self.length);
        let row = LeaseRow { holder: Some(worker.clone()), epoch, expires_at };
        self.rows.insert(partition, row);
        lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Acquired);
        if clean {
            rec.log(at, "store", format_args!("p{partition} was handed back clean"));
        }
        let until_us = Some(expires_at.0.as_micros() as u64);
        StoreResponse::Lock(Some(Granted { epoch, clean, until_us }))
    }

    /// Hands a lease back (its fence passed): no holder, expired, clean or not.
    pub(super) fn hand_back(
        &mut self,
        durable: &mut Durable,
        (partition, epoch, clean): (PartitionId, Epoch, bool),
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let Some(row) = self.rows.get_mut(&partition) else {
            return StoreResponse::NotHeld;
        };
        let worker = row.holder.take().unwrap_or_default();
        row.expires_at = Time::ZERO;
        if clean {
            durable.unclean.remove(&partition);
        }
        let mut rec = rec.borrow_mut();
        lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Released);
        let how = if clean { "clean" } else { "unclean" };
        rec.log(at, "store", format_args!("p{partition} handed back {how}"));
        StoreResponse::Ok
    }

    /// `worker` registered on `session` at `at`, or called as a member: its row is renewed.
    pub(super) fn member(&mut self, worker: String, session: u64, at: Time) {
        self.members.insert(worker, (session, at.saturating_add(self.length)));
    }

    /// Live workers: unexpired member rows, the caller's renewed first (a worker's membership
    /// call is its renewal).
    pub(super) fn live_workers(&mut self, volatile: &Volatile, session: u64, at: Time) -> usize {
        if let Some(w) = volatile.sessions.get(&session).and_then(|s| s.worker.clone()) {
            self.member(w, session, at);
        }
        self.members.values().filter(|(_, until)| *until > at).count()
    }

    /// Session `id` ended: the member rows it registered go with it.
    pub(super) fn session_ended(&mut self, id: u64) {
        self.members.retain(|_, (s, _)| *s != id);
    }

    /// The partitions leased, unexpired at `at`, by holders other than `worker`.
    pub(super) fn held_by_others(&self, worker: &str, at: Time) -> Vec<PartitionId> {
        let others = |h: &Option<String>| h.as_deref().is_some_and(|h| h != worker);
        let rows = self.rows.iter();
        rows.filter(|(_, r)| others(&r.holder) && r.expires_at > at).map(|(p, _)| *p).collect()
    }

    /// Ends `partition`'s lease now; whether it had a holder.
    pub(super) fn expire(&mut self, partition: PartitionId, at: Time) -> bool {
        let Some(row) = self.rows.get_mut(&partition) else { return false };
        row.expires_at = at;
        row.holder.is_some()
    }
}
