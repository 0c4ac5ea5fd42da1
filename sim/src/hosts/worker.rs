//! The worker host: the production worker loop ([`keyorder::worker::run`]) with the
//! simulation's store client ([`super::store_client`]), production's HTTP deliverer
//! ([`super::deliverer`]), and a clock that reads simulated time (offset by the worker's clock
//! skew).

use std::rc::Rc;
use std::time::Duration;

use keyorder::worker::{self, WorkerConfig};

use super::clock::SimClock;
use super::deliverer;
use super::store_client::{ClientBreaks, ExpiryClient, SimStore};
use crate::control::SharedControl;
use crate::trace::{now, SharedRecorder};

/// Writes the worker's own view of its leases into the trace (the store's view is there too):
/// a lost lease shows the error that told the worker.
fn trace_observer(name: Rc<str>, rec: SharedRecorder) -> worker::Observer {
    worker::Observer(Rc::new(move |e: &worker::WorkerEvent| {
        use worker::WorkerEvent as E;
        let mut rec = rec.borrow_mut();
        match e {
            E::Acquired { partition, epoch } => {
                rec.log(now(), &name, format_args!("leased p{partition} epoch {epoch}"))
            }
            E::Released { partition, .. } => {
                rec.log(now(), &name, format_args!("gave back p{partition}"))
            }
            E::Lost { partition, error, .. } => {
                rec.log(now(), &name, format_args!("lost p{partition}: {error}"))
            }
            E::StoreUnavailable { error } => {
                rec.log(now(), &name, format_args!("store unavailable: {error}"))
            }
            _ => {}
        }
    }))
}

/// Everything a worker host is built from: its configuration and the run's shared planes.
#[derive(Clone)]
pub struct WorkerHost {
    /// The production worker's configuration.
    pub config: WorkerConfig,
    /// The configuration plane.
    pub control: SharedControl,
    /// The run's recorder.
    pub rec: SharedRecorder,
    /// Store request timeout.
    pub request_timeout: Duration,
    /// The broken designs of the store client.
    pub client_breaks: ClientBreaks,
    /// `parallel-in-partition` or `timeout-leaves-call-running`.
    pub delivery_break: Option<deliverer::DeliveryBreak>,
    /// The worker's clock.
    pub clock: SimClock,
    /// Expiry leases; `None`: session locks.
    pub expiry: Option<ExpiryClient>,
}

impl WorkerHost {
    /// The host factory: a restart builds everything anew from the configuration.
    pub fn factory(self) -> impl Fn() -> crate::simulator::HostFuture {
        move || {
            let this = self.clone();
            Box::pin(async move {
                let name: Rc<str> = this.config.name.as_str().into();
                this.rec.borrow_mut().log(now(), &name, format_args!("starts"));
                let mut config = this.config.clone();
                config.observer = Some(trace_observer(name.clone(), this.rec.clone()));
                // A new process: a new client, nothing buffered survives a crash.
                let store = SimStore::new(
                    &name,
                    this.control.clone(),
                    this.request_timeout,
                    this.clock,
                    this.expiry,
                )
                .with_breaks(this.client_breaks);
                let http = deliverer::http_deliverer(this.request_timeout);
                let deliver = deliverer::BrokenDelivery::new(
                    deliverer::Recorded::new(http, name, this.rec.clone()),
                    this.delivery_break,
                );

                worker::run(store, deliver, this.clock, config, std::future::pending()).await;
                Ok(())
            })
        }
    }
}
