//! The simulator: every host of a run on one tokio runtime with a paused clock, each host's
//! tasks in a `LocalSet` of their own, and the network of [`net`] between them.
//!
//! Time moves only when no host can run: the runtime's paused clock then jumps straight to
//! the earliest timer of any host (tokio's auto-advance), so an idle millisecond costs
//! nothing and a busy one costs only the tasks that run in it. A host is polled only when
//! one of its tasks was woken (a timer, a message, another host), which its `LocalSet`
//! reports through a waker of the host's own. A crash drops the host's `LocalSet`, and with
//! it every task and connection of the process; a restart builds the software anew from the
//! host's factory. A machine that drops off the network is a cut ([`Sim::partition`]).
//!
//! Determinism: one thread; hosts are polled in the order they were woken; the runtime's own
//! RNG (`select!`) and the network's latencies are seeded from the run's seed; nothing reads
//! the wall clock. The simulated clock is published to hosts through a thread-local, so a
//! thread runs one simulation at a time (a sweep gives each of its threads its own).

pub mod net;
#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::runtime::Runtime;
use tokio::task::LocalSet;
use tokio::time::Instant;

use net::{Net, SharedNet};

/// A host's index in its simulation: the same in the network and in the simulator's hosts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostId(pub(crate) usize);

/// What a host's software returns: an error ends the run.
pub type HostResult = Result<(), Box<dyn std::error::Error>>;
/// A host's software, one start of it.
pub type HostFuture = Pin<Box<dyn Future<Output = HostResult>>>;

thread_local! {
    /// The run's network and the host whose task is being polled (with its start).
    static CURRENT: RefCell<Option<(SharedNet, HostId, u64)>> = const { RefCell::new(None) };
    /// The simulated clock as of the current poll, and the run's start.
    static CLOCK: Cell<Option<(Instant, Instant)>> = const { Cell::new(None) };
}

/// The network, the host being polled and its start: for binding and connecting.
///
/// # Panics
/// Outside a simulated host's task.
pub(crate) fn current_host() -> (SharedNet, HostId, u64) {
    CURRENT.with(|c| c.borrow().clone()).expect("network use outside a simulated host")
}

/// The simulated clock as of the current poll.
pub(crate) fn now_instant() -> Instant {
    CLOCK.get().map(|(now, _)| now).expect("the simulated clock read outside a simulation")
}

/// Simulated time since the start of the run on this thread; zero outside a run.
pub fn elapsed() -> Duration {
    CLOCK.get().map_or(Duration::ZERO, |(now, start)| now - start)
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
    fn mark(&self, index: usize) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
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
    factory: Box<dyn Fn() -> HostFuture>,
    starts: u64,
    set: Option<Pin<Box<LocalSet>>>,
    waker: Waker,
    polls: u64,
}

/// A simulation's settings.
#[derive(Clone, Copy, Debug)]
pub struct Builder {
    seed: u64,
    min_latency: Duration,
    max_latency: Duration,
}

impl Builder {
    /// A simulation seeded with `seed`, messages delivered after 1 ms.
    pub fn new(seed: u64) -> Self {
        let ms = Duration::from_millis(1);
        Self { seed, min_latency: ms, max_latency: ms }
    }

    /// Message latency, drawn per message between `min` and `max` in whole ms.
    pub fn latency(mut self, min: Duration, max: Duration) -> Self {
        self.min_latency = min;
        self.max_latency = max.max(min);
        self
    }

    /// Builds the simulation; its clock reads zero.
    ///
    /// # Panics
    /// While another simulation on this thread is alive (they would share the clock).
    pub fn build(self) -> Sim {
        assert!(CLOCK.get().is_none(), "one simulation per thread at a time");
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut builder = tokio::runtime::Builder::new_current_thread();
        builder.enable_time().start_paused(true);
        let rt = builder.build().expect("a current-thread runtime builds");
        // The simulator owns the simulated clock: the one place that reads the runtime's.
        #[allow(clippy::disallowed_methods)]
        let start = rt.block_on(async { Instant::now() });
        CLOCK.set(Some((start, start)));
        let net = Rc::new(RefCell::new(Net::new(
            StdRng::seed_from_u64(rng.random()),
            self.min_latency,
            self.max_latency,
        )));
        let ready = Arc::new(Ready {
            state: Mutex::new(ReadyState {
                woken: Vec::new(),
                queue: Vec::new(),
                parent: None,
                polling: false,
            }),
        });
        Sim { rt, net, hosts: Vec::new(), ready, start, failure: Rc::default(), batch: Vec::new() }
    }
}

/// A running simulation.
pub struct Sim {
    rt: Runtime,
    net: SharedNet,
    hosts: Vec<Slot>,
    ready: Arc<Ready>,
    start: Instant,
    failure: Rc<RefCell<Option<String>>>,
    batch: Vec<usize>,
}

impl Sim {
    /// Adds a host named `name` and starts its software; `factory` builds it anew at each
    /// start.
    pub fn host(&mut self, name: impl Into<String>, factory: impl Fn() -> HostFuture + 'static) {
        let name = name.into();
        let index = self.hosts.len();
        let id = self.net.borrow_mut().add_host(&name);
        assert_eq!(id, HostId(index), "hosts are numbered alike in the network and here");
        {
            let mut s = self.ready.state.lock().unwrap_or_else(|e| e.into_inner());
            s.woken.push(false);
        }
        let waker = Waker::from(Arc::new(HostWake { index, ready: self.ready.clone() }));
        self.hosts.push(Slot {
            name,
            factory: Box::new(factory),
            starts: 0,
            set: None,
            waker,
            polls: 0,
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
        slot.starts += 1;
        self.net.borrow_mut().started(HostId(index), slot.starts);
        let mut set = LocalSet::new();
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

    /// Kills the host's process at once: its tasks are dropped, and its connections closed
    /// as the kernel closes a dead process's sockets (see [`net`]). Unknown names are ignored.
    pub fn crash(&mut self, name: &str) {
        let Some(index) = self.index(name) else { return };
        let _rt = self.rt.enter();
        self.net.borrow_mut().stopped(HostId(index));
        drop(self.hosts[index].set.take());
    }

    /// Restarts the host's software from its factory (after a crash, or crashing it first).
    pub fn bounce(&mut self, name: &str) {
        let Some(index) = self.index(name) else { return };
        self.crash(name);
        self.start_host(index);
    }

    /// Cuts the network between two hosts.
    pub fn partition(&mut self, a: &str, b: &str) {
        if let (Some(a), Some(b)) = (self.index(a), self.index(b)) {
            let (a, b) = (HostId(a), HostId(b));
            self.net.borrow_mut().cut(a, b);
        }
    }

    /// Repairs the network between two hosts.
    pub fn repair(&mut self, a: &str, b: &str) {
        if let (Some(a), Some(b)) = (self.index(a), self.index(b)) {
            let (a, b) = (HostId(a), HostId(b));
            self.net.borrow_mut().repair(a, b);
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
        let deadline = self.start + until;
        let Sim { rt, net, hosts, ready, failure, batch, .. } = self;
        rt.block_on(async {
            let mut sleep = std::pin::pin!(tokio::time::sleep_until(deadline));
            std::future::poll_fn(|cx| loop {
                #[allow(clippy::disallowed_methods)] // the simulated clock, published to hosts
                let now = Instant::now();
                CLOCK.set(Some((now, deadline - until)));
                if now >= deadline {
                    return Poll::Ready(Ok(()));
                }
                {
                    let mut s = ready.state.lock().unwrap_or_else(|e| e.into_inner());
                    if !s.parent.as_ref().is_some_and(|p| p.will_wake(cx.waker())) {
                        s.parent = Some(cx.waker().clone());
                    }
                    s.polling = true;
                }
                let outcome = loop {
                    net.borrow_mut().deliver_due(now);
                    {
                        let mut s = ready.state.lock().unwrap_or_else(|e| e.into_inner());
                        std::mem::swap(&mut s.queue, batch);
                        for i in batch.iter() {
                            s.woken[*i] = false;
                        }
                    }
                    if batch.is_empty() {
                        break None;
                    }
                    for &index in batch.iter() {
                        poll_host(net, HostId(index), &mut hosts[index]);
                    }
                    batch.clear();
                    if let Some(f) = failure.borrow_mut().take() {
                        break Some(Err(f));
                    }
                    if stop() {
                        break Some(Ok(()));
                    }
                };
                ready.state.lock().unwrap_or_else(|e| e.into_inner()).polling = false;
                if let Some(outcome) = outcome {
                    return Poll::Ready(outcome);
                }
                // Sleep until the deadline or the network's next arrival, whichever is first.
                let wake_at = net.borrow().next_arrival().map_or(deadline, |a| a.min(deadline));
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

fn poll_host(net: &SharedNet, id: HostId, slot: &mut Slot) {
    let Some(set) = slot.set.as_mut() else { return };
    slot.polls += 1;
    CURRENT.with(|c| *c.borrow_mut() = Some((net.clone(), id, slot.starts)));
    let mut cx = Context::from_waker(&slot.waker);
    let finished = set.as_mut().poll(&mut cx).is_ready();
    CURRENT.with(|c| *c.borrow_mut() = None);
    if finished {
        slot.set = None;
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        // Hosts' tasks hold timers of this runtime: drop them inside it, then forget the
        // clock so that nothing reads a finished run's time.
        let _rt = self.rt.enter();
        for slot in &mut self.hosts {
            drop(slot.set.take());
        }
        CLOCK.set(None);
    }
}
