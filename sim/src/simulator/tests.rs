//! What the simulated network promises the hosts: each test states one rule and fails when the
//! network breaks it.

use std::cell::RefCell;
use std::io::ErrorKind;
use std::rc::Rc;
use std::time::Duration;

use super::net::{connect, Listener};
use super::{elapsed, Builder, HostFuture, Sim};

const PORT: u16 = 9;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

type Log = Rc<RefCell<Vec<(Duration, String)>>>;

/// A server that logs each message it reads (with the time) and each end of its streams.
fn recorder(log: Log) -> impl Fn() -> HostFuture {
    move || {
        let log = log.clone();
        Box::pin(async move {
            let listener = Listener::bind(PORT)?;
            loop {
                let mut stream = listener.accept().await?;
                let log = log.clone();
                tokio::task::spawn_local(async move {
                    loop {
                        let what = match stream.recv().await {
                            Ok(Some(msg)) => *msg.downcast::<String>().expect("a string"),
                            Ok(None) => "eof".to_owned(),
                            Err(e) => format!("error {:?}", e.kind()),
                        };
                        let end = !what.starts_with('m');
                        log.borrow_mut().push((elapsed(), what));
                        if end {
                            return;
                        }
                    }
                });
            }
        })
    }
}

fn sim(min: u64, max: u64) -> Sim {
    Builder::new(3).latency(ms(min), ms(max)).build()
}

#[test]
fn messages_arrive_in_order_within_the_latency_bounds() {
    let mut sim = sim(1, 20);
    let log = Log::default();
    sim.host("server", recorder(log.clone()));
    let sent = Rc::new(RefCell::new(Vec::new()));
    let sent_by_client = sent.clone();
    let client = async move {
        let mut stream = connect("server", PORT).await?;
        for i in 0..200 {
            sent_by_client.borrow_mut().push(elapsed());
            stream.send(Box::new(format!("m{i}")))?;
            if i % 3 == 0 {
                tokio::time::sleep(ms(1)).await;
            }
        }
        tokio::time::sleep(ms(100)).await;
        Ok(())
    };
    sim.run_client("client", client, ms(10_000)).expect("runs");
    let log = log.borrow();
    let sent = sent.borrow();
    assert_eq!(log.len(), 200, "every message arrived: {log:?}");
    let mut latencies = std::collections::BTreeSet::new();
    for (i, (at, what)) in log.iter().enumerate() {
        assert_eq!(what, &format!("m{i}"), "in the order sent");
        let latency = *at - sent[i];
        assert!(latency >= ms(1), "message {i} arrived after {latency:?}");
        if latency > ms(20) {
            // Only behind an earlier message that arrived at the same time.
            assert_eq!(*at, log[i - 1].0, "message {i} late for no reason");
        }
        latencies.insert(latency);
    }
    // Sent a millisecond or less apart with latencies this varied, the messages would
    // overtake each other if the network did not hold them in order.
    assert!(latencies.len() >= 5, "latencies vary: {latencies:?}");
}

#[test]
fn a_cut_loses_what_is_in_flight_and_the_stream_stays_silent_after_repair() {
    let mut sim = sim(5, 5);
    let log = Log::default();
    sim.host("server", recorder(log.clone()));
    let outcome = Rc::new(RefCell::new(None));
    let seen = outcome.clone();
    sim.host("client", move || {
        let seen = seen.clone();
        Box::pin(async move {
            let mut stream = connect("server", PORT).await?;
            stream.send(Box::new("m-before".to_owned()))?;
            tokio::time::sleep(ms(100)).await;
            stream.send(Box::new("m-lost".to_owned()))?;
            tokio::time::sleep(ms(1_000)).await;
            stream.send(Box::new("m-after-repair".to_owned()))?;
            let answer = stream.recv_within(ms(500)).await;
            *seen.borrow_mut() = Some(answer.map(|m| m.is_some()).map_err(|e| e.kind()));
            Ok(())
        })
    });
    // The second message is sent at 110 ms (connect takes 10 ms) and cut in flight.
    sim.run_until(ms(112), || false).expect("runs");
    sim.partition("client", "server");
    sim.run_until(ms(600), || false).expect("runs");
    sim.repair("client", "server");
    sim.run_until(ms(3_000), || false).expect("runs");
    let arrived: Vec<String> = log.borrow().iter().map(|(_, w)| w.clone()).collect();
    assert_eq!(arrived, ["m-before"], "nothing after the lost message arrives");
    assert_eq!(*outcome.borrow(), Some(Err(ErrorKind::TimedOut)));
}

#[test]
fn a_crashed_process_closes_its_connections() {
    let mut sim = sim(2, 2);
    sim.host("server", recorder(Log::default()));
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    sim.host("client", move || {
        let log = log.clone();
        Box::pin(async move {
            let mut stream = connect("server", PORT).await?;
            let read = stream.recv().await.map_err(|e| e.kind());
            log.borrow_mut().push((elapsed(), format!("{read:?}")));
            // Writing to the closed end is answered with a reset, a round trip later.
            stream.send(Box::new("m".to_owned()))?;
            tokio::time::sleep(ms(3)).await;
            let read = stream.recv().await.map_err(|e| e.kind());
            log.borrow_mut().push((elapsed(), format!("{read:?}")));
            tokio::time::sleep(ms(1)).await;
            let read = stream.recv().await.map_err(|e| e.kind());
            log.borrow_mut().push((elapsed(), format!("{read:?}")));
            let write = stream.send(Box::new("m".to_owned())).map_err(|e| e.kind());
            log.borrow_mut().push((elapsed(), format!("{write:?}")));
            Ok(())
        })
    });
    sim.run_until(ms(50), || false).expect("runs");
    sim.crash("server");
    sim.run_until(ms(100), || false).expect("runs");
    assert_eq!(
        *seen.borrow(),
        [
            (ms(52), "Ok(None)".to_owned()),
            (ms(55), "Ok(None)".to_owned()),
            (ms(56), "Err(ConnectionReset)".to_owned()),
            (ms(56), "Err(ConnectionReset)".to_owned()),
        ],
        "an end of stream one latency after the crash, a reset a round trip after the write"
    );
}

#[test]
fn a_connection_across_a_cut_is_never_answered_and_one_to_no_listener_is_refused() {
    let mut sim = sim(3, 3);
    sim.host("server", recorder(Log::default()));
    sim.host("idle", || Box::pin(std::future::pending()) as HostFuture);
    let results = Rc::new(RefCell::new(Vec::new()));
    let log = results.clone();
    sim.host("client", move || {
        let log = log.clone();
        Box::pin(async move {
            let cut = tokio::time::timeout(ms(1_000), connect("server", PORT)).await;
            log.borrow_mut()
                .push(format!("{:?}", cut.map(|r| r.map(|_| ()).map_err(|e| e.kind()))));
            let refused = connect("idle", PORT).await.map(|_| ()).map_err(|e| e.kind());
            log.borrow_mut().push(format!("{refused:?} at {:?}", elapsed()));
            Ok(())
        })
    });
    sim.partition("client", "server");
    sim.run_until(ms(2_000), || false).expect("runs");
    assert_eq!(
        *results.borrow(),
        ["Err(Elapsed(()))".to_owned(), "Err(ConnectionRefused) at 1.006s".to_owned()]
    );
}

#[test]
fn an_idle_host_is_polled_when_woken_not_every_millisecond() {
    let mut sim = sim(1, 1);
    sim.host("sleeper", || {
        Box::pin(async {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_secs(3_600)).await;
            }
            std::future::pending().await
        })
    });
    // A busy neighbour, woken every millisecond for a second, does not wake the sleeper.
    sim.host("ticker", || {
        Box::pin(async {
            for _ in 0..1_000 {
                tokio::time::sleep(ms(1)).await;
            }
            std::future::pending().await
        })
    });
    sim.run_until(Duration::from_secs(4 * 3_600), || false).expect("runs");
    assert_eq!(sim.elapsed(), Duration::from_secs(4 * 3_600));
    assert_eq!(sim.polls("sleeper"), Some(4), "the start and three timers");
    assert_eq!(sim.polls("ticker"), Some(1_001), "the start and a thousand timers");
}
