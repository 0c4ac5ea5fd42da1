//! PostgreSQL's session advisory locks: a lease is a lock held by a session (connection),
//! released only when the server notices the session is gone (its end of stream, or after
//! `detection` of silence), never earlier, and lost with every other session state at a
//! restart. A statement is fenced by running on the session that holds the lock.

use std::collections::BTreeMap;

use keyorder::check::LeaseEvent;
use keyorder::{Epoch, PartitionId, Time};

use super::{lease_change, Durable, Volatile};
use crate::protocol::{Granted, StoreResponse};
use crate::trace::{now, Recorder, SharedRecorder};

/// The locks: (partition, session) → epoch. At most one session per partition (the
/// `two-readers` design grants more, from outside these rules).
#[derive(Debug, Default)]
pub struct SessionLocks {
    locks: BTreeMap<(PartitionId, u64), Epoch>,
}

impl SessionLocks {
    /// Whether `session` may run a statement fenced by `partition`'s lease at `epoch`: it holds
    /// that lock, or it is a pooled connection, whose statements run unchecked as any plain
    /// PostgreSQL connection's would.
    pub(super) fn fenced(
        &self,
        volatile: &Volatile,
        session: u64,
        partition: PartitionId,
        epoch: Epoch,
    ) -> bool {
        volatile.sessions.get(&session).is_some_and(|s| s.pooled)
            || self.locks.get(&(partition, session)) == Some(&epoch)
    }

    /// Whether any session holds `partition`'s lock.
    pub(super) fn is_held(&self, partition: PartitionId) -> bool {
        self.locks.range((partition, 0)..=(partition, u64::MAX)).next().is_some()
    }

    /// Takes `partition`'s lock for `session` if no session holds it.
    pub(super) fn try_lock(
        &mut self,
        state: (&mut Durable, &mut Volatile),
        session: u64,
        partition: PartitionId,
        worker: String,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        if self.is_held(partition) {
            return StoreResponse::Lock(None);
        }
        self.grant(state, session, partition, worker, rec)
    }

    /// Grants `partition`'s lock to `session` at the next epoch.
    pub(super) fn grant(
        &mut self,
        (durable, volatile): (&mut Durable, &mut Volatile),
        session: u64,
        partition: PartitionId,
        worker: String,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        let epoch = durable.epochs.entry(partition).or_default();
        *epoch += 1;
        let epoch = Epoch(*epoch);
        // Read the previous holder's hand-back, then mark this holding unclean until it ends
        // with a clean unlock.
        let clean = durable.unclean.insert(partition);
        self.locks.insert((partition, session), epoch);
        volatile.sessions.entry(session).or_default().holder = Some(worker.clone());
        let mut rec = rec.borrow_mut();
        lease_change(&mut rec, partition, worker, epoch, LeaseEvent::Acquired);
        if clean {
            rec.log(now(), "store", format_args!("p{partition} was handed back clean"));
        }
        StoreResponse::Lock(Some(Granted { epoch, clean, until_us: None }))
    }

    /// The unlock of `partition` by the session that holds it.
    pub(super) fn unlock(
        &mut self,
        (durable, volatile): (&mut Durable, &mut Volatile),
        session: u64,
        (partition, epoch, clean): (PartitionId, Epoch, bool),
        at: Time,
        rec: &SharedRecorder,
    ) -> StoreResponse {
        self.locks.remove(&(partition, session));
        if clean {
            durable.unclean.remove(&partition);
        }
        let worker = volatile.sessions.entry(session).or_default().holder.clone();
        let mut rec = rec.borrow_mut();
        lease_change(&mut rec, partition, worker.unwrap_or_default(), epoch, LeaseEvent::Released);
        let how = if clean { "clean" } else { "unclean" };
        rec.log(at, "store", format_args!("p{partition} handed back {how}"));
        StoreResponse::Ok
    }

    /// Session `id` ended: its locks are released, each recorded as lost by `holder`.
    pub(super) fn session_ended(&mut self, id: u64, holder: &str, why: &str, rec: &mut Recorder) {
        let held: Vec<_> =
            self.locks.iter().filter(|((_, s), _)| *s == id).map(|((p, _), e)| (*p, *e)).collect();
        for (partition, epoch) in held {
            self.locks.remove(&(partition, id));
            rec.log(now(), "store", format_args!("session {id} ended ({why}): lease p{partition} epoch {epoch} of {holder} released"));
            lease_change(rec, partition, holder.to_owned(), epoch, LeaseEvent::Lost);
        }
    }

    /// A restart: every lock is lost, each recorded with its session's holder.
    pub(super) fn restart(&mut self, old: &Volatile, rec: &mut Recorder) {
        for ((partition, session), epoch) in std::mem::take(&mut self.locks) {
            let worker =
                old.sessions.get(&session).and_then(|s| s.holder.clone()).unwrap_or_default();
            lease_change(rec, partition, worker, epoch, LeaseEvent::Lost);
        }
    }

    /// Live workers: the open control sessions.
    pub(super) fn live_workers(volatile: &Volatile) -> usize {
        volatile.sessions.values().filter(|s| s.worker.is_some()).count()
    }

    /// The partitions locked by sessions other than `session` whose holder is not `worker`.
    pub(super) fn held_by_others(
        &self,
        volatile: &Volatile,
        session: u64,
        worker: &str,
    ) -> Vec<PartitionId> {
        let other = |s: &u64| {
            *s != session
                && volatile
                    .sessions
                    .get(s)
                    .and_then(|x| x.holder.as_deref())
                    .is_some_and(|w| w != worker)
        };
        self.locks.keys().filter(|(_, s)| other(s)).map(|(p, _)| *p).collect()
    }

    /// The sessions holding `partition`'s lock.
    pub(super) fn holders(&self, partition: PartitionId) -> Vec<u64> {
        self.locks.keys().filter(|(p, _)| *p == partition).map(|(_, s)| *s).collect()
    }
}
