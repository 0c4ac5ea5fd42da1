//! Fault injection: the scenario's faults, expanded into driver actions that run at their time
//! before any host runs at it (between `Sim::run_until` calls), plus the drain-and-switch procedure for a modulus change and pin changes
//! (a new layout epoch with the count unchanged).

use std::collections::VecDeque;
use std::time::Duration;

use keyorder::repartition::consumer_count;
use keyorder::{PartitionCount, PartitionId};

use crate::control::SharedControl;
use crate::hosts::store::SharedStore;
use crate::scenario::{worker_name, Fault, FaultKind, Procedure};
use crate::trace::SharedRecorder;

/// How long drain-and-switch waits for the queue to drain before it gives up and resumes on
/// the old count (a refused switch is safe; a forced one is not).
const DRAIN_DEADLINE: Duration = Duration::from_secs(60);

/// One thing the driver does to the simulation at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Crash(String),
    Bounce(String),
    Cut(String),
    Repair(String),
    Repartition(u16),
    /// A pause of this long starts.
    Stop(String, Duration),
    Resume(String),
    Late(String, Duration),
    OnTime(String),
    /// A producer's transactions stay open this much longer, or (`None`) no longer.
    SlowCommits(usize, Option<Duration>),
    /// Pin a key to a partition, or unpin it.
    Pin(String, Option<u16>),
}

/// What a drain-and-switch did, for reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SwitchReport {
    /// The count before.
    pub from: u16,
    /// The count after (the same as `from` if the switch was refused).
    pub to: u16,
    /// How long producers were paused, in ms.
    pub write_pause_ms: u64,
    /// How long the queue took to drain after producers were quiet, in ms (for the online
    /// procedure: how long until the last old-layout row was gone).
    pub drain_ms: u64,
    /// Whether the flip happened.
    pub switched: bool,
    /// The procedure.
    pub procedure: Procedure,
}

#[derive(Debug)]
struct Migration {
    from: u16,
    to: u16,
    /// The layout epoch the change began: it ends once no row older than this is left (a pin
    /// change meanwhile bumps the epoch again, and its old rows are no concern of the change).
    layout: u64,
    started: Duration,
}

#[derive(Debug)]
struct Switch {
    to: u16,
    paused_at: Duration,
    quiet_at: Option<Duration>,
}

/// The schedule and the procedure in progress.
#[derive(Debug)]
pub struct FaultRunner {
    due: VecDeque<(Duration, Step)>,
    switch: Option<Switch>,
    migration: Option<Migration>,
    /// Completed switches.
    pub switches: Vec<SwitchReport>,
}

impl FaultRunner {
    /// Expands `faults` into timed steps (a crash and its restart, a cut and its repair).
    pub fn new(faults: &[Fault]) -> Self {
        let mut due = Vec::new();
        for f in faults {
            let at = Duration::from_millis(f.at_ms);
            match &f.kind {
                FaultKind::CrashWorker { worker, down_ms } => {
                    due.push((at, Step::Crash(worker_name(*worker))));
                    due.push((
                        at + Duration::from_millis(*down_ms),
                        Step::Bounce(worker_name(*worker)),
                    ));
                }
                FaultKind::LeaseLoss { worker, for_ms } => {
                    due.push((at, Step::Cut(worker_name(*worker))));
                    due.push((
                        at + Duration::from_millis(*for_ms),
                        Step::Repair(worker_name(*worker)),
                    ));
                }
                FaultKind::StoreRestart { down_ms } => {
                    due.push((at, Step::Crash("store".into())));
                    due.push((at + Duration::from_millis(*down_ms), Step::Bounce("store".into())));
                }
                FaultKind::Repartition { to } => due.push((at, Step::Repartition(*to))),
                FaultKind::Pause { worker, for_ms } => {
                    due.push((
                        at,
                        Step::Stop(worker_name(*worker), Duration::from_millis(*for_ms)),
                    ));
                    due.push((
                        at + Duration::from_millis(*for_ms),
                        Step::Resume(worker_name(*worker)),
                    ));
                }
                FaultKind::Pin { key, partition } => {
                    due.push((at, Step::Pin(key.clone(), *partition)));
                }
                FaultKind::SlowCommits { producer, extra_ms, for_ms } => {
                    let extra = Duration::from_millis(*extra_ms);
                    due.push((at, Step::SlowCommits(*producer, Some(extra))));
                    due.push((
                        at + Duration::from_millis(*for_ms),
                        Step::SlowCommits(*producer, None),
                    ));
                }
                FaultKind::LateRenewals { worker, extra_ms, for_ms } => {
                    let late = Duration::from_millis(*extra_ms);
                    due.push((at, Step::Late(worker_name(*worker), late)));
                    due.push((
                        at + Duration::from_millis(*for_ms),
                        Step::OnTime(worker_name(*worker)),
                    ));
                }
            }
        }
        // Stable: steps at the same time keep the scenario's order.
        due.sort_by_key(|(at, _)| *at);
        Self { due: due.into(), switch: None, migration: None, switches: Vec::new() }
    }

    /// Whether every fault has run and been healed.
    pub fn is_idle(&self) -> bool {
        self.due.is_empty() && self.switch.is_none() && self.migration.is_none()
    }

    /// The time of the next scheduled step, `Duration::MAX` when none is left; `None` while a
    /// switch or a migration is in progress (those look at the store every millisecond).
    pub fn next_due(&self) -> Option<Duration> {
        if self.switch.is_some() || self.migration.is_some() {
            return None;
        }
        Some(self.due.front().map_or(Duration::MAX, |(at, _)| *at))
    }

    /// Applies everything due at `now`, and advances a switch in progress. A modulus change
    /// due while another is in progress waits for it; nothing else waits (a repair scheduled
    /// behind a waiting change must still happen, or the drain it waits for never ends).
    pub fn apply(&mut self, sim: &mut crate::simulator::Sim, now: Duration, world: &World) {
        self.advance_switch(now, world);
        self.advance_migration(now, world);
        let mut deferred = VecDeque::new();
        while self.due.front().is_some_and(|(at, _)| *at <= now) {
            let Some((at, step)) = self.due.pop_front() else { break };
            if matches!(step, Step::Repartition(_))
                && (self.switch.is_some() || self.migration.is_some())
            {
                deferred.push_back((at, step));
                continue;
            }
            self.run(sim, now, step, world);
        }
        while let Some(item) = deferred.pop_back() {
            self.due.push_front(item);
        }
    }

    fn run(&mut self, sim: &mut crate::simulator::Sim, now: Duration, step: Step, world: &World) {
        let t = keyorder::Time(now);
        let mut rec = world.rec.borrow_mut();
        match step {
            Step::Crash(host) => {
                rec.log(t, "driver", format_args!("crash {host}"));
                rec.fault(if host == "store" { "store_restart" } else { "crash" });
                drop(rec);
                // A crash ends a stop too: the restarted process runs.
                world.control.borrow_mut().stopped.remove(&host);
                sim.crash(&host);
            }
            Step::Stop(host, length) => {
                rec.log(t, "driver", format_args!("stop {host} (process paused)"));
                rec.fault("pause");
                if world.store.borrow().leases.expiry().is_some_and(|e| length > e) {
                    rec.fault("pause_past_expiry");
                }
                world.control.borrow_mut().stopped.insert(host);
            }
            Step::Resume(host) => {
                if world.control.borrow_mut().stopped.remove(&host) {
                    rec.log(t, "driver", format_args!("resume {host}"));
                }
            }
            Step::Late(host, by) => {
                rec.log(t, "driver", format_args!("renewals of {host} arrive {by:?} late"));
                rec.fault("late_renewal");
                world.control.borrow_mut().late_renewals.insert(host, by);
            }
            Step::OnTime(host) => {
                rec.log(t, "driver", format_args!("renewals of {host} on time again"));
                world.control.borrow_mut().late_renewals.remove(&host);
            }
            Step::SlowCommits(producer, Some(extra)) => {
                let what =
                    format_args!("transactions of producer-{producer} commit {extra:?} late");
                rec.log(t, "driver", what);
                rec.fault("slow_commit");
                world.control.borrow_mut().slow_commits.insert(producer, extra);
            }
            Step::SlowCommits(producer, None) => {
                rec.log(t, "driver", format_args!("producer-{producer} commits on time again"));
                world.control.borrow_mut().slow_commits.remove(&producer);
            }
            Step::Bounce(host) => {
                rec.log(t, "driver", format_args!("restart {host}"));
                drop(rec);
                sim.bounce(&host);
            }
            Step::Cut(host) => {
                rec.log(t, "driver", format_args!("partition {host} from store"));
                rec.fault("lease_loss");
                sim.partition(&host, "store");
            }
            Step::Repair(host) => {
                rec.log(t, "driver", format_args!("repair {host} to store"));
                sim.repair(&host, "store");
            }
            Step::Pin(key, partition) => {
                drop(rec);
                self.pin(now, &key, partition.map(PartitionId), world);
            }
            Step::Repartition(to) => {
                drop(rec);
                self.repartition(to, now, world);
            }
        }
    }

    /// A change of partition count, as the scenario's procedure carries it out: the unsafe
    /// flip, the online switch, or drain-and-switch (the mapping frozen, producers paused).
    fn repartition(&mut self, to: u16, now: Duration, world: &World) {
        let t = keyorder::Time(now);
        let mut rec = world.rec.borrow_mut();
        rec.fault("repartition");
        if world.flip_without_drain {
            let from = world.control.borrow().count.get();
            let depth = world.store.borrow().depth();
            rec.log(t, "driver", format_args!("flip {from} -> {to} WITHOUT drain (depth {depth})"));
            if let Ok(count) = PartitionCount::new(i64::from(to)) {
                world.control.borrow_mut().switch(count, count);
            }
            self.switches.push(SwitchReport {
                from,
                to,
                write_pause_ms: 0,
                drain_ms: 0,
                switched: true,
                procedure: Procedure::FlipWithoutDrain,
            });
        } else if world.procedure == Procedure::Online {
            let from = world.control.borrow().count;
            let Ok(target) = PartitionCount::new(i64::from(to)) else { return };
            let leased = consumer_count(from, target, true);
            rec.log(t, "driver", format_args!("online switch {from} -> {to}: producers route with {to} now; workers lease {leased} until old rows are gone"));
            let mut control = world.control.borrow_mut();
            control.switch(target, leased);
            let layout = control.layout;
            self.migration = Some(Migration { from: from.get(), to, layout, started: now });
        } else {
            let from = world.control.borrow().count.get();
            let what =
                format_args!("drain-and-switch {from} -> {to}: freeze mapping, pause producers");
            rec.log(t, "driver", what);
            world.control.borrow_mut().paused = true;
            self.switch = Some(Switch { to, paused_at: now, quiet_at: None });
        }
    }

    /// Ends an online change once no row of an older layout is queued or open: workers then
    /// lease under the new count alone.
    fn advance_migration(&mut self, now: Duration, world: &World) {
        let Some(m) = &self.migration else { return };
        let layout = m.layout;
        let store = world.store.borrow();
        if store.durable.has_rows_older_than(layout) || store.has_uncommitted_older_than(layout) {
            return;
        }
        let mut control = world.control.borrow_mut();
        control.worker_count = consumer_count(control.worker_count, control.count, false);
        drop(control);
        let drain_ms = now.saturating_sub(m.started).as_millis() as u64;
        world.rec.borrow_mut().log(
            keyorder::Time(now),
            "driver",
            format_args!(
                "online switch {} -> {} complete: old rows gone after {drain_ms} ms",
                m.from, m.to
            ),
        );
        self.switches.push(SwitchReport {
            from: m.from,
            to: m.to,
            write_pause_ms: 0,
            drain_ms,
            switched: true,
            procedure: Procedure::Online,
        });
        self.migration = None;
    }

    /// Pins `key` to `partition` (or unpins it) under a new layout epoch, with the count and the
    /// workers' count unchanged; `pin-without-barrier` changes the pin under the same epoch.
    /// Counts `pin_under_load` when the key still has rows queued or open, the case the
    /// barrier exists for.
    fn pin(&self, now: Duration, key: &str, partition: Option<PartitionId>, world: &World) {
        let t = keyorder::Time(now);
        let queued = world.store.borrow().partitions_of(key);
        let mut rec = world.rec.borrow_mut();
        rec.fault("pin");
        if !queued.is_empty() {
            rec.fault("pin_under_load");
        }
        let mut control = world.control.borrow_mut();
        let to = partition.map_or_else(|| "its hash".to_owned(), |p| format!("p{p}"));
        let queued: Vec<String> = queued.iter().map(|p| format!("p{p}")).collect();
        if world.pin_without_barrier {
            control.repin_in_place(key, partition);
            rec.log(
                t,
                "driver",
                format_args!(
                    "pin {key} to {to} WITHOUT a new layout (layout {}; queued on [{}])",
                    control.layout,
                    queued.join(", ")
                ),
            );
        } else {
            control.set_pin(key, partition);
            rec.log(
                t,
                "driver",
                format_args!(
                    "pin {key} to {to}: layout {}, count {} unchanged; queued on [{}]",
                    control.layout,
                    control.count,
                    queued.join(", ")
                ),
            );
        }
    }

    fn advance_switch(&mut self, now: Duration, world: &World) {
        let Some(switch) = &mut self.switch else { return };
        let t = keyorder::Time(now);
        let quiet = world.control.borrow().busy.is_empty();
        if switch.quiet_at.is_none() && quiet {
            switch.quiet_at = Some(now);
            world.rec.borrow_mut().log(t, "driver", format_args!("producers quiet; draining"));
        }
        let Some(quiet_at) = switch.quiet_at else { return };
        let store = world.store.borrow();
        let drained = store.depth() == 0 && store.uncommitted() == 0;
        let expired = now.saturating_sub(quiet_at) > DRAIN_DEADLINE;
        if !drained && !expired {
            return;
        }
        let from = world.control.borrow().count.get();
        let mut report = SwitchReport {
            from,
            to: from,
            write_pause_ms: now.saturating_sub(switch.paused_at).as_millis() as u64,
            drain_ms: now.saturating_sub(quiet_at).as_millis() as u64,
            switched: false,
            procedure: Procedure::DrainAndSwitch,
        };
        let mut rec = world.rec.borrow_mut();
        let split = store.split_keys();
        if drained && split.is_empty() {
            // Valid by the scenario's validation; a bad target keeps the old count.
            if let Ok(count) = PartitionCount::new(i64::from(switch.to)) {
                world.control.borrow_mut().switch(count, count);
                report.to = switch.to;
                report.switched = true;
            }
            rec.log(
                t,
                "driver",
                format_args!(
                    "drained; flip {from} -> {}; no split keys; resume producers",
                    report.to
                ),
            );
        } else {
            rec.log(
                t,
                "driver",
                format_args!(
                    "not drained after {DRAIN_DEADLINE:?} (depth {}); switch refused, resume",
                    store.depth()
                ),
            );
        }
        world.control.borrow_mut().paused = false;
        self.switches.push(report);
        self.switch = None;
    }
}

/// The shared planes the driver reads and writes.
pub struct World {
    /// The configuration plane.
    pub control: SharedControl,
    /// The store's state.
    pub store: SharedStore,
    /// The recorder.
    pub rec: SharedRecorder,
    /// `flip-without-drain`: a modulus change flips at once, with events still queued.
    pub flip_without_drain: bool,
    /// How a modulus change is carried out.
    pub procedure: Procedure,
    /// `pin-without-barrier`: a pin change keeps the layout epoch, so no barrier holds the
    /// pinned key's new rows.
    pub pin_without_barrier: bool,
}
