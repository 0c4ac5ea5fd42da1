//! The simulator: every host of a run on one tokio runtime with a paused clock, each host's
//! tasks in a `LocalSet` of their own, and turmoil-net's network between them ([`fabric`]).
//!
//! Time moves only when no host can run: the runtime's paused clock then jumps straight to
//! the earliest timer of any host or the next packet's arrival (tokio's auto-advance), so an
//! idle millisecond costs nothing and a busy one costs only the tasks that run in it. A host
//! is polled only when one of its tasks was woken (a timer, a packet, another host), which its
//! `LocalSet` reports through a waker of the host's own. Hosts use turmoil-net's sockets
//! (`turmoil_net::shim::tokio::net`), which reach the kernel of the host being polled.
//!
//! A crash drops the host's `LocalSet`, and with it every task of the process: its sockets
//! close as a kernel closes a dead process's sockets (a FIN, or a reset when unread data
//! waited). A restart builds the software anew from the host's factory. A machine that drops
//! off the network is a cut ([`Sim::partition`]).
//!
//! What fails a run rather than hanging or passing quietly: a host's error, a panic in any
//! host task, a task a host spawned onto the shared runtime (it would outlive a crash), and
//! more than [`MAX_POLLS_PER_INSTANT`] polls without the clock moving (hosts waking each
//! other forever).
//!
//! Determinism: one thread; hosts are polled in the order they were woken; every `select!`
//! in host code is `biased`, so tokio's unseeded RNG decides nothing; the network's
//! latencies are drawn from the run's seed; nothing reads the wall clock. The simulated clock
//! and turmoil-net's network are thread-locals, so a thread runs one simulation at a time (a
//! sweep gives each of its threads its own).

pub(crate) mod fabric;
#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex, Once};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::runtime::Runtime;
use tokio::task::LocalSet;
use tokio::time::Instant;
use turmoil_net::{EnterGuard, Net};

use fabric::{CutRule, Fabric, LatencyRule, SharedCuts};

/// The most polls of hosts the simulator makes at one simulated instant before it fails the
/// run: a busy instant of the largest generated scenario polls hosts a few hundred times, so
/// this many can only be hosts that wake each other without end.
pub const MAX_POLLS_PER_INSTANT: u64 = 200_000;

/// What a host's software returns: an error ends the run.
pub type HostResult = Result<(), Box<dyn std::error::Error>>;
/// A host's software, one start of it.
pub type HostFuture = Pin<Box<dyn Future<Output = HostResult>>>;

thread_local! {
    /// The simulated clock as of the current poll, and the run's start.
    static CLOCK: Cell<Option<(Instant, Instant)>> = const { Cell::new(None) };
    /// The first panic of a host task on this thread since the simulator last looked.
    static PANICKED: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The first failure a host task declared on this thread since the simulator last looked.
    static FAILED: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Fails the run on this thread with `message`, from any task of any host (the first failure
/// is the one reported): for a broken promise a host notices that is not its own error.
pub fn fail(message: String) {
    FAILED.with(|f| {
        f.borrow_mut().get_or_insert(message);
    });
}

/// Simulated time since the start of the run on this thread; zero outside a run.
pub fn elapsed() -> Duration {
    CLOCK.get().map_or(Duration::ZERO, |(now, start)| now - start)
}

/// Installs, once per process, a panic hook that notes a panic on a thread that is running a
/// simulation (tokio catches a task's panic, so nothing else would tell), then reports it as
/// the previous hook does.
fn note_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if CLOCK.get().is_some() {
                let text = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_owned());
                let place = info.location().map(|l| format!(" at {l}")).unwrap_or_default();
                PANICKED.with(|p| {
                    p.borrow_mut().get_or_insert(format!("{text}{place}"));
                });
            }
            previous(info);
        }));
    });
}

/// Hosts woken since they were last polled, in the order of their first wake.
struct Ready {
    state: Mutex<ReadyState>,
}

struct ReadyState {
    woken: Vec<bool>,
    queue: Vec<usize>,
    /// The runtime's waker for the simulation, woken only when it is not already polling.
    parent: Option<Waker>,
    polling: bool,
}

impl Ready {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReadyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark(&self, index: usize) {
        let mut s = self.lock();
        if !s.woken[index] {
            s.woken[index] = true;
            s.queue.push(index);
        }
        if !s.polling {
            if let Some(parent) = s.parent.take() {
                parent.wake();
            }
        }
    }
}

/// The waker a host's `LocalSet` is polled with.
struct HostWake {
    index: usize,
    ready: Arc<Ready>,
}

impl Wake for HostWake {
    fn wake(self: Arc<Self>) {
        self.ready.mark(self.index);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ready.mark(self.index);
    }
}

struct Slot {
    name: String,
    /// The host's id in turmoil-net and its address.
    id: turmoil_net::HostId,
    ip: IpAddr,
    factory: Box<dyn Fn() -> HostFuture>,
    set: Option<Pin<Box<LocalSet>>>,
    waker: Waker,
    polls: u64,
    /// Polls at the current instant.
    polls_now: u64,
}

/// A simulation's settings.
#[derive(Clone, Copy, Debug)]
pub struct Builder {
    seed: u64,
    min_latency: Duration,
    max_latency: Duration,
}

impl Builder {
    /// A simulation seeded with `seed`, packets delivered after 1 ms.
    pub fn new(seed: u64) -> Self {
        let ms = Duration::from_millis(1);
        Self { seed, min_latency: ms, max_latency: ms }
    }

    /// Packet latency, drawn per packet between `min` and `max` in whole ms.
    pub fn latency(mut self, min: Duration, max: Duration) -> Self {
        self.min_latency = min;
        self.max_latency = max.max(min);
        self
    }

    /// Builds the simulation; its clock reads zero.
    ///
    /// # Panics
    /// While another simulation on this thread is alive (they would share the clock and the
    /// network).
    pub fn build(self) -> Sim {
        assert!(CLOCK.get().is_none(), "one simulation per thread at a time");
        note_panics();
        let mut rng = StdRng::seed_from_u64(self.seed);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a current-thread runtime builds");
        // The simulator owns the simulated clock: the one place that reads the runtime's.
        #[allow(clippy::disallowed_methods)]
        let start = rt.block_on(async { Instant::now() });
        CLOCK.set(Some((start, start)));
        let cuts = SharedCuts::default();
        let now = Rc::new(Cell::new(start));
        let mut net = Net::with_config(fabric::kernel_config());
        net.rule(CutRule { cuts: cuts.clone() });
        net.rule(LatencyRule {
            rng: StdRng::seed_from_u64(rng.random()),
            min_ms: self.min_latency.as_millis() as u64,
            max_ms: self.max_latency.as_millis() as u64,
            now: now.clone(),
            last_due: Default::default(),
        });
        let ready = Arc::new(Ready {
            state: Mutex::new(ReadyState {
                woken: Vec::new(),
                queue: Vec::new(),
                parent: None,
                polling: false,
            }),
        });
        Sim {
            rt,
            net: Some(net),
            guard: None,
            cuts: cuts.clone(),
            fabric: Fabric::new(cuts, now),
            hosts: Vec::new(),
            ready,
            start,
            instant: start,
            failure: Rc::default(),
            batch: Vec::new(),
        }
    }
}

/// A running simulation.
pub struct Sim {
    rt: Runtime,
    /// The network while hosts are still being added; entered (installed on this thread) at
    /// the first run.
    net: Option<Net>,
    guard: Option<EnterGuard>,
    cuts: SharedCuts,
    fabric: Fabric,
    hosts: Vec<Slot>,
    ready: Arc<Ready>,
    start: Instant,
    /// The instant the per-instant poll counts are for.
    instant: Instant,
    failure: Rc<RefCell<Option<String>>>,
    batch: Vec<usize>,
}

impl Sim {
    /// Adds a host named `name` (resolvable by that name from every host) and starts its
    /// software; `factory` builds it anew at each start.
    ///
    /// # Panics
    /// After the simulation first ran: turmoil-net fixes its hosts when it is installed.
    pub fn host(&mut self, name: impl Into<String>, factory: impl Fn() -> HostFuture + 'static) {
        let name = name.into();
        let net = self.net.as_mut().expect("hosts are added before the simulation first runs");
        let id = net.add_host(name.as_str());
        let ip = net.lookup(&name);
        let index = self.hosts.len();
        self.ready.lock().woken.push(false);
        let waker = Waker::from(Arc::new(HostWake { index, ready: self.ready.clone() }));
        self.hosts.push(Slot {
            name,
            id,
            ip,
            factory: Box::new(factory),
            set: None,
            waker,
            polls: 0,
            polls_now: 0,
        });
        self.start_host(index);
    }

    /// Runs `client` as a host of its own until it finishes, for at most `limit` of
    /// simulated time; its error, another host's failure or the limit is the error.
    pub fn run_client(
        &mut self,
        name: impl Into<String>,
        client: impl Future<Output = HostResult> + 'static,
        limit: Duration,
    ) -> Result<(), String> {
        let done = Rc::new(Cell::new(false));
        let once = RefCell::new(Some(Box::pin(client) as HostFuture));
        let finished = done.clone();
        self.host(name, move || {
            let (client, finished) = (once.borrow_mut().take(), finished.clone());
            Box::pin(async move {
                if let Some(client) = client {
                    client.await?;
                    finished.set(true);
                }
                Ok(())
            })
        });
        self.run_until(limit, || done.get())?;
        if done.get() {
            Ok(())
        } else {
            Err(format!("the client did not finish within {limit:?}"))
        }
    }

    /// How many times the host named `name` has been polled (each a wake of one of its tasks
    /// or a start); `None` for an unknown name.
    pub fn polls(&self, name: &str) -> Option<u64> {
        self.index(name).map(|i| self.hosts[i].polls)
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        elapsed()
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.name == name)
    }

    fn start_host(&mut self, index: usize) {
        let _rt = self.rt.enter();
        let slot = &mut self.hosts[index];
        let set = LocalSet::new();
        let software = (slot.factory)();
        let (failure, name) = (self.failure.clone(), slot.name.clone());
        set.spawn_local(async move {
            if let Err(e) = software.await {
                failure.borrow_mut().get_or_insert_with(|| format!("host {name} failed: {e}"));
            }
        });
        slot.set = Some(Box::pin(set));
        self.ready.mark(index);
    }

    /// Kills the host's process at once: its tasks are dropped, and its sockets closed as the
    /// kernel closes a dead process's sockets. Unknown names are ignored.
    pub fn crash(&mut self, name: &str) {
        let Some(index) = self.index(name) else { return };
        let _rt = self.rt.enter();
        let slot = &mut self.hosts[index];
        if self.guard.is_some() {
            turmoil_net::set_current(slot.id);
        }
        drop(slot.set.take());
    }

    /// Restarts the host's software from its factory (after a crash, or crashing it first).
    pub fn bounce(&mut self, name: &str) {
        let Some(index) = self.index(name) else { return };
        self.crash(name);
        self.start_host(index);
    }

    /// Cuts the network between two hosts: what is in flight between them is lost, and
    /// nothing gets through until [`Sim::repair`].
    pub fn partition(&mut self, a: &str, b: &str) {
        if let (Some(a), Some(b)) = (self.index(a), self.index(b)) {
            let (a, b) = (self.hosts[a].ip, self.hosts[b].ip);
            self.cuts.borrow_mut().insert(if a <= b { (a, b) } else { (b, a) });
        }
    }

    /// Repairs the network between two hosts.
    pub fn repair(&mut self, a: &str, b: &str) {
        if let (Some(a), Some(b)) = (self.index(a), self.index(b)) {
            let (a, b) = (self.hosts[a].ip, self.hosts[b].ip);
            self.cuts.borrow_mut().remove(&if a <= b { (a, b) } else { (b, a) });
        }
    }

    /// Runs the hosts until simulated time `until`, or until `stop` answers true (asked
    /// after each round of polls, with the clock where it is). Timers due at `until` have
    /// fired but their tasks have not run, so what the caller does at `until` comes first.
    /// A host's failure ends the run with its message.
    pub fn run_until(
        &mut self,
        until: Duration,
        mut stop: impl FnMut() -> bool,
    ) -> Result<(), String> {
        if self.guard.is_none() {
            let net = self.net.take().expect("a simulation not yet entered keeps its network");
            self.guard = Some(net.enter());
        }
        let deadline = self.start + until;
        let Sim { rt, guard, fabric, hosts, ready, failure, batch, instant, .. } = self;
        let guard = guard.as_ref().expect("entered above");
        let handle = rt.handle().clone();
        rt.block_on(async {
            let mut sleep = std::pin::pin!(tokio::time::sleep_until(deadline));
            std::future::poll_fn(|cx| loop {
                #[allow(clippy::disallowed_methods)] // the simulated clock, published to hosts
                let now = Instant::now();
                CLOCK.set(Some((now, deadline - until)));
                if now >= deadline {
                    return Poll::Ready(Ok(()));
                }
                if now != *instant {
                    *instant = now;
                    hosts.iter_mut().for_each(|h| h.polls_now = 0);
                }
                {
                    let mut s = ready.lock();
                    if !s.parent.as_ref().is_some_and(|p| p.will_wake(cx.waker())) {
                        s.parent = Some(cx.waker().clone());
                    }
                    s.polling = true;
                }
                // Whether a kernel may have packets to send: a crash since the last run, an
                // arrival (an ACK, a reset) or a host's poll. An egress pass walks every
                // socket of every host, so it runs only then.
                let mut dirty = true;
                let outcome = loop {
                    dirty |= fabric.deliver_due(guard, now);
                    {
                        let mut s = ready.lock();
                        std::mem::swap(&mut s.queue, batch);
                        for i in batch.iter() {
                            s.woken[*i] = false;
                        }
                    }
                    if batch.is_empty() {
                        if dirty && fabric.egress(guard, now) {
                            dirty = false;
                            continue;
                        }
                        break None;
                    }
                    let mut verdict = None;
                    for &index in batch.iter() {
                        if let Err(e) = poll_host(&handle, &mut hosts[index]) {
                            verdict = Some(Err(e));
                            break;
                        }
                    }
                    batch.clear();
                    if verdict.is_some() {
                        break verdict;
                    }
                    fabric.egress(guard, now);
                    dirty = false;
                    if let Some(f) = failure.borrow_mut().take() {
                        break Some(Err(f));
                    }
                    if let Some(e) = livelock(hosts) {
                        break Some(Err(e));
                    }
                    if stop() {
                        break Some(Ok(()));
                    }
                };
                ready.lock().polling = false;
                if let Some(outcome) = outcome {
                    return Poll::Ready(outcome);
                }
                // Sleep until the deadline or the network's next arrival, whichever is first.
                let wake_at = fabric.next_arrival().map_or(deadline, |a| a.min(deadline));
                if sleep.deadline() != wake_at {
                    sleep.as_mut().reset(wake_at);
                }
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            })
            .await
        })
    }
}

/// Polls one host's tasks with the network pointed at its kernel; a panic in one of them, or
/// a task it spawned onto the shared runtime, is the run's failure.
fn poll_host(handle: &tokio::runtime::Handle, slot: &mut Slot) -> Result<(), String> {
    let Some(set) = slot.set.as_mut() else { return Ok(()) };
    slot.polls += 1;
    slot.polls_now += 1;
    turmoil_net::set_current(slot.id);
    let mut cx = Context::from_waker(&slot.waker);
    let finished = set.as_mut().poll(&mut cx).is_ready();
    if finished {
        slot.set = None;
    }
    if let Some(panic) = PANICKED.with(|p| p.borrow_mut().take()) {
        return Err(format!("host {} panicked: {panic}", slot.name));
    }
    if let Some(failure) = FAILED.with(|f| f.borrow_mut().take()) {
        return Err(format!("host {}: {failure}", slot.name));
    }
    if handle.metrics().num_alive_tasks() > 0 {
        return Err(format!(
            "host {} spawned a task onto the shared runtime (tokio::spawn): a crash could not \
             end it; host code spawns with tokio::task::spawn_local",
            slot.name
        ));
    }
    Ok(())
}

/// The failure when the hosts were polled more than [`MAX_POLLS_PER_INSTANT`] times without
/// the clock moving, naming the host polled most.
fn livelock(hosts: &[Slot]) -> Option<String> {
    let total: u64 = hosts.iter().map(|h| h.polls_now).sum();
    if total <= MAX_POLLS_PER_INSTANT {
        return None;
    }
    let busiest = hosts.iter().max_by_key(|h| h.polls_now)?;
    Some(format!(
        "the hosts were polled {total} times at {:?} without the clock moving (the bound is \
         {MAX_POLLS_PER_INSTANT}): host {} was polled {} times, waking itself or another host \
         without end",
        elapsed(),
        busiest.name,
        busiest.polls_now
    ))
}

impl Drop for Sim {
    fn drop(&mut self) {
        // Hosts' tasks hold timers of this runtime and sockets of the network: drop them
        // inside both, then forget the clock so that nothing reads a finished run's time.
        let _rt = self.rt.enter();
        for slot in &mut self.hosts {
            if self.guard.is_some() {
                turmoil_net::set_current(slot.id);
            }
            drop(slot.set.take());
            // What the factory holds across starts (a listening socket) goes with the host.
            slot.factory = Box::new(|| Box::pin(async { Ok(()) }));
        }
        drop(self.guard.take());
        CLOCK.set(None);
        PANICKED.with(|p| p.borrow_mut().take());
        FAILED.with(|f| f.borrow_mut().take());
    }
}
