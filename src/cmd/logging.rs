//! Where the `keyorder` commands' logs go: `tracing` events on stderr, as text for a person or
//! as JSON lines for a log shipper, filtered by `--log-level` (or `RUST_LOG`). Results, tables
//! and reports meant for a pipe stay on stdout and never pass through here.
//!
//! Only the binary installs a subscriber: the library and the simulation emit no event of
//! their own, so a simulated run's trace holds no wall-clock time.

use clap::{Args, ValueEnum};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::EnvFilter;

/// The global logging flags of every `keyorder` command.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Which log events reach stderr: a level (error, warn, info, debug, trace) or a list of
    /// `target=level` directives as RUST_LOG takes them (for example
    /// `warn,keyorder::cmd::worker_log=debug`).
    #[arg(
        long,
        global = true,
        env = "RUST_LOG",
        hide_env_values = true,
        default_value = "info",
        value_name = "FILTER",
        value_parser = parse_filter
    )]
    log_level: String,
    /// How log events are written on stderr: `text` (a line a person reads: time, level,
    /// message, fields) or `json` (one JSON object a line: timestamp, level, message, the
    /// fields, target).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// How log events are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One line a person reads.
    Text,
    /// One JSON object a line.
    Json,
}

impl LogArgs {
    /// The chosen format.
    pub fn format(&self) -> LogFormat {
        self.log_format
    }

    /// Installs the process's subscriber: events at or above the filter, on stderr.
    pub fn install(&self) {
        // Checked by the value parser, so this cannot fail here.
        let filter = EnvFilter::try_new(&self.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false);
        // A second subscriber cannot be installed in one process; the first stays.
        let _ = match self.log_format {
            LogFormat::Text => builder.with_target(false).try_init(),
            LogFormat::Json => builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false)
                .try_init(),
        };
    }
}

/// A filter as `RUST_LOG` takes it. A word alone must be a level: `EnvFilter` would read
/// `--log-level loud` as the target `loud` and then log nothing else, without a word.
fn parse_filter(text: &str) -> Result<String, String> {
    if !text.contains(['=', ',']) {
        let levels = "error, warn, info, debug, trace or off";
        text.parse::<LevelFilter>().map_err(|_| format!("not a level ({levels}): {text:?}"))?;
    }
    EnvFilter::try_new(text).map(|_| text.to_string()).map_err(|e| e.to_string())
}
