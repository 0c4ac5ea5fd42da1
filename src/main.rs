//! `keyorder`: operate a per-key ordered webhook queue on SQLite or PostgreSQL. Subcommands:
//! `route`, `plan`, `migrate`, `enqueue`, `work`, `lag`, `dlq`, `bench`, `switch`, `pin`,
//! `unpin`, `pins`, `endpoints` (see `src/cmd/`, one file per command).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use cmd::logging::LogFormat;

mod cmd;

fn main() -> ExitCode {
    quiet_when_the_reader_leaves();
    let cli = cmd::Cli::parse();
    cli.log.install();
    let format = cli.log.format();
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if reader_left(&err) => ExitCode::from(141),
        Err(err) => {
            match format {
                // The line scripts and people have always read.
                LogFormat::Text => eprintln!("keyorder: error: {err:#}"),
                // A log shipper reads every stderr line as an object, the last one too.
                LogFormat::Json => tracing::error!(error = format!("{err:#}").as_str(), "failed"),
            }
            ExitCode::from(cmd::exit_code(&err))
        }
    }
}

/// `keyorder lag | head` closes standard output early: Rust ignores SIGPIPE, so the next
/// `println!` panics with "failed printing to stdout: Broken pipe". The reader has all it
/// wanted then: exit quietly (with 141, a shell's code for a pipe closed early) instead of a
/// panic and a backtrace. Any other panic is reported as before.
fn quiet_when_the_reader_leaves() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(141);
        }
        report(info)
    }));
}

/// Whether `err` is standard output's reader closing the pipe (nothing to report).
fn reader_left(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
