//! The simulated network: connections carrying whole messages between hosts (values moved
//! from sender to receiver, never encoded: nothing here can depend on a length), each delivered
//! after a latency drawn from the run's RNG, in order per direction, as a TCP stream delivers
//! them.
//!
//! What the hosts can observe, and how it comes about:
//! * a message arrives after `min..=max` latency, never before an earlier message of the same
//!   direction (TCP's in-order delivery);
//! * a cut between two hosts drops everything in flight between them and everything sent
//!   while it lasts; a direction that lost a message delivers nothing more, ever (the stream
//!   has a gap no retransmission fills), so its reader waits until its own timeout, as behind
//!   a firewall that drops packets; a connection attempt across a cut is never answered;
//! * a connection end that is closed, by its process or by the process's death (the kernel
//!   closes a dead process's sockets), sends a FIN: the peer reads an end of stream after a
//!   latency; if messages toward it were unread or still in flight, it answers a reset
//!   instead, and a message that arrives at a closed end later is answered with a reset too,
//!   which the sender's next read or write reports after the reset's latency;
//! * connecting to a host with no listener on the port is refused after a round trip.
//!
//! Everything here runs on the one thread of the run; time is the paused tokio clock.

use std::any::Any;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::{Instant, Sleep};

use super::{current_host, now_instant, HostId};

/// The network's state: hosts, listeners, cuts and live connections.
pub(crate) struct Net {
    rng: StdRng,
    min_ms: u64,
    max_ms: u64,
    hosts: Vec<NetHost>,
    /// Cut host pairs, each stored lowest id first.
    cuts: Vec<(HostId, HostId)>,
    /// Every connection opened, for cutting those between two hosts.
    links: Vec<Weak<RefCell<Link>>>,
    /// When something reaches a connection end (a message, a FIN, a reset): the network wakes
    /// the end's reader then, so a reader holds no timer of its own for it.
    arrivals: BinaryHeap<Reverse<Arrival>>,
    /// Tie-break among arrivals at the same instant: the order they were scheduled.
    scheduled: u64,
}

/// Something reaching end `side` of `link` at `at`.
struct Arrival {
    at: Instant,
    order: u64,
    link: Weak<RefCell<Link>>,
    side: usize,
}

impl PartialEq for Arrival {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl Eq for Arrival {}

impl PartialOrd for Arrival {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Arrival {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// A shared handle on the network.
pub(crate) type SharedNet = Rc<RefCell<Net>>;

struct NetHost {
    name: String,
    /// Which start of the host's software is running; `None` while it is down.
    running: Option<u64>,
    listeners: Vec<(u16, Rc<RefCell<Backlog>>)>,
}

impl Net {
    /// A network whose latencies are drawn from `rng` between `min` and `max` (whole ms).
    pub(crate) fn new(rng: StdRng, min: Duration, max: Duration) -> Self {
        let min_ms = min.as_millis() as u64;
        let max_ms = (max.as_millis() as u64).max(min_ms);
        Self {
            rng,
            min_ms,
            max_ms,
            hosts: Vec::new(),
            cuts: Vec::new(),
            links: Vec::new(),
            arrivals: BinaryHeap::new(),
            scheduled: 0,
        }
    }

    /// Wakes the reader of end `side` of `link` at `at`.
    fn schedule(&mut self, at: Instant, link: &Rc<RefCell<Link>>, side: usize) {
        self.scheduled += 1;
        let order = self.scheduled;
        self.arrivals.push(Reverse(Arrival { at, order, link: Rc::downgrade(link), side }));
    }

    /// When the next scheduled arrival is due.
    pub(crate) fn next_arrival(&self) -> Option<Instant> {
        self.arrivals.peek().map(|Reverse(a)| a.at)
    }

    /// Wakes the readers of every arrival due by `now`, earliest first (the order scheduled
    /// among arrivals at one instant).
    pub(crate) fn deliver_due(&mut self, now: Instant) {
        while self.arrivals.peek().is_some_and(|Reverse(a)| a.at <= now) {
            let Some(Reverse(arrival)) = self.arrivals.pop() else { break };
            if let Some(link) = arrival.link.upgrade() {
                link.borrow_mut().pipes[arrival.side].wake();
            }
        }
    }

    pub(crate) fn add_host(&mut self, name: &str) -> HostId {
        self.hosts.push(NetHost { name: name.to_owned(), running: None, listeners: Vec::new() });
        HostId(self.hosts.len() - 1)
    }

    pub(crate) fn lookup(&self, name: &str) -> Option<HostId> {
        self.hosts.iter().position(|h| h.name == name).map(HostId)
    }

    /// Marks `host` running its `start`-th software start.
    pub(crate) fn started(&mut self, host: HostId, start: u64) {
        self.hosts[host.0].running = Some(start);
    }

    /// Marks `host` down: its connections now answer resets and its listeners are gone.
    pub(crate) fn stopped(&mut self, host: HostId) {
        self.hosts[host.0].running = None;
        self.hosts[host.0].listeners.clear();
    }

    fn alive(&self, host: HostId, start: u64) -> bool {
        self.hosts[host.0].running == Some(start)
    }

    fn latency(&mut self) -> Duration {
        Duration::from_millis(if self.max_ms > self.min_ms {
            self.rng.random_range(self.min_ms..=self.max_ms)
        } else {
            self.min_ms
        })
    }

    fn is_cut(&self, a: HostId, b: HostId) -> bool {
        let pair = if a <= b { (a, b) } else { (b, a) };
        self.cuts.contains(&pair)
    }

    /// Cuts `a` from `b`: what is in flight between them is lost.
    pub(crate) fn cut(&mut self, a: HostId, b: HostId) {
        if self.is_cut(a, b) {
            return;
        }
        self.cuts.push(if a <= b { (a, b) } else { (b, a) });
        let now = now_instant();
        self.links.retain(|l| l.strong_count() > 0);
        for link in self.links.iter().filter_map(Weak::upgrade) {
            let mut link = link.borrow_mut();
            let [x, y] = link.hosts;
            if (x, y) == (a, b) || (x, y) == (b, a) {
                for pipe in &mut link.pipes {
                    pipe.lose_in_flight(now);
                }
            }
        }
    }

    /// Records a new connection, for cutting it later; forgets closed ones now and then.
    fn opened(&mut self, link: &Rc<RefCell<Link>>) {
        if self.links.len() >= 1024 && self.links.len().is_power_of_two() {
            self.links.retain(|l| l.strong_count() > 0);
        }
        self.links.push(Rc::downgrade(link));
    }

    /// Repairs the link between `a` and `b`; what was lost stays lost.
    pub(crate) fn repair(&mut self, a: HostId, b: HostId) {
        let pair = if a <= b { (a, b) } else { (b, a) };
        self.cuts.retain(|c| *c != pair);
    }
}

/// A message: any value a host sends.
pub type Message = Box<dyn Any>;

enum Msg {
    Data(Message),
    Fin,
}

/// One direction of a connection: what is in flight or arrived unread, toward one end.
struct Pipe {
    queue: VecDeque<(Instant, Msg)>,
    /// When the last message sent this way arrives (the next may not arrive before it).
    last_due: Option<Instant>,
    /// A message this way was lost: nothing more arrives.
    stalled: bool,
    /// When a reset reaches this end.
    reset_at: Option<Instant>,
    /// This end read the end of stream.
    eof: bool,
    /// The task reading this end.
    reader: Option<Waker>,
}

impl Pipe {
    fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            last_due: None,
            stalled: false,
            reset_at: None,
            eof: false,
            reader: None,
        }
    }

    fn wake(&mut self) {
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }

    fn lose_in_flight(&mut self, now: Instant) {
        let before = self.queue.len();
        self.queue.retain(|(due, _)| *due <= now);
        if self.queue.len() != before {
            self.stalled = true;
            self.wake();
        }
    }

    fn reset(&mut self, at: Instant) {
        self.reset_at = Some(self.reset_at.map_or(at, |r| r.min(at)));
    }
}

/// A connection: its two ends' hosts and software starts, open flags and directions
/// (`pipes[i]` carries messages toward end `i`).
struct Link {
    hosts: [HostId; 2],
    starts: [u64; 2],
    open: [bool; 2],
    pipes: [Pipe; 2],
}

/// One end of a connection, owned by a task of its host. Dropped (closed, or its process
/// crashed), it sends a FIN, or a reset when messages toward it were unread.
pub struct Stream {
    net: SharedNet,
    link: Rc<RefCell<Link>>,
    side: usize,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Stream {
    fn reset_error() -> io::Error {
        io::Error::new(io::ErrorKind::ConnectionReset, "connection reset by peer")
    }

    /// Sends one message. It arrives after a latency, or never (a cut), or is answered with a
    /// reset (the peer's process is gone); an error only when this end was reset already.
    pub fn send(&mut self, msg: Message) -> io::Result<()> {
        let now = now_instant();
        let mut net = self.net.borrow_mut();
        let mut link = self.link.borrow_mut();
        let (me, peer) = (self.side, 1 - self.side);
        if link.pipes[me].reset_at.is_some_and(|r| r <= now) {
            return Err(Self::reset_error());
        }
        let (from, to) = (link.hosts[me], link.hosts[peer]);
        if link.pipes[peer].stalled || net.is_cut(from, to) {
            link.pipes[peer].stalled = true;
            return Ok(());
        }
        let latency = net.latency();
        let gone = !link.open[peer] || !net.alive(to, link.starts[peer]);
        let pipe = &mut link.pipes[peer];
        let due = pipe.last_due.map_or(now + latency, |last| last.max(now + latency));
        pipe.last_due = Some(due);
        if gone {
            let back = due + net.latency();
            link.pipes[me].reset(back);
            net.schedule(back, &self.link, me);
            return Ok(());
        }
        pipe.queue.push_back((due, Msg::Data(msg)));
        net.schedule(due, &self.link, peer);
        Ok(())
    }

    /// Receives the next message: `None` at the end of stream, an error after a reset.
    pub fn recv(&mut self) -> impl Future<Output = io::Result<Option<Message>>> + '_ {
        std::future::poll_fn(move |cx| self.poll_recv(cx, None))
    }

    /// [`Stream::recv`], or a `TimedOut` error once `limit` has passed with nothing to read:
    /// `tokio::time::timeout` around `recv`, with one timer instead of two.
    pub fn recv_within(
        &mut self,
        limit: Duration,
    ) -> impl Future<Output = io::Result<Option<Message>>> + '_ {
        let deadline = now_instant() + limit;
        std::future::poll_fn(move |cx| self.poll_recv(cx, Some(deadline)))
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        deadline: Option<Instant>,
    ) -> Poll<io::Result<Option<Message>>> {
        loop {
            let now = now_instant();
            let wait_until = {
                let mut link = self.link.borrow_mut();
                let pipe = &mut link.pipes[self.side];
                if pipe.queue.front().is_some_and(|(due, _)| *due <= now) {
                    let Some((_, msg)) = pipe.queue.pop_front() else { unreachable!() };
                    return Poll::Ready(Ok(match msg {
                        Msg::Data(msg) => Some(msg),
                        Msg::Fin => {
                            pipe.eof = true;
                            None
                        }
                    }));
                }
                if pipe.reset_at.is_some_and(|r| r <= now) {
                    return Poll::Ready(Err(Self::reset_error()));
                }
                if pipe.eof {
                    return Poll::Ready(Ok(None));
                }
                if deadline.is_some_and(|d| d <= now) {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "timed out")));
                }
                if !pipe.reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    pipe.reader = Some(cx.waker().clone());
                }
                // Messages, FINs and resets wake the reader when they arrive (the network's
                // schedule); only a deadline of the reader's own needs a timer.
                deadline
            };
            let Some(at) = wait_until else { return Poll::Pending };
            let sleep = match &mut self.sleep {
                Some(s) => {
                    if s.deadline() != at {
                        s.as_mut().reset(at);
                    }
                    s
                }
                None => self.sleep.insert(Box::pin(tokio::time::sleep_until(at))),
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let now = now_instant();
        let mut net = self.net.borrow_mut();
        let mut link = self.link.borrow_mut();
        let (me, peer) = (self.side, 1 - self.side);
        link.open[me] = false;
        let (from, to) = (link.hosts[me], link.hosts[peer]);
        let cut = net.is_cut(from, to);
        // Closing a socket with unread or in-flight messages toward it answers a reset;
        // otherwise the kernel sends a FIN, whether the process closed it or died.
        if let Some((due, _)) = link.pipes[me].queue.front() {
            let back = (*due).max(now) + net.latency();
            link.pipes[me].queue.clear();
            if !cut {
                link.pipes[peer].reset(back);
                net.schedule(back, &self.link, peer);
            }
            return;
        }
        if link.pipes[peer].stalled || cut {
            link.pipes[peer].stalled = true;
            return;
        }
        let latency = net.latency();
        let pipe = &mut link.pipes[peer];
        let due = pipe.last_due.map_or(now + latency, |last| last.max(now + latency));
        pipe.last_due = Some(due);
        pipe.queue.push_back((due, Msg::Fin));
        net.schedule(due, &self.link, peer);
    }
}

/// A connection waiting in a listener's backlog.
struct Pending {
    from: HostId,
    start: u64,
    answer: tokio::sync::oneshot::Sender<Rc<RefCell<Link>>>,
}

struct Backlog {
    queue: VecDeque<Pending>,
    acceptor: Option<Waker>,
}

/// A listening socket of the current host.
pub struct Listener {
    net: SharedNet,
    host: HostId,
    start: u64,
    backlog: Rc<RefCell<Backlog>>,
}

impl Listener {
    /// Listens on `port` of the current host.
    pub fn bind(port: u16) -> io::Result<Self> {
        let (net, host, start) = current_host();
        let backlog = Rc::new(RefCell::new(Backlog { queue: VecDeque::new(), acceptor: None }));
        {
            let mut n = net.borrow_mut();
            let listeners = &mut n.hosts[host.0].listeners;
            if listeners.iter().any(|(p, _)| *p == port) {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("port {port}")));
            }
            listeners.push((port, backlog.clone()));
        }
        Ok(Self { net, host, start, backlog })
    }

    /// The next connection.
    pub async fn accept(&self) -> io::Result<Stream> {
        loop {
            let pending = std::future::poll_fn(|cx| {
                let mut b = self.backlog.borrow_mut();
                match b.queue.pop_front() {
                    Some(p) => Poll::Ready(p),
                    None => {
                        b.acceptor = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            })
            .await;
            if pending.answer.is_closed() {
                continue;
            }
            let link = Rc::new(RefCell::new(Link {
                hosts: [self.host, pending.from],
                starts: [self.start, pending.start],
                open: [true, true],
                pipes: [Pipe::new(), Pipe::new()],
            }));
            self.net.borrow_mut().opened(&link);
            let stream = Stream { net: self.net.clone(), link: link.clone(), side: 0, sleep: None };
            if pending.answer.send(link).is_ok() {
                return Ok(stream);
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut net = self.net.borrow_mut();
        if let Some(h) = net.hosts.get_mut(self.host.0) {
            h.listeners.retain(|(_, b)| !Rc::ptr_eq(b, &self.backlog));
        }
    }
}

/// Connects the current host to `port` on the host named `host`. Across a cut it waits
/// forever (the caller's timeout ends it); with no listener there it is refused.
pub async fn connect(host: &str, port: u16) -> io::Result<Stream> {
    let (net, me, start) = current_host();
    let (to, syn) = {
        let mut n = net.borrow_mut();
        let Some(to) = n.lookup(host) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no host {host}")));
        };
        (to, n.latency())
    };
    tokio::time::sleep(syn).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let arrived = {
        let n = net.borrow();
        if n.is_cut(me, to) {
            None
        } else {
            let bound = n.hosts[to.0].listeners.iter().find(|(p, _)| *p == port);
            Some(match bound {
                Some((_, backlog)) => {
                    let mut b = backlog.borrow_mut();
                    b.queue.push_back(Pending { from: me, start, answer: tx });
                    if let Some(w) = b.acceptor.take() {
                        w.wake();
                    }
                    false
                }
                None => true,
            })
        }
    };
    // A SYN lost to a cut is never answered.
    let Some(refused) = arrived else { return std::future::pending().await };
    let back = net.borrow_mut().latency();
    if refused {
        tokio::time::sleep(back).await;
        return Err(io::Error::new(io::ErrorKind::ConnectionRefused, format!("{host}:{port}")));
    }
    let link = rx.await.map_err(|_| {
        io::Error::new(io::ErrorKind::ConnectionRefused, format!("{host}:{port} went away"))
    })?;
    // The end exists from the accept on: dropped while the answer travels, it closes.
    let stream = Stream { net: net.clone(), link, side: 1, sleep: None };
    tokio::time::sleep(back).await;
    if net.borrow().is_cut(me, to) {
        return std::future::pending().await;
    }
    Ok(stream)
}
