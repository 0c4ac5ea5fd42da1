//! `keyorder-sim catalogue`: for each broken design, how many seeds a sweep needs to catch it
//! (median over several sweeps), and the size of its saved shrunk counterexample.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use keyorder_sim::regression::Regression;
use keyorder_sim::shrink::size;
use keyorder_sim::{run, Break, Scenario, Size};

#[derive(Debug, Args)]
pub struct CatalogueArgs {
    /// Sweeps per design; sweep `i` starts at seed `i * 1000`.
    #[arg(long, default_value_t = 20)]
    sweeps: u64,
    /// Give up a sweep after this many seeds.
    #[arg(long, default_value_t = 50)]
    max_seeds: u64,
    /// Scenario size.
    #[arg(long, value_enum, default_value_t = Size::Small)]
    size: Size,
    /// Where the shrunk counterexamples live (break-NAME.json).
    #[arg(long, default_value = "testdata/regressions")]
    regressions: PathBuf,
}

pub fn run_catalogue(args: CatalogueArgs) -> anyhow::Result<ExitCode> {
    println!("| broken design | violation | seeds to catch (median of {}) | worst | shrunk counterexample (keys, events, faults) |", args.sweeps);
    println!("|---|---|---|---|---|");
    let mut all_caught = true;
    for b in Break::ALL {
        let mut needed = Vec::new();
        for sweep in 0..args.sweeps {
            let start = sweep * 1000;
            let hit = (start..start + args.max_seeds).position(|seed| {
                let scenario = Scenario::generate_broken(args.size, seed, b);
                run(&scenario, seed, false)
                    .is_ok_and(|o| o.verdict.violated().contains(&b.expected()))
            });
            needed.push(hit.map_or(u64::MAX, |i| i as u64 + 1));
        }
        needed.sort_unstable();
        all_caught &= needed.iter().all(|n| *n != u64::MAX);
        let median = needed[needed.len() / 2];
        let worst = needed.last().copied().unwrap_or(u64::MAX);
        let shown =
            |n: u64| if n == u64::MAX { format!("> {}", args.max_seeds) } else { n.to_string() };
        let shrunk =
            std::fs::read_to_string(args.regressions.join(format!("break-{}.json", b.name())))
                .ok()
                .and_then(|t| Regression::from_json(&t).ok())
                .map_or("not saved".to_owned(), |c| {
                    let (k, e, f) = size(&c.scenario);
                    format!("{k}, {e}, {f}")
                });
        println!(
            "| `{}` | {} | {} | {} | {} |",
            b.name(),
            b.expected(),
            shown(median),
            shown(worst),
            shrunk
        );
    }
    Ok(if all_caught { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
