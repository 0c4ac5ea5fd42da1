//! `keyorder check FILE...`: judge a delivery history written by any system (JSON lines, see
//! `keyorder::check::jsonl`) with the simulator's checker, plus the rules only logs need
//! (`premature`, `concurrent_key`). Several files (one per worker, say) are read as one history.
//! Exit 0 when it keeps the contract, 1 on a violation, 2 when a file cannot be read as a
//! history (naming the file and line).

use std::io::BufReader;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use keyorder::check::jsonl::{self, HistoryError, ReadOptions, Record};
use keyorder::check::{check_with, CheckConfig};

use super::bad_input::BadInput;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The history: JSON lines of enqueued, aborted, delivery, dead_letter, ack and end records
    /// (`-` reads standard input; a name ending in `.gz` is gunzipped). Several files are read
    /// as one history, in the order given.
    #[arg(required = true, num_args = 1.., value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Read a receiver's log: delivery records only (arrival, answer, event id, key, seq). Lost,
    /// stall, premature, split key and head-of-line are then not judged, nor concurrent unless
    /// every record names its partition.
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
    /// How far apart the writers' clocks may be, in ms (fractions allowed): an arrival or answer
    /// before its send by at most this is taken as at the send and counted, not an error, and a
    /// delivery sent at most this before its enqueue is not premature.
    #[arg(long, default_value_t = 0.0, value_name = "MS")]
    clock_skew_ms: f64,
}

pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    if !args.clock_skew_ms.is_finite() || !(0.0..=1e9).contains(&args.clock_skew_ms) {
        return Err(BadInput(format!(
            "--clock-skew-ms {} is not a tolerance: give milliseconds, 0 or more",
            args.clock_skew_ms
        ))
        .into());
    }
    let skew = Duration::from_secs_f64(args.clock_skew_ms / 1000.0);
    let names: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
    let name = names.join(", ");
    let (lines, starts) = read_all(&args.files, &names)?;
    let options = ReadOptions { receiver_only: args.receiver_only, clock_skew: skew };
    let parsed = jsonl::build(&lines, &options).map_err(|e| match e {
        HistoryError::Io(io) => anyhow::Error::new(io).context(format!("reading {name}")),
        HistoryError::Line { line, what } => {
            let (file, line) = locate(&names, &starts, line);
            BadInput(format!("{file}: line {line}: {what}")).into()
        }
        other => BadInput(format!("{name}: {other}")).into(),
    })?;
    if parsed.without_partition > 0 && !parsed.history.deliveries.is_empty() {
        eprintln!(
            "keyorder check: warning: {} record(s) name no partition, so the partition rules \
             (split_key, concurrent, stall, head_of_line) are not judged",
            parsed.without_partition
        );
    }
    let config = CheckConfig {
        stall_after: Duration::from_millis(args.stall_after_ms),
        log_rules: true,
        clock_skew: skew,
    };
    let mut verdict = check_with(&parsed.history, &config).not_judging(&parsed.not_judged);
    verdict.skew_forgiven = parsed.skew_forgiven;
    if let Some(path) = &args.html {
        let page = keyorder::html::timeline::render(
            &format!("keyorder check {name}"),
            &parsed.history,
            &verdict,
        );
        std::fs::write(path, page)
            .with_context(|| format!("cannot write the timeline to {}", path.display()))?;
        eprintln!("timeline written to {}", path.display());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        print!("{verdict}");
        if !verdict.not_judged.is_empty() {
            let kinds: Vec<&str> = verdict.not_judged.iter().map(|k| k.name()).collect();
            println!("not judged (the history holds too little for them): {}", kinds.join(", "));
        }
        if verdict.skew_forgiven > 0 {
            println!(
                "clock skew forgiven: {} deliveries arrived or were answered before their send, by at most --clock-skew-ms {}",
                verdict.skew_forgiven, args.clock_skew_ms
            );
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

/// Records with their line numbers, counted across files.
type Numbered = Vec<(usize, Record)>;

/// Every file's records, numbered one after the other, and the first line number of each file.
fn read_all(files: &[PathBuf], names: &[String]) -> anyhow::Result<(Numbered, Vec<usize>)> {
    let mut lines = Vec::new();
    let mut starts = Vec::new();
    let mut next = 0;
    for (file, name) in files.iter().zip(names) {
        starts.push(next);
        let read = if file.as_os_str() == "-" {
            jsonl::read_records(std::io::stdin().lock(), next)
        } else {
            let f = std::fs::File::open(file)
                .map_err(|e| BadInput(format!("cannot open the history {name}: {e}")))?;
            if file.extension().is_some_and(|x| x == "gz") {
                let unzipped = flate2::read::MultiGzDecoder::new(BufReader::new(f));
                jsonl::read_records(BufReader::with_capacity(1 << 20, unzipped), next)
            } else {
                jsonl::read_records(BufReader::with_capacity(1 << 20, f), next)
            }
        };
        let records = read.map_err(|e| match e {
            HistoryError::Io(io) => anyhow::Error::new(io).context(format!("reading {name}")),
            HistoryError::Line { line, what } => {
                BadInput(format!("{name}: line {}: {what}", line - next)).into()
            }
            other => BadInput(format!("{name}: {other}")).into(),
        })?;
        // Line numbers of the next file start past this one's last record.
        next = records.last().map_or(next, |(l, _)| *l) + 1;
        lines.extend(records);
    }
    Ok((lines, starts))
}

/// The file and the line within it of a line numbered across files by [`read_all`].
fn locate<'a>(names: &'a [String], starts: &[usize], line: usize) -> (&'a str, usize) {
    let i = starts.partition_point(|s| *s < line).saturating_sub(1);
    (names[i].as_str(), line - starts[i])
}
