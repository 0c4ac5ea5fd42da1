//! `keyorder`: operate a per-key ordered webhook queue. Subcommands: `route`.
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
