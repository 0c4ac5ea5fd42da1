//! `keyorder-sim`: sweep seeds, replay one, and judge every run with the checker.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

mod cli;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("keyorder-sim: error: {err:#}");
            ExitCode::from(2)
        }
    }
}
