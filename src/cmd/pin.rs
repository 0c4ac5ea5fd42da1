//! `keyorder pin`, `unpin` and `pins`: key pins, stored beside the layouts (a whale tenant on
//! a partition of its own, instead of where its hash puts it). A change that moves a key with
//! queued rows starts a new layout epoch: the key's new rows wait until its old ones are
//! delivered (the online switch's per-key barrier), so a pin never splits a key.

use clap::Args;
use keyorder::store::admin::{Admin, PinChange};
use keyorder::store::open::OpenMode;
use keyorder::store::StoreError;
use keyorder::PartitionId;

use super::bad_input::BadInput;
use super::runtime::{block_on, Database, LockWaitArgs};

#[derive(Debug, Args)]
pub struct PinArgs {
    #[command(flatten)]
    db: Database,
    /// The key (a subscription id) to pin.
    key: String,
    /// The partition to route it to (below the recorded count).
    partition: u16,
    #[command(flatten)]
    locks: LockWaitArgs,
}

#[derive(Debug, Args)]
pub struct UnpinArgs {
    #[command(flatten)]
    db: Database,
    /// The key to route by its hash again.
    key: String,
    #[command(flatten)]
    locks: LockWaitArgs,
}

#[derive(Debug, Args)]
pub struct PinsArgs {
    #[command(flatten)]
    db: Database,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

pub fn pin(args: PinArgs) -> anyhow::Result<()> {
    change(&args.db, &args.locks, &args.key, Some(PartitionId(args.partition)))
}

pub fn unpin(args: UnpinArgs) -> anyhow::Result<()> {
    change(&args.db, &args.locks, &args.key, None)
}

fn change(
    db: &Database,
    locks: &LockWaitArgs,
    key: &str,
    partition: Option<PartitionId>,
) -> anyhow::Result<()> {
    if key.is_empty() {
        return Err(BadInput("the key is empty: name the subscription id to pin".into()).into());
    }
    block_on(async {
        let operation = if partition.is_some() { "pin" } else { "unpin" };
        let mut admin = locks.admin(db, OpenMode::Existing, operation).await?;
        let done = admin.change_pin(key, partition).await.map_err(|e| match e {
            StoreError::Refused { reason, .. } => anyhow::Error::new(BadInput(reason)),
            other => anyhow::Error::new(other).context("changing the pin"),
        })?;
        println!("{}", describe(key, partition, &done));
        Ok(())
    })?
}

/// What a pin change did, for a person.
fn describe(key: &str, partition: Option<PartitionId>, done: &PinChange) -> String {
    let target = match partition {
        Some(p) => format!("pinned {key:?} to partition {}", p.0),
        None => format!("unpinned {key:?}: it routes by its hash again"),
    };
    if !done.changed {
        return format!("{target} already; nothing changed");
    }
    let wait = if done.queued_rows > 0 {
        format!(
            "; its {} queued row(s) are delivered first where they are, and its new rows wait for them (no split)",
            done.queued_rows
        )
    } else {
        String::new()
    };
    format!("{target} (layout {}){wait}", done.epoch)
}

pub fn pins(args: PinsArgs) -> anyhow::Result<()> {
    block_on(async {
        let admin = args.db.admin(OpenMode::Existing).await?;
        let state = admin.routing_state().await?;
        let current: Vec<_> = state.pins.iter().filter(|p| p.until_epoch.is_none()).collect();
        for p in &current {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"key": p.key, "partition": p.partition.0, "since_layout": p.from_epoch})
                );
            } else {
                println!(
                    "{:<32} partition {:<5} since layout {}",
                    p.key, p.partition.0, p.from_epoch
                );
            }
        }
        if current.is_empty() && !args.json {
            tracing::info!("no pinned keys");
        }
        Ok(())
    })?
}
