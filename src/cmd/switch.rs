//! The database commands: `migrate`, `enqueue`, `work`, `lag`, `dlq`, and the runtime they
//! share (one current-thread runtime with a `LocalSet`, as the worker loop requires).

use std::future::Future;
use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use keyorder::key::Event;
use keyorder::retry::RetryPolicy;
use keyorder::store::postgres::{self, queue, schema, PgOptions, PgStore};
use keyorder::store::sqlite::{self, schema::OpenMode, SqliteOptions, SqliteStore};
use keyorder::store::{Store, StoreError};
use keyorder::worker::{self, WorkerConfig};
use keyorder::{PartitionCount, Router};
use tokio_postgres::Client;

use super::delivery::DeliveryArgs;
#[allow(unused_imports)]
use super::runtime::*;
use super::BadInput;
use keyorder::endpoints::EndpointRow;
use keyorder::http::{EndpointDirectory, RoutedDeliverer};

#[derive(Debug, Args)]
pub struct SwitchArgs {
    #[command(flatten)]
    db: Database,
    /// The partition count in force.
    #[arg(long, value_parser = parse_count)]
    from: PartitionCount,
    /// The partition count to switch to.
    #[arg(long, value_parser = parse_count)]
    to: PartitionCount,
    /// Confirm that every producer enqueues through `keyorder enqueue` (or writes the layout
    /// column from `keyorder_layout`): one that keeps routing with the old count splits keys.
    #[arg(long)]
    producers_follow: bool,
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
        let mut client = args.db.queue(OpenMode::Existing).await?;
        let layout = client
            .switch(args.from, args.to)
            .await
            .map_err(|e| BadInput(format!("switch refused: {e}")))?;
        println!(
            "layout {} in force: producers route with {} partitions now; workers lease {} until the \
             rows of the old layout are gone; each moving key waits for its old partition (no write pause)",
            layout.epoch,
            args.to,
            args.from.max(args.to)
        );
        Ok(())
    })?
}
