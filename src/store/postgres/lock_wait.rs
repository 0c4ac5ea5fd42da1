//! Admin operations that take locks the delivery path needs, run in bounded tries (see
//! [`crate::store::lock_wait`]): each try under `lock_timeout`, and after one that gave up, the
//! sessions holding conflicting locks, read from `pg_locks`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use crate::store::lock_wait::{LockHolder, LockWait, LockWaitNotice, LockWaitReport};
use crate::store::StoreError;

/// The locks an operation takes, for naming who holds conflicting ones.
pub(crate) struct Contended {
    /// Tables it locks (those that do not exist yet are left out).
    pub tables: &'static [&'static str],
    /// Lock modes held by others that do not conflict with what it takes on those tables.
    pub compatible: &'static [&'static str],
    /// An advisory-lock namespace (`classid`) it takes a lock in, if any.
    pub advisory: Option<i32>,
}

/// What a switch ([`super::queue::switch_online`]) or a pin change
/// ([`super::layout::change_pin`]) locks: `keyorder_layout` in `EXCLUSIVE` mode, which only
/// plain reads do not conflict with (producers read it `FOR SHARE`).
pub(crate) const LAYOUT_LOCK: Contended =
    Contended { tables: &["keyorder_layout"], compatible: &["AccessShareLock"], advisory: None };

/// One try of an operation, on the admin connection.
pub(crate) type Try<'c, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + 'c>>;

/// Runs `attempt` until it does not give up on a lock, at most `wait.attempts` times, each
/// under `lock_timeout = wait.attempt`, pausing `wait.pause` between tries and reporting each
/// try that gave up to `report`. A try that gives up must leave nothing the next try cannot
/// redo (one transaction rolls back; a concurrent index build leaves an invalid index the
/// next try drops). The session's `lock_timeout` is restored afterwards.
pub(crate) async fn retrying<T>(
    client: &mut Client,
    wait: &LockWait,
    report: &mut Option<LockWaitReport>,
    operation: &'static str,
    contended: &Contended,
    mut attempt: impl for<'c> FnMut(&'c mut Client) -> Try<'c, T>,
) -> Result<T, StoreError> {
    client
        .batch_execute(&format!("SET lock_timeout = {}", wait.attempt.as_millis().max(1)))
        .await?;
    let attempts = wait.attempts.max(1);
    let mut tried = 0;
    let outcome = loop {
        tried += 1;
        match attempt(client).await {
            Err(e) if gave_up_on_a_lock(&e) => {
                let holders = match holders(client, contended).await {
                    Ok(h) => h,
                    Err(e) => break Err(e),
                };
                if tried >= attempts {
                    break Err(StoreError::LockBusy {
                        operation,
                        attempts: tried,
                        attempt: wait.attempt,
                        holders,
                    });
                }
                if let Some(report) = report.as_mut() {
                    report(&LockWaitNotice {
                        operation,
                        attempt: tried,
                        attempts,
                        holders: &holders,
                    });
                }
                tokio::time::sleep(wait.pause).await;
            }
            other => break other,
        }
    };
    // Reset whatever the outcome; an outcome's error says more than a failed reset's.
    let reset = client.batch_execute("RESET lock_timeout").await;
    let value = outcome?;
    reset?;
    Ok(value)
}

/// Whether `e` is PostgreSQL's `lock_not_available` (a `lock_timeout` ran out).
fn gave_up_on_a_lock(e: &StoreError) -> bool {
    let StoreError::Backend { source, .. } = e else { return false };
    source
        .downcast_ref::<tokio_postgres::Error>()
        .is_some_and(|e| e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE))
}

/// The other sessions that hold locks conflicting with `contended` now, oldest transaction
/// first.
async fn holders(client: &Client, contended: &Contended) -> Result<Vec<LockHolder>, StoreError> {
    let tables: Vec<&str> = contended.tables.to_vec();
    let compatible: Vec<&str> = contended.compatible.to_vec();
    let rows = client
        .query_typed(
            "SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''),
                    extract(epoch FROM now() - a.xact_start)::float8,
                    left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 120),
                    string_agg(DISTINCT l.mode || ' on ' || coalesce(c.relname, l.locktype), ', ')
             FROM pg_locks l
             JOIN pg_stat_activity a ON a.pid = l.pid
             LEFT JOIN pg_class c ON c.oid = l.relation
             WHERE l.granted AND l.pid <> pg_backend_pid()
               AND ((l.relation IN (SELECT to_regclass(t) FROM unnest($1::text[]) t)
                     AND l.mode <> ALL($2::text[]))
                    OR (l.locktype = 'advisory' AND l.classid = $3::int4::oid))
             GROUP BY 1, 2, 3, 4, 5
             ORDER BY 4 DESC NULLS LAST, 1",
            &[
                (&tables, Type::TEXT_ARRAY),
                (&compatible, Type::TEXT_ARRAY),
                (&contended.advisory.unwrap_or(-1), Type::INT4),
            ],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| LockHolder {
            pid: r.get(0),
            application: r.get(1),
            state: r.get(2),
            in_transaction_for: r
                .get::<_, Option<f64>>(3)
                .map(|s| Duration::from_secs_f64(s.max(0.0))),
            query: r.get(4),
            holds: r.get(5),
        })
        .collect())
}
