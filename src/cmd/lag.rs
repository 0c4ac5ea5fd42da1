//! `keyorder lag`: per-partition depth, oldest wait, keys affected, head attempts; the
//! heaviest keys. As a table, one JSON object, or Prometheus text.

use clap::Args;
use keyorder::store::admin::Admin;
use keyorder::store::open::OpenMode;

use super::runtime::{block_on, Database};

#[derive(Debug, Args)]
pub struct LagArgs {
    #[command(flatten)]
    db: Database,
    /// One JSON object.
    #[arg(long, conflicts_with = "prom")]
    json: bool,
    /// Prometheus text exposition format.
    #[arg(long)]
    prom: bool,
}

pub fn lag(args: LagArgs) -> anyhow::Result<()> {
    block_on(async {
        let client = args.db.admin(OpenMode::Existing).await?;
        let (lag, heavy) = (client.lag().await?, client.heaviest_keys(10).await?);
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &serde_json::json!({"partitions": lag, "heaviest_keys": heavy})
                )?
            );
        } else if args.prom {
            // The names and encoder of `keyorder work --metrics-addr`.
            let metrics = keyorder::metrics::Metrics::new();
            metrics.set_lag(&lag);
            print!("{}", metrics.encode());
        } else {
            println!(
                "{:>9} {:>9} {:>14} {:>9} {:>13}",
                "partition", "depth", "oldest wait s", "keys", "head attempts"
            );
            for l in &lag {
                println!(
                    "{:>9} {:>9} {:>14.1} {:>9} {:>13}",
                    l.partition, l.depth, l.oldest_wait_seconds, l.keys_affected, l.head_attempts
                );
            }
            if lag.is_empty() {
                println!("queue is empty");
            }
            for k in &heavy {
                println!("heavy key {:?}: {} queued", k.key, k.depth);
            }
        }
        Ok(())
    })?
}
