//! `keyorder switch`: change the partition count online (no write pause), a new layout with a
//! per-key barrier.

use clap::Args;
use keyorder::store::admin::Admin;
use keyorder::store::open::OpenMode;
use keyorder::store::StoreError;
use keyorder::PartitionCount;

use super::bad_input::BadInput;
use super::runtime::{block_on, parse_count, Database, LockWaitArgs};

#[derive(Debug, Args)]
pub struct SwitchArgs {
    #[command(flatten)]
    db: Database,
    /// The partition count in force, as a check: the switch starts from the count the database
    /// records, and refuses when this disagrees.
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
    from: Option<PartitionCount>,
    /// The partition count to switch to.
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
    to: PartitionCount,
    /// Confirm that every producer enqueues through `keyorder enqueue` (or writes the layout
    /// column from `keyorder_layout`): one that keeps routing with the old count splits keys.
    #[arg(long)]
    producers_follow: bool,
    #[command(flatten)]
    locks: LockWaitArgs,
}

pub fn switch(args: SwitchArgs) -> anyhow::Result<()> {
    if !args.producers_follow {
        return Err(BadInput(
            "an online switch is safe only if every producer routes with the new layout at once: \
             confirm with --producers-follow that all of them enqueue through keyorder"
                .into(),
        )
        .into());
    }
    block_on(async {
        let mut client = args.locks.admin(&args.db, OpenMode::Existing, "switch").await?;
        let from = super::layout::resolve_with(&mut client, args.from, false, "--from")
            .await?
            .layout()
            .partitions;
        if from == args.to {
            return Err(BadInput(format!(
                "the database records {from} partitions already: nothing to switch"
            ))
            .into());
        }
        let layout = client.switch_online(from, args.to).await.map_err(|e| match e {
            StoreError::LockBusy { .. } => anyhow::Error::new(e).context("switch not done"),
            other => BadInput(format!("switch refused: {other}")).into(),
        })?;
        println!(
            "layout {} in force: producers route with {} partitions now; workers lease {} until the \
             rows of the old layout are gone; each moving key waits for its old partition (no write pause)",
            layout.epoch,
            args.to,
            from.max(args.to)
        );
        Ok(())
    })?
}
