//! `keyorder-sim shrink`: search random scenarios for a violation and shrink it to a small,
//! saved, replayable case.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use keyorder_sim::regression::Regression;
use keyorder_sim::shrink::{search, size};
use keyorder_sim::Break;

#[derive(Debug, Args)]
pub struct ShrinkArgs {
    /// The broken design to search with; without it, the correct design (which must hold).
    #[arg(long = "break", value_enum, value_name = "NAME")]
    broken: Option<Break>,
    /// Random scenarios to try before giving up.
    #[arg(long, default_value_t = 64)]
    cases: u32,
    /// Seed of the search itself (the same seed finds the same case).
    #[arg(long, default_value_t = 1)]
    search_seed: u64,
    /// Save the shrunk case into this folder (as break-NAME.json or proptest-failure.json).
    #[arg(long)]
    save: Option<PathBuf>,
    /// Do not write the HTML timeline of the shrunk case (NAME.html, beside the saved case or
    /// in the working folder).
    #[arg(long)]
    no_html: bool,
}

pub fn run(args: ShrinkArgs) -> anyhow::Result<ExitCode> {
    let target = args.broken.map(Break::expected);
    let found =
        search(args.broken, target, args.cases, args.search_seed).map_err(anyhow::Error::msg)?;
    let Some(found) = found else {
        match args.broken {
            Some(b) => {
                println!("{}: no {} found in {} cases", b.name(), b.expected(), args.cases);
                return Ok(ExitCode::from(1));
            }
            None => {
                println!("correct design: no violation in {} random scenarios", args.cases);
                return Ok(ExitCode::SUCCESS);
            }
        }
    };
    let (keys, events, faults) = size(&found.scenario);
    println!("shrunk to {keys} keys, {events} events, {faults} faults (seed {})", found.seed);
    println!("violations: {:?}", found.violated);
    let name = args.broken.map_or("proptest-failure".to_owned(), |b| format!("break-{}", b.name()));
    if !args.no_html {
        let dir = args.save.clone().unwrap_or_default();
        let path = dir.join(format!("{name}.html"));
        super::write_timeline(&found.scenario, found.seed, &path)?;
        println!("timeline: {}", path.display());
    }
    if let Some(dir) = &args.save {
        let path = dir.join(format!("{name}.json"));
        let why = match args.broken {
            Some(b) => format!(
                "Shrunk counterexample for the broken design `{}`: the checker must report {} (found by `keyorder-sim shrink --break {} --cases {} --search-seed {}`).",
                b.name(), b.expected(), b.name(), args.cases, args.search_seed
            ),
            None => "A violation of the correct design found by the scenario property test.".to_owned(),
        };
        let case = Regression {
            name: name.clone(),
            why,
            seed: found.seed,
            expect: found.violated.clone(),
            scenario: found.scenario,
        };
        let text = serde_json::to_string_pretty(&case)?;
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("saved {}", path.display());
        println!("replay: keyorder-sim replay {} --scenario {}", found.seed, path.display());
    }
    Ok(if args.broken.is_some() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
