//! A session lease (PostgreSQL's advisory lock) over the model's store: the statements of
//! `PgLease`, each fenced by the lock's session, composed by production's
//! [`SessionDrain`]. This file translates statements; the read/ack rules are `SessionDrain`'s.

use keyorder::drain::ParkedKeys;
use keyorder::store::session_drain::{HeadPlan, Read, Seen, SessionDrain};
use keyorder::store::StoredHead;
use keyorder::{Epoch, Seq, Time};

use super::history::Trace;
use super::switches::Switches;
use super::world::{EventSpec, World};

/// A fenced statement was refused: the session no longer holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lost;

/// One lease's statements against the world, as `PgLease` runs them.
pub struct Lease<'a> {
    /// The store.
    pub world: &'a mut World,
    /// The history of the path.
    pub trace: &'a mut Trace,
    /// The configuration's events.
    pub events: &'a [EventSpec],
    /// The broken design, if any.
    pub switches: Switches,
    /// The leased partition's index.
    pub partition: u8,
    /// The lease's epoch.
    pub epoch: Epoch,
    /// The lease's read/ack composition.
    pub drain: &'a mut SessionDrain,
}

impl Lease<'_> {
    fn now(&self) -> Time {
        self.world.clock
    }

    /// Whether the lock's session still holds the lock (every statement runs on it).
    fn fenced(&self) -> Result<(), Lost> {
        let p = &self.world.partitions[usize::from(self.partition)];
        if self.switches.unfenced || p.holders.contains(&self.epoch) {
            Ok(())
        } else {
            Err(Lost)
        }
    }

    /// `PgLease::fetch_head`.
    pub fn fetch_head(&mut self, skip: &ParkedKeys) -> Result<Option<StoredHead>, Lost> {
        let now = self.now();
        match self.drain.plan_head(skip, now) {
            HeadPlan::Serve(head) => Ok(Some(head)),
            HeadPlan::Prove => {
                self.prove()?;
                Ok(self.drain.head())
            }
            HeadPlan::Read(read) => {
                self.flush_acks()?;
                self.read_ahead(read)?;
                Ok(self.drain.head())
            }
        }
    }

    /// `PgLease::ensure_lasts`: a session last heard `ack_delay` ago is proved before a send.
    pub fn ensure_lasts(&mut self) -> Result<(), Lost> {
        if self.drain.must_prove(self.now()) {
            self.prove()?;
        }
        Ok(())
    }

    /// `PgLease::ack`.
    pub fn ack(&mut self, seq: Seq) -> Result<(), Lost> {
        if self.drain.acked(seq, self.now()) {
            self.flush_acks()?;
        }
        Ok(())
    }

    /// `PgLease::schedule_retry`.
    pub fn schedule_retry(
        &mut self,
        seq: Seq,
        attempts: u32,
        not_before: Time,
        error: &str,
    ) -> Result<(), Lost> {
        self.flush_acks()?;
        self.drain.changed();
        self.fenced()?;
        let tail = self.switches.requeue_at_tail;
        let p = &mut self.world.partitions[usize::from(self.partition)];
        let top = p.rows.iter().map(|r| r.seq).max().unwrap_or(seq);
        if let Some(row) = p.row_mut(seq) {
            row.attempts = attempts;
            row.not_before = Some(not_before);
            row.last_error = Some(error.to_owned());
            if tail {
                row.seq = Seq(top.0 + 1);
                p.rows.sort_by_key(|r| r.seq);
            }
        }
        self.drain.heard(self.now());
        Ok(())
    }

    /// `PgLease::dead_letter`: the row leaves the queue and enters the table in one step.
    pub fn dead_letter(&mut self, seq: Seq, reason: &str) -> Result<(), Lost> {
        self.flush_acks()?;
        self.drain.changed();
        self.fenced()?;
        let p = &mut self.world.partitions[usize::from(self.partition)];
        if let Some(i) = p.rows.iter().position(|r| r.seq == seq) {
            let row = p.rows.remove(i);
            self.world.dead.push(row.event);
            let spec = self.events[usize::from(row.event)];
            self.trace.dead_lettered(spec.seq, reason, self.world.clock);
        }
        self.drain.dead_lettered(seq);
        self.drain.heard(self.now());
        Ok(())
    }

    /// The acknowledgements buffered, deleted in one statement.
    pub fn flush_acks(&mut self) -> Result<(), Lost> {
        if !self.drain.has_acks() {
            return Ok(());
        }
        let seqs = self.drain.take_acks();
        self.fenced()?;
        let p = &mut self.world.partitions[usize::from(self.partition)];
        let mut gone = Vec::new();
        p.rows.retain(|r| {
            let hit = seqs.contains(&r.seq) && r.committed;
            if hit {
                gone.push(r.event);
            }
            !hit
        });
        for e in gone {
            self.trace.acked(self.events[usize::from(e)].seq, self.world.clock);
        }
        self.drain.heard(self.now());
        Ok(())
    }

    /// One round trip: the buffered acknowledgements, else a ping.
    fn prove(&mut self) -> Result<(), Lost> {
        if self.drain.has_acks() {
            return self.flush_acks();
        }
        self.fenced()?;
        self.drain.heard(self.now());
        Ok(())
    }

    fn read_ahead(&mut self, read: Read) -> Result<(), Lost> {
        let mut next = Some(read);
        // Each follow-up read starts lower or from the start: a handful at most.
        for _ in 0..8 {
            let Some(read) = next else { return Ok(()) };
            self.fenced()?;
            let (rows, running, late) = self.read_batch(read.after);
            next = self.drain.filled(read, rows, Seen { running: &running, late });
        }
        debug_assert!(next.is_none(), "a head read that never settles");
        Ok(())
    }

    /// The committed rows after `after`, passing over the skipped keys, ending at the first
    /// that waits; the transactions running; whether a watched one committed a row at or
    /// below `after`.
    fn read_batch(&self, after: Seq) -> (Vec<StoredHead>, Vec<u64>, bool) {
        let now = self.now();
        let skip = self.drain.skipped().clone();
        let watched = self.drain.watched();
        let limit = self.drain.options().read_ahead as usize;
        let p = &self.world.partitions[usize::from(self.partition)];
        let visible = p.rows.iter().filter(|r| r.committed);
        let late = visible.clone().any(|r| {
            r.seq <= after && watched.contains(&(self.events[usize::from(r.event)].seq.0 as u64))
        });
        let mut heads = Vec::new();
        let stuck = self.switches.stuck_key_blocks;
        for r in visible.filter(|r| r.seq > after) {
            let spec = self.events[usize::from(r.event)];
            let key = spec.key_name();
            let dead_key =
                self.world.dead.iter().any(|&d| self.events[usize::from(d)].key == spec.key);
            if stuck && (skip.contains(&key) || dead_key) {
                break;
            }
            if skip.contains(&key) {
                continue;
            }
            let wait = r.not_before.filter(|t| *t > now).map(|t| t.saturating_since(now));
            if self.switches.skip_waiting && wait.is_some() {
                continue;
            }
            heads.push(StoredHead {
                seq: r.seq,
                event_id: spec.id(),
                key,
                payload: String::new(),
                attempts: r.attempts,
                wait,
                last_error: r.last_error.clone(),
            });
            if wait.is_some() || heads.len() >= limit {
                break;
            }
        }
        (heads, self.world.running(self.events), late)
    }
}
