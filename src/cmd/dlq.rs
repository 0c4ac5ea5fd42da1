//! `keyorder dlq`: list, show and redrive dead-lettered events.

use clap::{Args, Subcommand};
use keyorder::store::admin::Admin;
use keyorder::store::open::OpenMode;
use keyorder::PartitionCount;

use super::bad_input::BadInput;
use super::runtime::{block_on, parse_count, Database};

#[derive(Debug, Args)]
pub struct DlqArgs {
    #[command(flatten)]
    db: Database,
    #[command(subcommand)]
    action: DlqAction,
}

#[derive(Debug, Subcommand)]
enum DlqAction {
    /// Dead-lettered events, newest first, a page at a time: when a page is full, the command
    /// for the next one is printed on stderr.
    List {
        /// How many (at least 1).
        #[arg(long, default_value_t = 50)]
        limit: i64,
        /// Only dead letters with ids below this one (the last id of the page before).
        #[arg(long, value_name = "ID")]
        after: Option<i64>,
        /// JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// One dead-lettered event with its payload.
    Show {
        /// Its dead-letter id.
        id: i64,
    },
    /// Re-enqueue one at the tail. Its key's later events were delivered before it: this is an
    /// ordering gap, which --accept-gap acknowledges.
    Redrive {
        /// Its dead-letter id.
        id: i64,
        /// The partition count you expect: the event is routed with the count recorded in the
        /// database (and its pins), and nothing is done when this disagrees.
        #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
        partitions: Option<PartitionCount>,
        /// Confirm that delivering it after later events of its key is acceptable.
        #[arg(long)]
        accept_gap: bool,
    },
}

pub fn dlq(args: DlqArgs) -> anyhow::Result<()> {
    block_on(async {
        let mut client = args.db.admin(OpenMode::Existing).await?;
        match args.action {
            DlqAction::List { limit, after, json } => {
                if limit < 1 {
                    return Err(BadInput(format!("--limit must be at least 1, not {limit}")).into());
                }
                let rows = client.dead_letters_below(after, limit).await?;
                if rows.is_empty() {
                    match after {
                        Some(id) => tracing::info!("no dead letters below id {id}"),
                        None => tracing::info!("no dead letters"),
                    }
                }
                for r in &rows {
                    if json {
                        println!("{}", serde_json::to_string(&r)?);
                    } else {
                        println!(
                            "{:>6}  p{:<4} {:<24} {:<24} {}  {}",
                            r.id, r.partition, r.key, r.event_id, r.dead_lettered_at, r.reason
                        );
                    }
                }
                if let Some(last) = rows.last().filter(|_| rows.len() as i64 == limit) {
                    tracing::info!(
                        "more may follow: keyorder dlq list --limit {limit} --after {}",
                        last.id
                    );
                }
            }
            DlqAction::Show { id } => match client.dead_letters(Some(id), 1).await?.pop() {
                Some(r) => println!("{}", serde_json::to_string_pretty(&r)?),
                None => return Err(BadInput(format!("no dead-lettered event with id {id}")).into()),
            },
            DlqAction::Redrive { id, partitions, accept_gap } => {
                if !accept_gap {
                    return Err(BadInput(
                        "redrive puts the event at the tail, after later events of its key: an ordering gap. Re-run with --accept-gap to do it".into(),
                    )
                    .into());
                }
                super::layout::resolve(&mut client, partitions).await?;
                match client.redrive(id).await? {
                    Some(seq) => println!("redriven as seq {seq} at the tail: it is delivered after later events of its key (an ordering gap)"),
                    None => return Err(BadInput(format!("no dead-lettered event with id {id}")).into()),
                }
            }
        }
        Ok(())
    })?
}
