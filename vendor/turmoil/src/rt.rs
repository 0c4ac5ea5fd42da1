use std::cell::RefCell;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use rand::rngs::SmallRng;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tokio::task::LocalSet;
use tokio::time::{sleep, Duration, Instant};

use super::Result;

// To support re-creation, we need to store a factory of the future that
// represents the software. This is somewhat annoying in that it requires
// boxxing to avoid generics.
type Software<'a> = Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result>>> + 'a>;

/// Runtime kinds.
pub enum Kind<'a> {
    /// A runtime for executing test code.
    Client,

    /// A runtime that is running simulated host software.
    Host { software: Software<'a> },

    /// A runtime without any software. The network topology uses this for
    /// time tracking and message delivery.
    NoSoftware,
}

/// Runtime configuration.
#[derive(Clone, Default)]
pub struct Config {
    /// Whether io is enabled on the runtime.
    pub enable_io: bool,

    /// Rng used to seed the tokio runtime.
    ///
    /// Only used if the `tokio_unstable` cfg flag is set.
    #[cfg_attr(not(tokio_unstable), expect(dead_code))]
    pub rng: Option<SmallRng>,
}

/// Per host simulated runtime.
///
/// The tokio runtime is paused (see [`Builder::start_paused`]), which gives us
/// control over when and how to advance time. In particular, see [`Rt::tick`],
/// which lets the runtime do a bit more work.
pub struct Rt<'a> {
    pub kind: Kind<'a>,

    /// Handle to the Tokio runtime driving this simulated host. Each runtime
    /// may have a different sense of "now" which simulates clock skew.
    tokio: Runtime,

    /// Local task set used for running !Send tasks.
    local: LocalSet,

    /// A user readable name to identify the node.
    pub nodename: Arc<str>,

    /// Optional handle to a host's software. When software finishes, the handle is
    /// consumed to check for error, which is propagated up to fail the simulation.
    handle: Option<JoinHandle<Result>>,

    /// Runtime configuration.
    config: Config,

    /// keyorder patch: records wakes of the local tasks (see [`Wakes`]).
    wakes: Arc<Wakes>,

    /// A waker over `wakes`, registered with the local set on every poll.
    wakes_waker: Waker,

    /// keyorder patch: how long after the clock's reading at the end of the last tick the
    /// timer wheel first needs processing (`Duration::MAX`: no timer); zero when unknown
    /// or when tasks are spawned on the runtime itself, whose wakes `wakes` does not see.
    timers_quiet_for: Duration,

    /// keyorder patch: how far this runtime's clock is behind the simulation, over ticks
    /// skipped because nothing in the runtime could run in them (see [`Rt::idle_ticks`]).
    lag: Duration,
}

/// keyorder patch: whether a local task of the host was woken since the local set was last
/// polled. A task woken while its local set is not being polled (by a timer firing, by the
/// network delivering to one of its sockets, by another host) makes tokio wake the local
/// set's registered waker, which is this one; a task woken by another task during a poll
/// is run in that poll, or the local set wakes this waker because tasks remain. So a
/// runtime with this flag clear has no task ready to run. Wakes are forwarded to the
/// runtime's own waker, so tokio sees exactly the wakes it saw before.
#[derive(Default)]
pub(crate) struct Wakes {
    woken: AtomicBool,
    forward: Mutex<Option<Waker>>,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Relaxed);
        if let Some(waker) = self.forward.lock().expect("never poisoned").as_ref() {
            waker.wake_by_ref();
        }
    }
}

/// Polls the tick's `run_until` with the [`Wakes`] waker in place of the runtime's, so the
/// local set registers it; the runtime's waker goes to `forward` and to `outer`, for the
/// tick's own sleep.
struct Tracked<'w, F> {
    wakes: &'w Arc<Wakes>,
    waker: &'w Waker,
    outer: &'w RefCell<Option<Waker>>,
    inner: Pin<&'w mut F>,
}

impl<F: Future> Future for Tracked<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let me = self.get_mut();
        let stale = me
            .outer
            .borrow()
            .as_ref()
            .is_none_or(|w| !w.will_wake(cx.waker()));
        if stale {
            *me.outer.borrow_mut() = Some(cx.waker().clone());
            *me.wakes.forward.lock().expect("never poisoned") = Some(cx.waker().clone());
        }
        // This poll runs what was woken before it, unless the sleep is over first: then
        // `run_until` returns without polling the local set, and the wakes stand.
        let woken = me.wakes.woken.swap(false, Relaxed);
        let out = me.inner.as_mut().poll(&mut Context::from_waker(me.waker));
        if out.is_ready() && woken {
            me.wakes.woken.store(true, Relaxed);
        }
        out
    }
}

/// The tick's sleep, polled with the runtime's own waker: its firing is not a task's wake.
struct Untracked<'w, F> {
    outer: &'w RefCell<Option<Waker>>,
    sleep: Pin<&'w mut F>,
}

impl<F: Future> Future for Untracked<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<F::Output> {
        let me = self.get_mut();
        let outer = me.outer.borrow();
        let waker = outer.as_ref().expect("set by Tracked before it polls");
        me.sleep.as_mut().poll(&mut Context::from_waker(waker))
    }
}

impl<'a> Rt<'a> {
    pub(crate) fn client<F>(nodename: Arc<str>, client: F, mut config: Config) -> Self
    where
        F: Future<Output = Result> + 'static,
    {
        let (tokio, local) = init(&mut config);

        let handle = with(&tokio, &local, || tokio::task::spawn_local(client));

        Self {
            kind: Kind::Client,
            tokio,
            local,
            nodename,
            handle: Some(handle),
            config,
            wakes: Default::default(),
            wakes_waker: Waker::noop().clone(),
            timers_quiet_for: Duration::ZERO,
            lag: Duration::ZERO,
        }
        .with_wakes()
    }

    pub(crate) fn host<F, Fut>(nodename: Arc<str>, software: F, mut config: Config) -> Self
    where
        F: Fn() -> Fut + 'a,
        Fut: Future<Output = Result> + 'static,
    {
        let (tokio, local) = init(&mut config);

        let software: Software = Box::new(move || Box::pin(software()));
        let handle = with(&tokio, &local, || tokio::task::spawn_local(software()));

        Self {
            kind: Kind::Host { software },
            tokio,
            local,
            nodename,
            handle: Some(handle),
            config,
            wakes: Default::default(),
            wakes_waker: Waker::noop().clone(),
            timers_quiet_for: Duration::ZERO,
            lag: Duration::ZERO,
        }
        .with_wakes()
    }

    pub(crate) fn no_software() -> Self {
        let mut config = Config::default();
        let (tokio, local) = init(&mut config);

        Self {
            kind: Kind::NoSoftware,
            tokio,
            local,
            nodename: String::new().into(),
            handle: None,
            config,
            wakes: Default::default(),
            wakes_waker: Waker::noop().clone(),
            timers_quiet_for: Duration::ZERO,
            lag: Duration::ZERO,
        }
        .with_wakes()
    }

    fn with_wakes(mut self) -> Self {
        self.wakes_waker = Waker::from(self.wakes.clone());
        // The software was just spawned: its first poll is due.
        self.wakes.woken.store(true, Relaxed);
        self
    }

    /// keyorder patch: how many ticks of `tick` in a row would do nothing in this runtime,
    /// unless something outside wakes one of its tasks meanwhile: none while a task is
    /// woken, else the ticks that end before the timer wheel next needs processing
    /// (`u64::MAX`: no timer). Such a tick only moves the clock, so it can be skipped with
    /// [`Rt::skip`] and the clock moved at the start of the next tick that runs.
    pub(crate) fn idle_ticks(&self, tick: Duration) -> u64 {
        if self.wakes.woken.load(Relaxed) || tick.is_zero() {
            return 0;
        }
        if self.timers_quiet_for == Duration::MAX {
            return u64::MAX;
        }
        // Idle for n ticks while the first timer lies beyond lag + n * tick.
        let ahead = self.timers_quiet_for.saturating_sub(self.lag).as_nanos();
        u64::try_from(ahead.saturating_sub(1) / tick.as_nanos()).unwrap_or(u64::MAX)
    }

    /// keyorder patch: skips ticks that [`Rt::idle_ticks`] found idle; the clock catches
    /// up at the start of the next [`Rt::tick`].
    pub(crate) fn skip(&mut self, duration: Duration) {
        self.lag += duration;
    }

    /// See `timers_quiet_for`.
    fn timers_quiet_for(&self) -> Duration {
        let handle = self.tokio.handle();
        if handle.metrics().num_alive_tasks() > 0 {
            return Duration::ZERO;
        }
        handle.next_timer_in().unwrap_or(Duration::MAX)
    }

    pub(crate) fn is_client(&self) -> bool {
        matches!(self.kind, Kind::Client)
    }

    fn is_host(&self) -> bool {
        matches!(self.kind, Kind::Host { .. })
    }

    pub(crate) fn is_software_running(&self) -> bool {
        self.handle.is_some()
    }

    /// The runtime's clock as it reads once caught up over skipped ticks.
    pub(crate) fn now(&self) -> Instant {
        let _guard = self.tokio.enter();
        Instant::now() + self.lag
    }

    // This method is called by [`Sim::run`], which iterates through all the
    // runtimes and ticks each one. The magic of this method is described in the
    // documentation for [`LocalSet::run_until`], but it may not be entirely
    // obvious how things fit together.
    //
    // A [`LocalSet`] tracks the tasks to run, which may in turn spawn more
    // tasks. `run_until` drives a top level task to completion, but not its
    // children. If you look below, you may be confused. The task we run here
    // just sleeps and has no children! However, it's the _same `LocalSet`_ that
    // is used to run software on the host.
    //
    // In this way, every time `tick` is called, the following unfolds:
    //
    // 1. Time advances on the runtime
    // 2. We schedule a new task that simply sleeps
    // 3. Other tasks on the `LocalSet` get a chance to run
    // 4. The sleep finishes
    // 5. The runtime pauses
    //
    // Returns whether the software has finished successfully or the error
    // that caused failure. Subsequent calls do not return the error as it is
    // expected to fail the simulation.
    pub(crate) fn tick(&mut self, duration: Duration) -> Result<bool> {
        let outer: RefCell<Option<Waker>> = RefCell::new(None);
        let wakes = &self.wakes;
        let waker = &self.wakes_waker;
        let local = &self.local;
        let lag = mem::take(&mut self.lag);
        self.tokio.block_on(async {
            // Catch up over skipped ticks first: no timer is due in them, so nothing fires
            // and no task runs (the local set is not polled until the tick proper).
            if !lag.is_zero() {
                tokio::time::advance(lag).await;
            }
            let sleeping = std::pin::pin!(sleep(duration));
            let run = std::pin::pin!(local.run_until(Untracked {
                outer: &outer,
                sleep: sleeping,
            }));
            Tracked {
                wakes,
                waker,
                outer: &outer,
                inner: run,
            }
            .await
        });
        self.timers_quiet_for = self.timers_quiet_for();

        // pull for software completion
        match &self.handle {
            Some(handle) if handle.is_finished() => {
                // Consume handle to extract task result
                if let Some(h) = self.handle.take() {
                    match self.tokio.block_on(h) {
                        // If the host was crashed the JoinError is cancelled, which
                        // needs to be handled to not fail the simulation.
                        Err(je) if je.is_cancelled() => {}
                        res => res??,
                    }
                };
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Ok(true),
        }
    }

    pub(crate) fn crash(&mut self) {
        if !self.is_host() {
            panic!("can only crash host's software");
        }

        if self.handle.take().is_some() {
            self.cancel_tasks();
        };
    }

    pub(crate) fn bounce(&mut self) {
        if !self.is_host() {
            panic!("can only bounce host's software");
        }

        self.cancel_tasks();

        if let Kind::Host { software } = &self.kind {
            let handle = with(&self.tokio, &self.local, || {
                tokio::task::spawn_local(software())
            });
            self.handle.replace(handle);
        };
    }

    /// Cancel all tasks within the [`Rt`] by dropping the current tokio
    /// [`Runtime`].
    ///
    /// Dropping the runtime blocks the calling thread until all futures have
    /// completed, which is desired here to ensure host software completes and
    /// all resources are dropped.
    ///
    /// Both the [`Runtime`] and [`LocalSet`] are replaced with new instances.
    fn cancel_tasks(&mut self) {
        let (tokio, local) = init(&mut self.config);
        // keyorder patch: a fresh runtime: its clock starts where a fresh runtime's does,
        // and whatever is spawned next is due.
        self.lag = Duration::ZERO;
        self.timers_quiet_for = Duration::ZERO;
        self.wakes.woken.store(true, Relaxed);

        _ = mem::replace(&mut self.tokio, tokio);
        drop(mem::replace(&mut self.local, local));
    }
}

fn init(config: &mut Config) -> (Runtime, LocalSet) {
    let mut tokio_builder = tokio::runtime::Builder::new_current_thread();

    #[cfg(tokio_unstable)]
    tokio_builder.unhandled_panic(tokio::runtime::UnhandledPanic::ShutdownRuntime);

    if config.enable_io {
        tokio_builder.enable_io();
    }

    #[cfg(tokio_unstable)]
    if let Some(rng) = &mut config.rng {
        let bytes: [u8; 32] = rand::Rng::random(rng);
        let seed = tokio::runtime::RngSeed::from_bytes(&bytes);
        tokio_builder.rng_seed(seed);
    }

    let tokio = tokio_builder
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();

    tokio.block_on(async {
        // Sleep to "round" `Instant::now()` to the closest `ms`
        tokio::time::sleep(Duration::from_millis(1)).await;
    });

    (tokio, new_local())
}

fn new_local() -> LocalSet {
    #[cfg(not(tokio_unstable))]
    let local = LocalSet::new();

    #[cfg(tokio_unstable)]
    let mut local = LocalSet::new();

    #[cfg(tokio_unstable)]
    local.unhandled_panic(tokio::runtime::UnhandledPanic::ShutdownRuntime);

    local
}

fn with<R>(tokio: &Runtime, local: &LocalSet, f: impl FnOnce() -> R) -> R {
    tokio.block_on(async { local.run_until(async { f() }).await })
}
