//! One simulation run: a pure function of (scenario, seed). Builds the simulated world, runs
//! it while applying faults, waits for a quiescent tail, then judges the history.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use keyorder::check::{check, Verdict};
use keyorder::{PartitionCount, Time};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::breaks::Switches;
use crate::control::Control;
use crate::faults::{FaultRunner, SwitchReport, World};
use crate::hosts::endpoint::{self, Endpoints};
use crate::hosts::producer::{Planned, ProducerHost, Routing};
use crate::hosts::store::{self, StoreState};
use crate::hosts::store_client::ExpiryClient;
use crate::hosts::worker::{SimClock, WorkerHost};
use crate::scenario::Procedure;
use crate::scenario::{worker_name, Scenario, ScenarioError};
use crate::simulator::{self, Sim};
use crate::trace::Recorder;

/// How long a racing producer's transaction may stay open (`unserialised-producers`).
const RACING_COMMIT_JITTER: Duration = Duration::from_millis(150);
/// How often the driver looks at the store while a switch or a migration is in progress.
const SWITCH_POLL: Duration = Duration::from_millis(1);

/// Errors of a run: the scenario, or the simulator itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The scenario broke a rule.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
    /// A host's software failed.
    #[error("simulation failed at {at:?}: {message}")]
    Sim {
        /// Simulated time of the failure.
        at: Duration,
        /// What failed.
        message: String,
    },
}

/// What one run produced.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    /// The seed.
    pub seed: u64,
    /// BLAKE2b-256 of the trace.
    pub trace_hash: String,
    /// The checker's verdict.
    pub verdict: Verdict,
    /// Faults and endpoint behaviours by kind.
    pub faults: BTreeMap<String, u64>,
    /// Simulated time at the end, in ms.
    pub simulated_ms: u64,
    /// Whether the run reached a drained, quiet tail before the time limit.
    pub quiesced: bool,
    /// Drain-and-switch procedures.
    pub switches: Vec<SwitchReport>,
    /// The full trace, when asked for.
    #[serde(skip)]
    pub trace: Option<String>,
    /// The history the checker judged, kept with the trace (for the HTML timeline).
    #[serde(skip)]
    pub history: Option<keyorder::check::History>,
}

/// Runs `scenario` with `seed`; with `keep_trace` the outcome carries the text trace.
pub fn run(scenario: &Scenario, seed: u64, keep_trace: bool) -> Result<RunOutcome, RunError> {
    scenario.validate()?;
    let mut rng = StdRng::seed_from_u64(seed);
    let count = PartitionCount::new(i64::from(scenario.partitions))
        .map_err(|e| ScenarioError::Invalid { field: "partitions", rule: e.to_string() })?;
    let switches = Switches::of(scenario);
    let world = World {
        control: Control::new(count),
        store: Rc::new(RefCell::new(StoreState::default())),
        rec: Rc::new(RefCell::new(Recorder::default())),
        flip_without_drain: switches.flip_without_drain
            || scenario.procedure == Procedure::FlipWithoutDrain,
        procedure: scenario.procedure,
        pin_without_barrier: switches.pin_without_barrier,
    };
    world.store.borrow_mut().durable.breaks = switches.store;
    world.store.borrow_mut().leases =
        store::Leases::new(scenario.lease.expiry().map(|e| Duration::from_millis(e.expiry_ms)));
    // The per-key barrier is the store's, as in production: it holds a row only while its key
    // has rows of an older layout, which only an online change or a pin change leaves behind
    // (drain-and-switch flips an empty queue). The unsafe flip is the one design without it.
    world.store.borrow_mut().durable.barrier = !world.flip_without_drain;
    let mut sim = simulator::Builder::new(rng.random())
        .latency(
            Duration::from_millis(scenario.min_latency_ms),
            Duration::from_millis(scenario.max_latency_ms),
        )
        .build();
    if scenario.max_latency_ms > scenario.min_latency_ms {
        world.rec.borrow_mut().fault("latency_jitter");
    }
    if let Some(e) = scenario.lease.expiry() {
        world.rec.borrow_mut().fault("expiry_lease");
        if e.skew_ms.iter().any(|s| *s != 0) {
            world.rec.borrow_mut().fault("clock_skew");
        }
    }
    add_hosts(&mut sim, scenario, &switches, &world, &mut rng);
    drive(&mut sim, scenario, &world, seed, keep_trace)
}

fn add_hosts(
    sim: &mut Sim,
    scenario: &Scenario,
    switches: &Switches,
    world: &World,
    rng: &mut StdRng,
) {
    let detection = Duration::from_millis(scenario.detection_ms);
    sim.host("store", store::host(world.store.clone(), world.rec.clone(), detection));
    let specs = scenario.keys.iter().map(|k| (k.key.clone(), k.endpoint.clone())).collect();
    let slow = Duration::from_millis(scenario.delivery_timeout_ms * 2);
    sim.host("endpoint", endpoint::host(Endpoints::new(specs, slow), world.rec.clone()));
    let request_timeout = Duration::from_millis(scenario.request_timeout_ms);
    for i in 0..scenario.workers {
        let mut config = scenario.worker_config(i);
        config.rng_seed = rng.random();
        config.start_offset = (i * usize::from(scenario.partitions) / scenario.workers) as u16;
        let host = WorkerHost {
            config,
            control: world.control.clone(),
            rec: world.rec.clone(),
            request_timeout,
            client_breaks: switches.client,
            delivery_break: switches.delivery,
            clock: SimClock { offset_ms: scenario.lease.expiry().map_or(0, |e| e.skew(i)) },
            expiry: scenario.lease.expiry().map(|e| {
                ExpiryClient::new(
                    Duration::from_millis(e.skew_bound_ms),
                    Duration::from_millis(e.expiry_ms / 3),
                    Duration::from_millis(scenario.delivery_timeout_ms),
                )
            }),
        };
        sim.host(worker_name(i), host.factory());
    }
    let racing = switches.unserialised_producers;
    for (index, plan) in plans(scenario, switches, rng).into_iter().enumerate() {
        let routing =
            if switches.random_hash { Routing::Seeded(rng.random()) } else { Routing::Blake2b };
        let host = ProducerHost {
            index,
            plan: plan.into(),
            routing,
            commit_latency: Duration::from_millis(scenario.commit_latency_ms),
            commit_jitter: if racing { RACING_COMMIT_JITTER } else { Duration::ZERO },
            rng_seed: rng.random(),
            concurrent: racing,
            request_timeout,
            control: world.control.clone(),
            rec: world.rec.clone(),
        };
        sim.host(format!("producer-{index}"), host.factory());
    }
}

/// Each producer's events, sorted by time: event `n` of a key comes after event `n - 1`.
/// A key belongs to one producer, unless a broken design spreads its events over several.
fn plans(scenario: &Scenario, switches: &Switches, rng: &mut StdRng) -> Vec<Vec<Planned>> {
    let spread = switches.random_hash || switches.unserialised_producers;
    let mut plans = vec![Vec::new(); scenario.producers];
    for (i, key) in scenario.keys.iter().enumerate() {
        let mut times: Vec<u64> =
            (0..key.events).map(|_| rng.random_range(0..=scenario.load_ms * 1000)).collect();
        times.sort_unstable();
        for (n, at) in times.into_iter().enumerate() {
            let producer = if spread { i + n } else { i } % scenario.producers;
            plans[producer].push((at, i, n, key.key.clone()));
        }
    }
    plans
        .into_iter()
        .map(|mut p| {
            p.sort();
            p.into_iter()
                .map(|(at, _, n, key)| Planned {
                    at: Duration::from_micros(at),
                    event_id: format!("{key}#{n}"),
                    key,
                })
                .collect()
        })
        .collect()
}

fn drive(
    sim: &mut Sim,
    scenario: &Scenario,
    world: &World,
    seed: u64,
    keep_trace: bool,
) -> Result<RunOutcome, RunError> {
    let mut faults = FaultRunner::new(&scenario.faults);
    let limit = Duration::from_millis(scenario.duration_ms);
    let tail = Duration::from_millis(scenario.tail_ms);
    let mut quiet_since: Option<Duration> = None;
    let quiesced = loop {
        let now = sim.elapsed();
        faults.apply(sim, now, world);
        let quiet = is_quiet(scenario, world, &faults);
        if quiet {
            let since = *quiet_since.get_or_insert(now);
            if now.saturating_sub(since) >= tail {
                break true;
            }
        } else {
            quiet_since = None;
        }
        if now >= limit {
            break false;
        }
        // The hosts run on until the driver has something to do (a fault, the end of the
        // quiet tail, the limit), or until quiet begins or ends, which only a host can change.
        let mut until = faults.next_due().unwrap_or(now + SWITCH_POLL).min(limit);
        if let Some(since) = quiet_since {
            until = until.min(since + tail);
        }
        let until = until.max(now + SWITCH_POLL);
        sim.run_until(until, || is_quiet(scenario, world, &faults) != quiet)
            .map_err(|message| RunError::Sim { at: sim.elapsed(), message })?;
    };
    let end = sim.elapsed();
    let mut rec = world.rec.borrow_mut();
    rec.history.end = Time(end);
    rec.history.queued_at_end = world.store.borrow().queued();
    rec.log(
        Time(end),
        "driver",
        format_args!("end (quiesced: {quiesced}, depth {})", world.store.borrow().depth()),
    );
    let verdict = check(&rec.history);
    Ok(RunOutcome {
        seed,
        trace_hash: rec.trace_hash(),
        verdict,
        faults: rec.faults.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        simulated_ms: end.as_millis() as u64,
        quiesced,
        switches: faults.switches.clone(),
        trace: keep_trace.then(|| rec.trace().to_owned()),
        history: keep_trace.then(|| rec.history.clone()),
    })
}

/// Producers done, faults healed, nothing queued or open.
fn is_quiet(scenario: &Scenario, world: &World, faults: &FaultRunner) -> bool {
    let store = world.store.borrow();
    world.control.borrow().finished.len() == scenario.producers
        && faults.is_idle()
        && store.depth() == 0
        && store.uncommitted() == 0
}
