//! `keyorder enqueue`: events from JSON lines, in batches of one round trip each.

use std::io::{self, BufRead, BufReader};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use keyorder::key::Event;
use keyorder::store::admin::{Admin, Durability};
use keyorder::store::open::{AdminConn, OpenMode};
use keyorder::PartitionCount;

use super::bad_input::BadInput;
use super::layout::{resolve, Resolved};
use super::runtime::{block_on, parse_count, Database};

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    db: Database,
    /// The partition count you expect: enqueue routes with the count recorded in the database
    /// (and its pins), and refuses to run when this disagrees. On a database with no count
    /// recorded yet, this count (default 16) is recorded.
    #[arg(long, value_parser = parse_count, allow_negative_numbers = true)]
    partitions: Option<PartitionCount>,
    /// Events per insert statement (one round trip each).
    #[arg(long, default_value_t = 5000)]
    batch: usize,
    /// Take a per-key advisory lock in each transaction, so that concurrent producers of one
    /// key commit in seq order.
    #[arg(long)]
    serialise_keys: bool,
    /// `full`: each batch is on disk before it counts as enqueued (a power cut loses nothing
    /// reported). `normal`: durable at the next checkpoint, faster; a power cut may lose the
    /// last batches. SQLite only: PostgreSQL follows its server's `synchronous_commit`.
    #[arg(long, value_enum, default_value_t = Durability::Full)]
    durability: Durability,
    /// JSON lines of events ({"event_id", "subscription_id", "tenant_id", "resource_id",
    /// "payload"}); standard input when absent or `-`.
    file: Option<PathBuf>,
}

pub fn enqueue(args: EnqueueArgs) -> anyhow::Result<()> {
    let input: Box<dyn BufRead> = match &args.file {
        Some(p) if p.as_os_str() != "-" => Box::new(BufReader::new(
            std::fs::File::open(p)
                .map_err(|e| BadInput(format!("cannot open {}: {e}", p.display())))?,
        )),
        _ => Box::new(BufReader::new(io::stdin().lock())),
    };
    block_on(async move {
        let mut client = args.db.admin(OpenMode::Create).await?;
        client.set_durability(args.durability)?;
        if let Resolved::RecordedNow(l) = resolve(&mut client, args.partitions).await? {
            tracing::info!(partitions = l.partitions.get(), "recorded the partition count in the database (every command uses it now; `keyorder switch` changes it)");
        }
        let (mut total, mut dups, mut batch, mut first_line) = (0u64, 0usize, Vec::new(), 1u64);
        for (i, line) in input.lines().enumerate() {
            let no = i as u64 + 1;
            let line = match line {
                Ok(line) => line,
                Err(e) => return Err(read_error(no, e, committed(total, dups, first_line))),
            };
            if line.trim().is_empty() {
                continue;
            }
            let event = parse_line(&line).map_err(|problem| {
                BadInput(format!("line {no}{problem}; {}", committed(total, dups, first_line)))
            })?;
            batch.push(event);
            if batch.len() >= args.batch.max(1) {
                let (n, d) = insert(&mut client, &mut batch, args.serialise_keys)
                    .await
                    .with_context(|| committed(total, dups, first_line))?;
                (total, dups, first_line) = (total + n, dups + d, no + 1);
            }
        }
        let (n, d) = insert(&mut client, &mut batch, args.serialise_keys)
            .await
            .with_context(|| committed(total, dups, first_line))?;
        (total, dups) = (total + n, dups + d);
        println!("enqueued {total} events ({dups} duplicates skipped)");
        Ok(())
    })?
}

/// What an enqueue that stops at line `first_line`'s batch has committed: every error says it,
/// in these words.
fn committed(total: u64, dups: usize, first_line: u64) -> String {
    format!(
        "enqueued {total} events from lines before {first_line} ({dups} duplicates skipped), nothing from line {first_line} on"
    )
}

/// The event on one line, or what is wrong with it: ` column C: ...` for JSON that does not
/// parse (the line number is the caller's), `: ...` for an event that does not validate.
fn parse_line(line: &str) -> Result<Event, String> {
    let event: Event = serde_json::from_str(line).map_err(|e| {
        // serde_json counts lines within the text it was given (always line 1 here): keep
        // only its column, and its message without the " at line 1 column C" it appends.
        let text = e.to_string();
        let suffix = format!(" at line {} column {}", e.line(), e.column());
        let message = text.strip_suffix(&suffix).unwrap_or(&text);
        if e.line() == 0 {
            format!(": {message}")
        } else {
            format!(" column {}: {message}", e.column())
        }
    })?;
    event.validate().map_err(|e| format!(": {e}"))?;
    Ok(event)
}

/// A line that cannot be read: not UTF-8 (bad input, exit 2) or an I/O error (exit 1).
fn read_error(no: u64, e: io::Error, committed: String) -> anyhow::Error {
    if e.kind() == io::ErrorKind::InvalidData {
        BadInput(format!("line {no}: not UTF-8 text ({e}); {committed}")).into()
    } else {
        anyhow::Error::new(e).context(format!("reading line {no}; {committed}"))
    }
}

/// Inserts and empties `batch`; returns (inserted, duplicates), naming each duplicate.
async fn insert(
    client: &mut AdminConn,
    batch: &mut Vec<Event>,
    serialise_keys: bool,
) -> anyhow::Result<(u64, usize)> {
    if batch.is_empty() {
        return Ok((0, 0));
    }
    let report = client.enqueue(batch, serialise_keys).await?;
    for d in &report.duplicates {
        tracing::warn!(event_id = d.as_str(), "duplicate event id (already queued): skipped");
    }
    batch.clear();
    Ok((report.inserted, report.duplicates.len()))
}
