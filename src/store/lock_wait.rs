//! How long an admin operation may wait for a lock that the delivery path needs too, and what
//! it reports while it waits.
//!
//! On PostgreSQL a request for a strong table lock (an `ALTER TABLE` of a migration, the
//! `EXCLUSIVE` lock of a switch or a pin) waits behind every session that holds a conflicting
//! lock, and every later request for a lock on that table, however weak, queues behind it. An
//! operator's transaction left open on `delivery_queue` (an `idle in transaction` psql) would
//! keep `keyorder migrate` waiting, and with it every producer and worker, for as long as it
//! stays open. So such operations wait at most [`LockWait::attempt`] per try (PostgreSQL's
//! `lock_timeout`), give the queue back between tries, and after [`LockWait::attempts`] tries
//! fail with [`StoreError::LockBusy`](crate::store::StoreError::LockBusy), naming the sessions
//! that held the locks ([`LockHolder`]).

use std::fmt;
use std::time::Duration;

/// The bound on an admin operation's lock waits. The delivery path waits behind the operation
/// for at most [`LockWait::attempt`] at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockWait {
    /// How long one try waits for a lock (PostgreSQL's `lock_timeout`).
    pub attempt: Duration,
    /// The pause between two tries, in which the queue's own sessions take their locks.
    pub pause: Duration,
    /// Tries before the operation gives up (at least one).
    pub attempts: u32,
}

impl LockWait {
    /// Default time one try waits for a lock.
    pub const ATTEMPT: Duration = Duration::from_secs(1);
    /// Default pause between tries.
    pub const PAUSE: Duration = Duration::from_secs(1);
    /// Default total wait.
    pub const TOTAL: Duration = Duration::from_secs(60);

    /// Tries of [`LockWait::ATTEMPT`] with [`LockWait::PAUSE`] between them that together take
    /// about `total` (at least one try).
    pub fn within(total: Duration) -> Self {
        let per_try = Self::ATTEMPT + Self::PAUSE;
        let attempts = (total.as_millis() / per_try.as_millis()).clamp(1, u128::from(u32::MAX));
        Self { attempt: Self::ATTEMPT, pause: Self::PAUSE, attempts: attempts as u32 }
    }
}

impl Default for LockWait {
    fn default() -> Self {
        Self::within(Self::TOTAL)
    }
}

/// A session that held a lock an admin operation waited for, as the server saw it right after
/// the try gave up.
#[derive(Clone, Debug, PartialEq)]
pub struct LockHolder {
    /// The server process of the session (what `pg_terminate_backend` takes).
    pub pid: i32,
    /// The client's `application_name` (empty when it set none).
    pub application: String,
    /// The session's state: `idle in transaction`, `active`, ...
    pub state: String,
    /// How long its transaction has been open, if one is.
    pub in_transaction_for: Option<Duration>,
    /// Its last statement, shortened.
    pub query: String,
    /// What it holds: lock modes and the table (or `advisory`).
    pub holds: String,
}

impl fmt::Display for LockHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.pid)?;
        if !self.application.is_empty() {
            write!(f, " ({})", self.application)?;
        }
        write!(f, ", {}", self.state)?;
        if let Some(age) = self.in_transaction_for {
            write!(f, ", transaction open {} s", age.as_secs())?;
        }
        write!(f, ", holds {}", self.holds)?;
        if !self.query.is_empty() {
            write!(f, ", last statement: {}", self.query)?;
        }
        Ok(())
    }
}

/// Holders named in full in [`holders_text`]; the rest are counted.
const NAMED: usize = 5;

/// The holders as one line: the first few (oldest transaction first) `; `-separated, the rest
/// counted, or a note that they had gone.
pub fn holders_text(holders: &[LockHolder]) -> String {
    if holders.is_empty() {
        return "the sessions that held them had finished when looked at".into();
    }
    let mut text =
        holders.iter().take(NAMED).map(ToString::to_string).collect::<Vec<_>>().join("; ");
    if holders.len() > NAMED {
        text.push_str(&format!("; and {} more", holders.len() - NAMED));
    }
    text
}

/// One try that gave up waiting, reported while the operation tries again.
#[derive(Debug)]
pub struct LockWaitNotice<'a> {
    /// The operation (`migrate`, `switch`, `pin`).
    pub operation: &'static str,
    /// The try that gave up, from 1.
    pub attempt: u32,
    /// Tries in all.
    pub attempts: u32,
    /// Who held the locks.
    pub holders: &'a [LockHolder],
}

impl fmt::Display for LockWaitNotice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: waiting for locks other sessions hold (try {} of {}): {}",
            self.operation,
            self.attempt,
            self.attempts,
            holders_text(self.holders)
        )
    }
}

/// Receives each [`LockWaitNotice`] (the command line prints them).
pub type LockWaitReport = Box<dyn FnMut(&LockWaitNotice<'_>) + Send>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_splits_the_total_into_tries_and_never_below_one() {
        let w = LockWait::within(Duration::from_secs(60));
        assert_eq!(w.attempts, 30);
        assert_eq!(LockWait::within(Duration::ZERO).attempts, 1);
        assert_eq!(LockWait::within(Duration::from_secs(5)).attempts, 2);
    }

    #[test]
    fn a_holder_reads_as_what_an_operator_acts_on() {
        let h = LockHolder {
            pid: 4242,
            application: "psql".into(),
            state: "idle in transaction".into(),
            in_transaction_for: Some(Duration::from_secs(73)),
            query: "SELECT 1 FROM delivery_queue".into(),
            holds: "AccessShareLock on delivery_queue".into(),
        };
        assert_eq!(
            h.to_string(),
            "pid 4242 (psql), idle in transaction, transaction open 73 s, holds AccessShareLock \
             on delivery_queue, last statement: SELECT 1 FROM delivery_queue"
        );
        assert_eq!(holders_text(&[]), "the sessions that held them had finished when looked at");
        let many = vec![h.clone(); 7];
        assert!(holders_text(&many).ends_with("; and 2 more"));
        assert_eq!(holders_text(&many).matches("pid 4242").count(), 5);
    }
}
