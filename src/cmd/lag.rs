//! `keyorder lag`: per-partition depth, oldest wait, keys affected, head attempts, the head's
//! last error and next attempt (table and JSON); the heaviest keys. As a table, one JSON
//! object, or Prometheus text.

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
        let state = client.routing_state().await?;
        let audit = keyorder::layout::audit(&state, &client.placements().await?);
        let layout = state.current();
        if args.json {
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "layout": layout,
                    "pins": state.current_pins(),
                    "partitions": lag,
                    "heaviest_keys": heavy,
                    "routing": audit,
                }))?
            );
        } else if args.prom {
            // The names and encoder of `keyorder work --metrics-addr`.
            let metrics = keyorder::metrics::Metrics::new();
            metrics.set_lag(layout.map(|l| l.partitions), &lag);
            metrics.set_audit(&audit);
            print!("{}", metrics.encode());
        } else {
            match layout {
                Some(l) => println!(
                    "layout {}: {} partitions, {} pinned key(s)",
                    l.epoch,
                    l.partitions,
                    state.current_pins().len()
                ),
                None => println!("no partition count recorded yet (the first enqueue or `keyorder migrate --partitions N` records one)"),
            }
            println!(
                "{:>9} {:>9} {:>14} {:>9} {:>13} {:>13}  head's last error",
                "partition", "depth", "oldest wait s", "keys", "head attempts", "next try in s"
            );
            for l in &lag {
                let next = l.next_attempt_in_seconds.map_or("-".to_owned(), |s| format!("{s:.1}"));
                println!(
                    "{:>9} {:>9} {:>14.1} {:>9} {:>13} {:>13}  {}",
                    l.partition,
                    l.depth,
                    l.oldest_wait_seconds,
                    l.keys_affected,
                    l.head_attempts,
                    next,
                    l.last_error.as_deref().unwrap_or("-")
                );
            }
            if lag.is_empty() {
                println!("queue is empty");
            }
            for k in &heavy {
                println!("heavy key {:?}: {} queued", k.key, k.depth);
            }
            if let Some(text) = audit.summary() {
                println!("WARNING: {text}");
            }
        }
        Ok(())
    })?
}
