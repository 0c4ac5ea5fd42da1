//! SQLite's leases expire by the host's monotonic clock (`keyorder::store::sqlite::lease_clock`),
//! never by the wall clock: a worker whose wall clock runs a minute ahead (what a step of the
//! clock does to the process that sees it) takes no partition its holder still holds, and a
//! lease row written in another boot is free whatever its expiry says.

use std::time::{Duration, Instant};

use keyorder::check::{check, Kind};
use keyorder::store::Store;
use keyorder::PartitionId;

use super::conformance::Fixture;
use super::fixture::SqliteFixture;
use super::sigstop::{
    filled_queue, held_by, history, output, signal, two_endpoints, wait_until, work, work_with,
};

/// Where Debian's `faketime` package puts the library; `None` when it is not installed (or
/// hidden, [`crate::skip::hidden`]).
fn libfaketime() -> Option<&'static str> {
    if crate::skip::hidden("libfaketime") {
        return None;
    }
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
}

/// Worker `a` (the real clock) holds all 16 partitions and delivers; worker `b` starts with its
/// wall clock 60 s ahead (libfaketime; its monotonic clock untouched). By the wall clock every
/// lease of `a` has expired for `b`; by the lease clock none has. `b` must wait for its fair
/// share, which `a` hands back, and the checker must find no concurrent delivery, no reorder
/// and nothing lost. With expiry by the wall clock (schema version 8) `b` takes all 16 at once
/// while `a` still delivers, and the two never share.
#[test]
#[allow(clippy::disallowed_methods)] // the endpoints' clock is wall time
fn a_worker_whose_wall_clock_is_a_minute_ahead_takes_no_lease_still_held() {
    let Some(lib) = libfaketime() else {
        let needs = "libfaketime (Debian: apt-get install faketime)";
        crate::skip::skip(needs, "KEYORDER_REQUIRE_FAKETIME");
        return;
    };
    let dir = super::cli::TempDir::new("clock-step");
    let file = dir.path("q.db");
    let db = format!("sqlite:{}", file.display());
    let (c, events, enqueued) = filled_queue(&file, 40);
    let epoch = Instant::now();
    let (ea, eb) = two_endpoints(epoch, Duration::from_millis(20));
    let mut a = work(&db, &ea.url, "a");
    wait_until("a holds every partition and delivers", Duration::from_secs(20), || {
        held_by(&c, a.id()) == 16 && ea.arrivals().len() >= 20
    });
    let ahead = [("LD_PRELOAD", lib), ("FAKETIME", "+60s"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")];
    let mut b = work_with(&db, &eb.url, "b", &ahead);
    wait_until("a and b share the partitions", Duration::from_secs(20), || {
        held_by(&c, a.id()) == 8 && held_by(&c, b.id()) == 8
    });
    wait_until("the queue drains", Duration::from_secs(60), || {
        keyorder::store::sqlite::queue::depth(&c).unwrap() == 0
    });
    for w in [&a, &b] {
        signal(w, "-TERM");
    }
    let a_err = output(&mut a);
    let b_err = output(&mut b);
    let mut arrivals = ea.arrivals();
    arrivals.extend(eb.arrivals());
    arrivals.sort_by_key(|x| x.at);
    assert!(!eb.arrivals().is_empty(), "b delivered nothing");
    let verdict = check(&history(&enqueued, &arrivals, &c));
    assert!(verdict.is_ok(), "{verdict}\nA:\n{a_err}\nB:\n{b_err}");
    assert_eq!(verdict.count(Kind::Lost), 0);
    assert_eq!(verdict.events as usize, events.len());
    assert!(!a_err.contains("LOST partition"), "a lost a lease it held:\n{a_err}");
}

/// A lease row of another boot (a holder that died with the host) is free at once, however far
/// ahead its expiry lies; the same row written in this boot is held.
#[test]
fn a_lease_written_in_another_boot_is_free() {
    let fx = SqliteFixture::new("other-boot");
    let c = fx.conn();
    c.execute(
        "INSERT INTO keyorder_lease (partition, holder, epoch, expires_at, boot, clean)
         VALUES (0, 'ghost', 7, keyorder_clock() + 3600, 'a-boot-before-this-one', 0)",
        [],
    )
    .unwrap();
    let row = keyorder::store::sqlite::lease_row(&c, PartitionId(0)).unwrap().unwrap();
    assert!(row.expires_in < 0.0, "another boot's lease reads as unexpired: {}", row.expires_in);
    let store = fx.store();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let taken = rt.block_on(store.acquire(PartitionId(0))).unwrap();
    assert!(taken.is_some(), "a lease of another boot was taken for held");
    drop(taken);

    c.execute(
        "INSERT INTO keyorder_lease (partition, holder, epoch, expires_at, boot)
         VALUES (1, 'ghost', 9, keyorder_clock() + 3600, keyorder_boot())",
        [],
    )
    .unwrap();
    assert!(
        rt.block_on(store.acquire(PartitionId(1))).unwrap().is_none(),
        "a lease of this boot, unexpired, was taken"
    );
}
