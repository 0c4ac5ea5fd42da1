//! `keyorder migrate`: create or upgrade the queue schema (idempotent, versioned), and record
//! the partition count in the database: `--partitions N` (default 16), or for a database whose
//! queue was filled before counts were recorded, the count its rows were routed with.

use anyhow::Context;
use clap::Args;
use keyorder::layout::{infer_count, Inference};
use keyorder::store::admin::Admin;
use keyorder::store::open::OpenMode;
use keyorder::PartitionCount;

use super::bad_input::BadInput;
use super::layout::{inferred_hint, resolve_with, Resolved, DEFAULT_PARTITIONS};
use super::runtime::{block_on, parse_count, Database, LockWaitArgs};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    db: Database,
    /// The partition count to record when none is recorded (default 16; for a queue that
    /// already holds rows, the count they were routed with, which is inferred when only one
    /// count fits). When one is recorded, this must agree with it.
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
    partitions: Option<PartitionCount>,
    #[command(flatten)]
    locks: LockWaitArgs,
}

pub fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    block_on(async {
        let mut admin = args.locks.admin(&args.db, OpenMode::Migrate, "migrate").await?;
        let applied = admin.migrate().await.context("migrating")?;
        let version = admin.schema_version();
        if applied.is_empty() {
            println!("schema is current (version {version})");
        } else {
            println!("applied migrations {applied:?}; schema version {version}");
        }
        let recorded = admin.routing_state().await?.current();
        let asserted = match (recorded, args.partitions) {
            (None, None) => Some(inferred(&admin).await?),
            (_, given) => given,
        };
        match resolve_with(&mut admin, asserted, args.partitions.is_some(), "--partitions").await? {
            Resolved::Recorded(l) => {
                println!("partition count: {} (layout {}), as recorded", l.partitions, l.epoch)
            }
            Resolved::RecordedNow(l) => println!("recorded the partition count: {}", l.partitions),
        }
        if let Some(text) = super::layout::audit_queue(&admin).await?.summary() {
            println!("WARNING: {text} (see `keyorder lag`)");
        }
        Ok(())
    })?
}

/// The count to record for a database with none recorded: 16 for an empty queue, else the one
/// count its rows fit; bad input naming the candidates otherwise.
async fn inferred(admin: &impl Admin) -> anyhow::Result<PartitionCount> {
    let rows: Vec<(String, i16)> =
        admin.placements().await?.into_iter().map(|p| (p.key, p.partition)).collect();
    match infer_count(&rows) {
        Inference::Empty => Ok(PartitionCount::new(DEFAULT_PARTITIONS.into())?),
        Inference::Unique(n) => {
            println!("the queued rows were routed with {n} partitions (no other count fits them)");
            Ok(n)
        }
        _ => Err(BadInput(format!(
            "no partition count is recorded and the queue's {} keys do not tell which one they were routed with{}: \
             re-run with --partitions N, the count your producers use",
            rows.len(),
            inferred_hint(&rows)
        ))
        .into()),
    }
}
