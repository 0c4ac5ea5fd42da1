//! `keyorder-sim catalogue`: for each broken design and size, how many seeds a sweep needs to
//! catch it (median and worst over several sweeps), and the size of its saved shrunk
//! counterexample.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use clap::Args;
use keyorder_sim::regression::Regression;
use keyorder_sim::shrink::size;
use keyorder_sim::{run, Break, Scenario, Size};

#[derive(Debug, Args)]
pub struct CatalogueArgs {
    /// Sweeps per design and size; sweep `i` starts at seed `i * 1000`.
    #[arg(long, default_value_t = 20)]
    sweeps: u64,
    /// Give up a sweep after this many seeds.
    #[arg(long, default_value_t = 50)]
    max_seeds: u64,
    /// Scenario sizes, one column each (repeat the flag: `--size small --size medium`).
    #[arg(long, value_enum, default_values_t = [Size::Small])]
    size: Vec<Size>,
    /// Only these designs (repeat the flag); all by default.
    #[arg(long = "break", value_enum, value_name = "NAME")]
    broken: Vec<Break>,
    /// Threads to run sweeps on (each sweep stays deterministic); 0 means one per core.
    #[arg(long, default_value_t = 0)]
    jobs: usize,
    /// Where the shrunk counterexamples live (break-NAME.json).
    #[arg(long, default_value = "testdata/regressions")]
    regressions: PathBuf,
}

/// (design index, size index, sweep) and the seeds that sweep needed.
type Found = ((usize, usize, u64), Option<u64>);

/// Seeds sweep `sweep` needed to catch `b` at `size`: `None` if not within `max_seeds`.
fn seeds_to_catch(b: Break, size: Size, sweep: u64, max_seeds: u64) -> Option<u64> {
    let start = sweep * 1000;
    (start..start + max_seeds)
        .position(|seed| {
            let scenario = Scenario::generate_broken(size, seed, b);
            run(&scenario, seed, false).is_ok_and(|o| o.verdict.violated().contains(&b.expected()))
        })
        .map(|i| i as u64 + 1)
}

pub fn run_catalogue(args: CatalogueArgs) -> anyhow::Result<ExitCode> {
    let designs = if args.broken.is_empty() { Break::ALL.to_vec() } else { args.broken.clone() };
    let jobs = match args.jobs {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    // Every (design, size, sweep) is independent: spread them over threads, then sort.
    let work: Vec<(usize, usize, u64)> = (0..designs.len())
        .flat_map(|d| {
            (0..args.size.len()).flat_map(move |s| (0..args.sweeps).map(move |i| (d, s, i)))
        })
        .collect();
    let next = AtomicUsize::new(0);
    let found: Mutex<Vec<Found>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                while let Some(&(d, s, i)) = work.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let hit = seeds_to_catch(designs[d], args.size[s], i, args.max_seeds);
                    found.lock().unwrap_or_else(|e| e.into_inner()).push(((d, s, i), hit));
                }
            });
        }
    });
    let mut found = found.into_inner().unwrap_or_else(|e| e.into_inner());
    found.sort_unstable();
    let shown = |n: Option<u64>| n.map_or(format!("> {}", args.max_seeds), |n| n.to_string());
    let mut header = String::from("| broken design | violation |");
    let mut rule = String::from("|---|---|");
    for s in &args.size {
        header.push_str(&format!(" {} median / worst |", super::value_name(s)));
        rule.push_str("---|");
    }
    println!("{header} shrunk counterexample (keys, events, faults) |");
    println!("{rule}---|");
    let mut all_caught = true;
    for (d, b) in designs.iter().enumerate() {
        let mut row = format!("| `{}` | {} |", b.name(), b.expected());
        for s in 0..args.size.len() {
            // `None` (not caught) sorts first; count it as the worst.
            let mut needed: Vec<u64> = found
                .iter()
                .filter(|((fd, fs, _), _)| *fd == d && *fs == s)
                .map(|(_, n)| n.unwrap_or(u64::MAX))
                .collect();
            needed.sort_unstable();
            all_caught &= needed.iter().all(|n| *n != u64::MAX);
            let some = |n: u64| (n != u64::MAX).then_some(n);
            let median = needed.get(needed.len() / 2).copied().and_then(some);
            let worst = needed.last().copied().and_then(some);
            row.push_str(&format!(" {} / {} |", shown(median), shown(worst)));
        }
        let shrunk =
            std::fs::read_to_string(args.regressions.join(format!("break-{}.json", b.name())))
                .ok()
                .and_then(|t| Regression::from_json(&t).ok())
                .map_or("not saved".to_owned(), |c| {
                    let (k, e, f) = size(&c.scenario);
                    format!("{k}, {e}, {f}")
                });
        println!("{row} {shrunk} |");
    }
    Ok(if all_caught { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
