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
pub struct MigrateArgs {
    #[command(flatten)]
    db: Database,
}

pub fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    block_on(async {
        let applied = match args.db.queue(OpenMode::Migrate).await? {
            Queue::Pg(mut client) => schema::migrate(&mut client).await.context("migrating")?,
            // Opening for migration applied what was missing; this reports it.
            Queue::Sqlite(mut c) => sqlite::schema::migrate(&mut c).context("migrating")?,
        };
        if applied.is_empty() {
            println!("schema is current (version {})", schema::SCHEMA_VERSION);
        } else {
            println!("applied migrations {applied:?}; schema version {}", schema::SCHEMA_VERSION);
        }
        Ok(())
    })?
}
