//! The partition count every database command uses: the one recorded in the database. A
//! `--partitions` flag is an assertion (a value that disagrees is bad input naming both
//! counts); a database with nothing recorded records the flag's count, or 16, once the queued
//! rows agree with it. Only `keyorder switch` changes a recorded count.

use keyorder::layout::{audit, infer_count, Audit, Inference, LayoutRecord};
use keyorder::store::admin::Admin;
use keyorder::PartitionCount;

use super::bad_input::BadInput;

/// The count recorded when neither the database nor a flag says otherwise.
pub const DEFAULT_PARTITIONS: u16 = 16;

/// How a command came to the count it uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// It was recorded before.
    Recorded(LayoutRecord),
    /// This command recorded it now.
    RecordedNow(LayoutRecord),
}

impl Resolved {
    /// The layout in force.
    pub fn layout(self) -> LayoutRecord {
        match self {
            Resolved::Recorded(l) | Resolved::RecordedNow(l) => l,
        }
    }
}

/// The layout in force, checked against `asserted` (`--partitions`), recording the asserted
/// count (or [`DEFAULT_PARTITIONS`]) first when none is recorded and the queued rows agree
/// with it.
pub async fn resolve(
    admin: &mut impl Admin,
    asserted: Option<PartitionCount>,
) -> anyhow::Result<Resolved> {
    resolve_with(admin, asserted, false, "--partitions").await
}

/// [`resolve`]; with `accept_misplaced`, the count is recorded even when queued rows were
/// routed otherwise (`keyorder migrate --partitions N`: the operator's word; the rows that
/// disagree are reported as misplaced from then on).
pub async fn resolve_with(
    admin: &mut impl Admin,
    asserted: Option<PartitionCount>,
    accept_misplaced: bool,
    flag: &str,
) -> anyhow::Result<Resolved> {
    if let Some(current) = admin.routing_state().await?.current() {
        agree(current, asserted, flag)?;
        return Ok(Resolved::Recorded(current));
    }
    let count = match asserted {
        Some(c) => c,
        None => PartitionCount::new(DEFAULT_PARTITIONS.into())?,
    };
    let rows: Vec<(String, i16)> =
        admin.placements().await?.into_iter().map(|p| (p.key, p.partition)).collect();
    if !rows.is_empty() && !accept_misplaced {
        let fits = rows.iter().all(|(k, p)| keyorder::partition_for(k, count).0 as i16 == *p);
        if !fits {
            return Err(BadInput(format!(
                "no partition count is recorded in this database, and its {} queued keys were not routed with {count}{}: \
                 record the count they were routed with by `keyorder migrate --partitions N`",
                rows.len(),
                inferred_hint(&rows)
            ))
            .into());
        }
    }
    let recorded = admin.record_layout(count).await?;
    agree(recorded, asserted, flag)?;
    Ok(Resolved::RecordedNow(recorded))
}

/// What the queued rows say their count was, as a clause for a message.
pub fn inferred_hint(rows: &[(String, i16)]) -> String {
    match infer_count(rows) {
        Inference::Unique(n) => format!(" (they fit {n} and no other count)"),
        Inference::Ambiguous(some) => {
            let some: Vec<String> = some.iter().map(|c| c.to_string()).collect();
            format!(" (too few keys to tell: they fit {}, ...)", some.join(", "))
        }
        Inference::None => {
            " (no single count routes them all: a random hash, pins, or several counts)".into()
        }
        Inference::Empty => String::new(),
    }
}

/// Refuses an asserted count that is not the recorded one.
fn agree(
    recorded: LayoutRecord,
    asserted: Option<PartitionCount>,
    flag: &str,
) -> anyhow::Result<()> {
    match asserted {
        Some(a) if a != recorded.partitions => Err(BadInput(format!(
            "{flag} {a} disagrees with the database: it records {} partitions (layout {}). \
             Drop {flag} to use the recorded count; only `keyorder switch --from {} --to {a}` changes it",
            recorded.partitions, recorded.epoch, recorded.partitions
        ))
        .into()),
        _ => Ok(()),
    }
}

/// Judges the queued rows against the routing records (see [`keyorder::layout::audit`]).
pub async fn audit_queue(admin: &impl Admin) -> anyhow::Result<Audit> {
    let state = admin.routing_state().await?;
    Ok(audit(&state, &admin.placements().await?))
}
