//! `keyorder check FILE`: judge a delivery history written by any system (JSON lines, see
//! `keyorder::check::jsonl`) with the simulator's checker. Exit 0 when it keeps the contract, 1
//! on a violation, 2 when the file cannot be read as a history (naming the line).

use std::io::BufReader;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use keyorder::check::jsonl::{self, HistoryError};
use keyorder::check::{check_with, CheckConfig};

use super::bad_input::BadInput;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The history: JSON lines of enqueued, delivery, dead_letter, ack and end records
    /// (`-` reads standard input).
    file: PathBuf,
    /// Read a receiver's log: delivery records only (arrival, answer, event id, key, seq). Lost,
    /// stall, split key, concurrent and head-of-line are then not judged.
    #[arg(long)]
    receiver_only: bool,
    /// Print the verdict as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also write the history as one self-contained HTML timeline, the counterexamples
    /// highlighted, to this file.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// A row still queued at the end (an `end` record's `queued`) that waited longer than this,
    /// in ms, is a stall.
    #[arg(long, default_value_t = keyorder::check::DEFAULT_STALL_AFTER.as_millis() as u64)]
    stall_after_ms: u64,
}

pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    let name = args.file.display().to_string();
    let parsed = if args.file.as_os_str() == "-" {
        read(std::io::stdin().lock(), args.receiver_only)
    } else {
        let file = std::fs::File::open(&args.file)
            .map_err(|e| BadInput(format!("cannot open the history {name}: {e}")))?;
        read(BufReader::new(file), args.receiver_only)
    };
    let parsed = parsed.map_err(|e| match e {
        HistoryError::Io(io) => anyhow::Error::new(io).context(format!("reading {name}")),
        other => BadInput(format!("{name}: {other}")).into(),
    })?;
    let config = CheckConfig { stall_after: std::time::Duration::from_millis(args.stall_after_ms) };
    let verdict = check_with(&parsed.history, &config).not_judging(&parsed.not_judged);
    if let Some(path) = &args.html {
        let page = keyorder::html::timeline::render(
            &format!("keyorder check {name}"),
            &parsed.history,
            &verdict,
        );
        std::fs::write(path, page)
            .with_context(|| format!("cannot write the timeline to {}", path.display()))?;
        tracing::info!(path = %path.display(), "timeline written");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        print!("{verdict}");
        if !verdict.not_judged.is_empty() {
            let kinds: Vec<&str> = verdict.not_judged.iter().map(|k| k.name()).collect();
            println!("not judged (the history holds too little for them): {}", kinds.join(", "));
        }
    }
    let violated = verdict.violated();
    if violated.is_empty() {
        return Ok(());
    }
    let kinds: Vec<&str> = violated.iter().map(|k| k.name()).collect();
    anyhow::bail!(
        "{name} breaks the contract: {} (the first counterexample of each is above)",
        kinds.join(", ")
    )
}

fn read(input: impl std::io::BufRead, receiver_only: bool) -> Result<jsonl::Parsed, HistoryError> {
    if receiver_only {
        jsonl::parse_receiver(input)
    } else {
        jsonl::parse(input)
    }
}
