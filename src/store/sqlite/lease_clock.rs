//! The clock SQLite's leases and memberships expire by: the host's monotonic clock, which every
//! process on the host reads alike and nothing can step, and the id of the boot it counts from.
//!
//! Expiry is not the wall clock (`unixepoch('subsec')`). A wall clock stepped forward (an NTP
//! step, a VM resumed, an operator's `date -s`) would make every other worker see a lease
//! expire early by the step, and a step larger than the clock-skew bound would let one take a
//! partition over while its holder was still delivering. `CLOCK_MONOTONIC` cannot be stepped, is the same for
//! every process on the host, and is the clock tokio's `Instant` reads, by which a holder judges
//! how long the lease it read lasts: the skew between the store's clock and the holder's is zero
//! by construction. SQLite needs a local file (its locking does not work across hosts), so every
//! process that shares a database shares the host's clock.
//!
//! A monotonic clock starts again at each boot, so a row's expiry only means something in the
//! boot that wrote it: each lease and membership row records its boot's id (`boot`), and a row
//! of another boot is expired whatever its `expires_at` says. Both are SQL functions registered
//! on every connection ([`register`]): `keyorder_clock()`, seconds of the monotonic clock, and
//! `keyorder_boot()`.
//!
//! Off Linux there is no boot id; the clock is the wall clock there, with the exposure above.

use std::sync::OnceLock;

use rusqlite::functions::FunctionFlags;
use rusqlite::Connection;

use crate::store::StoreError;

/// Seconds of the host's monotonic clock (Linux: `CLOCK_MONOTONIC`, what tokio's `Instant`
/// reads); elsewhere the wall clock's Unix seconds.
pub fn now() -> f64 {
    #[cfg(target_os = "linux")]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
    }
    #[cfg(not(target_os = "linux"))]
    {
        #[allow(clippy::disallowed_methods)] // the lease clock off Linux: the wall clock
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        since.map_or(0.0, |d| d.as_secs_f64())
    }
}

/// The id of the boot [`now`] counts from (Linux: `/proc/sys/kernel/random/boot_id`); `wall`
/// where the clock is the wall clock, which no boot restarts. Read once per process. Where
/// `/proc` cannot be read it is `unknown` for every process, so rows of an earlier boot are not
/// told apart: they then look held until this boot's clock passes their expiry (a stall,
/// never two holders).
pub fn boot() -> &'static str {
    static BOOT: OnceLock<String> = OnceLock::new();
    BOOT.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "unknown".to_owned())
        }
        #[cfg(not(target_os = "linux"))]
        {
            "wall".to_owned()
        }
    })
}

/// Registers `keyorder_clock()` ([`now`]) and `keyorder_boot()` ([`boot`]) on `conn`.
///
/// Both are flagged deterministic, which SQLite takes to mean "the same within one statement"
/// and evaluates once per execution of a statement, as its own `unixepoch('subsec')` is: every
/// comparison in one statement sees the same now, and a head read of 64 rows reads the clock
/// once, not three times a row.
pub(crate) fn register(conn: &Connection) -> Result<(), StoreError> {
    let once_a_statement = FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC;
    conn.create_scalar_function("keyorder_clock", 0, once_a_statement, |_| Ok(now()))?;
    conn.create_scalar_function("keyorder_boot", 0, once_a_statement, |_| Ok(boot()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_clock_is_this_process_clock_and_moves_forward() {
        let c = Connection::open_in_memory().unwrap();
        register(&c).unwrap();
        let before = now();
        let (sql, boot_id): (f64, String) = c
            .query_row("SELECT keyorder_clock(), keyorder_boot()", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        let after = now();
        assert!(before <= sql && sql <= after, "{before} {sql} {after}");
        assert_eq!(boot_id, boot());
        assert!(!boot_id.is_empty());
    }

    /// Read once per execution of a statement (one now for every row), and again at the next
    /// execution of the same prepared statement.
    #[test]
    fn the_clock_is_read_once_a_statement_and_anew_each_time_it_runs() {
        let c = Connection::open_in_memory().unwrap();
        register(&c).unwrap();
        let mut st = c
            .prepare(
                "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 20000)
                 SELECT count(DISTINCT keyorder_clock() + i * 0), max(keyorder_clock()) FROM r",
            )
            .unwrap();
        let read = |st: &mut rusqlite::Statement<'_>| -> (i64, f64) {
            st.query_row([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap()
        };
        let (distinct, first) = read(&mut st);
        assert_eq!(distinct, 1, "the clock was read more than once in one statement");
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (_, second) = read(&mut st);
        assert!(
            second >= first + 0.004,
            "the prepared statement kept its first now: {first} {second}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn on_linux_it_is_the_monotonic_clock_of_this_boot() {
        // Seconds since boot, far below the wall clock's Unix seconds (about 1.8e9).
        assert!(now() < 1.0e9, "{}", now());
        assert_eq!(boot().len(), 36, "{}", boot());
    }
}
