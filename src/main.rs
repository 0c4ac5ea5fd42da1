//! `keyorder`: operate a per-key ordered webhook queue on SQLite or PostgreSQL. Subcommands:
//! `route`, `plan`, `migrate`, `enqueue`, `work`, `lag`, `dlq`, `bench`, `switch` (see
//! `src/cmd/`, one file per command).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

mod cmd;

fn main() -> ExitCode {
    let cli = cmd::Cli::parse();
    match cmd::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("keyorder: error: {err:#}");
            ExitCode::from(cmd::exit_code(&err))
        }
    }
}
