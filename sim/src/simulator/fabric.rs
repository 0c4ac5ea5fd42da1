//! The wire between simulated hosts: turmoil-net's fabric, driven by the simulator's clock.
//!
//! turmoil-net's kernels (one per host) run TCP: handshakes, FIN and RST, windows. The fabric
//! itself is clock-free, so this module is the harness that moves packets through time:
//! [`Fabric::egress`] drains every host's outbound packets and asks the installed [`Rule`]s
//! what to do with each, and [`Fabric::deliver_due`] hands each packet to its destination's
//! kernel once its time has come. Two rules are installed for the life of a run:
//!
//! - [`CutRule`]: packets between two hosts that are cut off from each other are dropped. A
//!   cut also loses what was already in flight between them (checked again at arrival).
//! - [`LatencyRule`]: every packet is delayed by a latency drawn from the run's seed in whole
//!   milliseconds between the bounds, never overtaking an earlier packet between the same two
//!   hosts (TCP's receiver here takes segments strictly in order).
//!
//! Retransmission is off (turmoil-net counts retransmit timeouts in egress passes, not time,
//! and the simulator's passes follow the hosts' activity): a segment lost to a cut is never
//! sent again, so a connection that lost one stalls for good and its owner's timeout ends it,
//! and a connection attempted across a cut is never answered.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;
use turmoil_net::{EnterGuard, KernelConfig, Packet, Rule, Verdict};

/// The kernels' settings: turmoil-net's defaults, with retransmission off (see the module
/// docs). `retx_threshold` counts egress passes without progress; no run makes this many.
pub(crate) fn kernel_config() -> KernelConfig {
    KernelConfig::default().retx_threshold(u32::MAX).retx_max(u32::MAX)
}

/// Pairs of hosts cut off from each other, by address, each pair smaller address first.
pub(crate) type SharedCuts = Rc<RefCell<BTreeSet<(IpAddr, IpAddr)>>>;

fn pair(a: IpAddr, b: IpAddr) -> (IpAddr, IpAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

/// Drops every packet between two hosts that are cut off from each other.
pub(crate) struct CutRule {
    pub(crate) cuts: SharedCuts,
}

impl Rule for CutRule {
    fn on_packet(&mut self, pkt: &Packet) -> Verdict {
        if self.cuts.borrow().contains(&pair(pkt.src, pkt.dst)) {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }
}

/// Delays every packet by a seeded latency, in order between each two hosts.
pub(crate) struct LatencyRule {
    pub(crate) rng: StdRng,
    pub(crate) min_ms: u64,
    pub(crate) max_ms: u64,
    /// The simulated clock, as of the egress pass that asks.
    pub(crate) now: Rc<Cell<Instant>>,
    /// The latest arrival scheduled from each host to each other.
    pub(crate) last_due: BTreeMap<(IpAddr, IpAddr), Instant>,
}

impl Rule for LatencyRule {
    fn on_packet(&mut self, pkt: &Packet) -> Verdict {
        let now = self.now.get();
        let drawn = Duration::from_millis(self.rng.random_range(self.min_ms..=self.max_ms));
        let last = self.last_due.entry((pkt.src, pkt.dst)).or_insert(now);
        let due = (*last).max(now + drawn);
        *last = due;
        Verdict::Deliver(due - now)
    }
}

/// A packet on its way, ordered by arrival and then by when it was sent.
struct InFlight {
    due: Instant,
    order: u64,
    packet: Packet,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.order) == (other.due, other.order)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.due, self.order).cmp(&(other.due, other.order))
    }
}

/// The packets in flight and the buffer egress drains into.
pub(crate) struct Fabric {
    in_flight: BinaryHeap<Reverse<InFlight>>,
    next_order: u64,
    egress: Vec<Packet>,
    cuts: SharedCuts,
    now: Rc<Cell<Instant>>,
}

impl Fabric {
    /// A fabric with nothing in flight, sharing the cut set and the clock with its rules.
    pub(crate) fn new(cuts: SharedCuts, now: Rc<Cell<Instant>>) -> Self {
        Fabric {
            in_flight: BinaryHeap::new(),
            next_order: 0,
            egress: Vec::with_capacity(64),
            cuts,
            now,
        }
    }

    /// The earliest arrival still to come.
    pub(crate) fn next_arrival(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse(p)| p.due)
    }

    /// Hands every packet due by `now` to its destination's kernel (which wakes the readers),
    /// dropping those whose hosts were cut off from each other since they left. Returns whether
    /// any packet arrived.
    pub(crate) fn deliver_due(&mut self, guard: &EnterGuard, now: Instant) -> bool {
        let mut any = false;
        while self.in_flight.peek().is_some_and(|Reverse(p)| p.due <= now) {
            let Some(Reverse(p)) = self.in_flight.pop() else { break };
            if self.cuts.borrow().contains(&pair(p.packet.src, p.packet.dst)) {
                continue;
            }
            guard.deliver(p.packet);
            any = true;
        }
        any
    }

    /// Drains every host's outbound packets and routes each as the rules say: dropped,
    /// delivered now, or scheduled. Returns whether any packet left a host.
    pub(crate) fn egress(&mut self, guard: &EnterGuard, now: Instant) -> bool {
        self.now.set(now);
        let mut any = false;
        loop {
            guard.egress_all(&mut self.egress);
            if self.egress.is_empty() {
                return any;
            }
            any = true;
            let mut immediate = false;
            for packet in self.egress.drain(..) {
                match guard.evaluate(&packet) {
                    Verdict::Drop => {}
                    Verdict::Pass => {
                        guard.deliver(packet);
                        immediate = true;
                    }
                    Verdict::Deliver(d) if d.is_zero() => {
                        guard.deliver(packet);
                        immediate = true;
                    }
                    Verdict::Deliver(d) => {
                        let order = self.next_order;
                        self.next_order += 1;
                        self.in_flight.push(Reverse(InFlight { due: now + d, order, packet }));
                    }
                }
            }
            // A packet delivered at once may have made its kernel answer (an ACK, a RST).
            if !immediate {
                return any;
            }
        }
    }
}
