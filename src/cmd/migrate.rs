//! `keyorder migrate`: create or upgrade the queue schema (idempotent, versioned).

use anyhow::Context;
use clap::Args;
use keyorder::store::admin::Admin;
use keyorder::store::open::OpenMode;

use super::runtime::{block_on, Database};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    db: Database,
}

pub fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    block_on(async {
        let mut admin = args.db.admin(OpenMode::Migrate).await?;
        let applied = admin.migrate().await.context("migrating")?;
        let version = admin.schema_version();
        if applied.is_empty() {
            println!("schema is current (version {version})");
        } else {
            println!("applied migrations {applied:?}; schema version {version}");
        }
        Ok(())
    })?
}
