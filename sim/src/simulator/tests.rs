//! What the simulator and its network promise the hosts: each test states one rule and fails
//! when the simulator breaks it.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use turmoil_net::shim::tokio::net::{TcpListener, TcpStream};

use super::{elapsed, Builder, HostFuture, Sim};

const PORT: u16 = 9;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

type Log = Rc<RefCell<Vec<(Duration, String)>>>;

/// A server that logs each line it reads (with the time) and how each connection ended.
fn recorder(log: Log) -> impl Fn() -> HostFuture {
    move || {
        let log = log.clone();
        Box::pin(async move {
            let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
            loop {
                let (stream, _) = listener.accept().await?;
                let log = log.clone();
                tokio::task::spawn_local(async move {
                    let mut lines = BufReader::new(stream).lines();
                    loop {
                        let what = match lines.next_line().await {
                            Ok(Some(line)) => line,
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

/// A server that accepts connections and holds them, reading nothing.
fn holder() -> impl Fn() -> HostFuture {
    || {
        Box::pin(async move {
            let listener = TcpListener::bind(("0.0.0.0", PORT)).await?;
            let mut held = Vec::new();
            loop {
                held.push(listener.accept().await?.0);
            }
        })
    }
}

fn sim(min: u64, max: u64) -> Sim {
    Builder::new(3).latency(ms(min), ms(max)).build()
}

#[test]
fn bytes_arrive_in_order_within_the_latency_bounds() {
    let mut sim = sim(1, 20);
    let log = Log::default();
    sim.host("server", recorder(log.clone()));
    let sent = Rc::new(RefCell::new(Vec::new()));
    let sent_by_client = sent.clone();
    let client = async move {
        let mut stream = TcpStream::connect(("server", PORT)).await?;
        for i in 0..200 {
            sent_by_client.borrow_mut().push(elapsed());
            stream.write_all(format!("m{i}\n").as_bytes()).await?;
            tokio::time::sleep(ms(1)).await;
        }
        tokio::time::sleep(ms(100)).await;
        Ok(())
    };
    sim.run_client("client", client, ms(10_000)).expect("runs");
    let log = log.borrow();
    let sent = sent.borrow();
    assert_eq!(log.len(), 200, "every line arrived: {log:?}");
    let mut latencies = std::collections::BTreeSet::new();
    for (i, (at, what)) in log.iter().enumerate() {
        assert_eq!(what, &format!("m{i}"), "in the order sent");
        let latency = *at - sent[i];
        assert!(latency >= ms(1) && latency <= ms(20), "line {i} arrived after {latency:?}");
        latencies.insert(latency);
    }
    // Sent a millisecond apart with latencies this varied, the segments would overtake each
    // other (and TCP here drops a segment that comes early) if the network did not hold them
    // in order.
    assert!(latencies.len() >= 5, "latencies vary: {latencies:?}");
}

#[test]
fn a_cut_loses_what_is_in_flight_and_the_connection_stays_silent_after_repair() {
    let mut sim = sim(5, 5);
    let log = Log::default();
    sim.host("server", recorder(log.clone()));
    let outcome = Rc::new(RefCell::new(Vec::new()));
    let seen = outcome.clone();
    sim.host("client", move || {
        let seen = seen.clone();
        Box::pin(async move {
            let mut stream = TcpStream::connect(("server", PORT)).await?;
            stream.write_all(b"m-before\n").await?;
            tokio::time::sleep(ms(100)).await;
            stream.write_all(b"m-lost\n").await?;
            tokio::time::sleep(ms(1_000)).await;
            stream.write_all(b"m-after-repair\n").await?;
            let mut buf = [0; 8];
            let read = tokio::time::timeout(ms(500), stream.read(&mut buf)).await;
            seen.borrow_mut().push(format!("{:?}", read.map(|r| r.map_err(|e| e.kind()))));
            // A new connection after the repair gets through.
            let mut fresh = TcpStream::connect(("server", PORT)).await?;
            fresh.write_all(b"m-fresh\n").await?;
            tokio::time::sleep(ms(50)).await;
            Ok(())
        })
    });
    // The second line is sent at 110 ms (the handshake takes 10 ms) and cut in flight.
    sim.run_until(ms(112), || false).expect("runs");
    sim.partition("client", "server");
    sim.run_until(ms(600), || false).expect("runs");
    sim.repair("client", "server");
    sim.run_until(ms(3_000), || false).expect("runs");
    let arrived: Vec<String> = log.borrow().iter().map(|(_, w)| w.clone()).collect();
    // The fresh connection's clean close is the one end of stream.
    assert_eq!(arrived, ["m-before", "m-fresh", "eof"], "nothing after the lost segment arrives");
    assert_eq!(*outcome.borrow(), ["Err(Elapsed(()))"]);
}

#[test]
fn a_crashed_process_closes_its_connections_as_a_kernel_does() {
    let mut sim = sim(2, 2);
    sim.host("quiet", recorder(Log::default()));
    sim.host("full", holder());
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    sim.host("client", move || {
        let log = log.clone();
        Box::pin(async move {
            let mut clean = TcpStream::connect(("quiet", PORT)).await?;
            let mut unread = TcpStream::connect(("full", PORT)).await?;
            // The holder never reads this: its crash must reset the connection.
            unread.write_all(b"m-unread\n").await?;
            let mut buf = [0; 8];
            let read = clean.read(&mut buf).await.map_err(|e| e.kind());
            log.borrow_mut().push((elapsed(), format!("quiet: {read:?}")));
            let read = unread.read(&mut buf).await.map_err(|e| e.kind());
            log.borrow_mut().push((elapsed(), format!("full: {read:?}")));
            Ok(())
        })
    });
    sim.run_until(ms(50), || false).expect("runs");
    sim.crash("quiet");
    sim.crash("full");
    sim.run_until(ms(100), || false).expect("runs");
    assert_eq!(
        *seen.borrow(),
        [(ms(52), "quiet: Ok(0)".to_owned()), (ms(52), "full: Err(ConnectionReset)".to_owned())],
        "an end of stream one latency after the crash, or a reset where data lay unread"
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
            let cut = tokio::time::timeout(ms(1_000), TcpStream::connect(("server", PORT))).await;
            log.borrow_mut()
                .push(format!("{:?}", cut.map(|r| r.map(|_| ()).map_err(|e| e.kind()))));
            let refused =
                TcpStream::connect(("idle", PORT)).await.map(|_| ()).map_err(|e| e.kind());
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

#[test]
fn hosts_that_wake_each_other_forever_fail_the_run_naming_one() {
    let mut sim = sim(1, 1);
    sim.host("spinner", || {
        Box::pin(async {
            loop {
                tokio::task::yield_now().await;
            }
        })
    });
    let err = sim.run_until(ms(10), || false).expect_err("a livelock fails the run");
    assert!(err.contains("host spinner was polled"), "{err}");
}

#[test]
fn a_panic_in_any_host_task_fails_the_run() {
    let mut sim = sim(1, 1);
    sim.host("faulty", || {
        Box::pin(async {
            tokio::time::sleep(ms(5)).await;
            tokio::task::spawn_local(async { panic!("a bug in a host task") });
            std::future::pending().await
        })
    });
    let err = sim.run_until(ms(100), || false).expect_err("a panic fails the run");
    assert!(err.contains("host faulty panicked: a bug in a host task"), "{err}");
}

#[test]
fn a_task_spawned_onto_the_shared_runtime_fails_the_run() {
    let mut sim = sim(1, 1);
    sim.host("leaky", || {
        Box::pin(async {
            tokio::time::sleep(ms(5)).await;
            drop(tokio::spawn(std::future::pending::<()>()));
            std::future::pending().await
        })
    });
    let err = sim.run_until(ms(100), || false).expect_err("an escaped task fails the run");
    assert!(err.contains("host leaky spawned a task onto the shared runtime"), "{err}");
}

#[test]
fn a_crash_ends_every_task_of_the_host() {
    let mut sim = sim(1, 1);
    let ticks = Rc::new(RefCell::new(0u32));
    let counted = ticks.clone();
    sim.host("worker", move || {
        let counted = counted.clone();
        Box::pin(async move {
            tokio::task::spawn_local(async move {
                loop {
                    tokio::time::sleep(ms(1)).await;
                    *counted.borrow_mut() += 1;
                }
            });
            std::future::pending().await
        })
    });
    sim.run_until(ms(10), || false).expect("runs");
    sim.crash("worker");
    let at_crash = *ticks.borrow();
    sim.run_until(ms(100), || false).expect("runs");
    assert_eq!(*ticks.borrow(), at_crash, "nothing of the crashed host runs on");
}
