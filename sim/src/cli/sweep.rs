//! `keyorder-sim sweep`: many seeds with a progress bar, then a summary table or JSON.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keyorder_sim::sweep::{sweep, Report, Shard, Summary};

use super::ScenarioSource;

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Run only the K-th of N disjoint slices of the seeds (every N-th seed, from the K-th),
    /// for one machine of N; `keyorder-sim merge` adds the N `--json` reports up.
    #[arg(long, value_name = "K/N")]
    shard: Option<Shard>,
    #[command(flatten)]
    source: ScenarioSource,
    /// Threads to run seeds on (each run stays deterministic); 0 means one per core.
    #[arg(long, default_value_t = 0)]
    jobs: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Do not write the HTML timeline of the first failing seed.
    #[arg(long)]
    no_html: bool,
}

pub fn run(args: SweepArgs) -> anyhow::Result<ExitCode> {
    let loaded = args.source.load()?;
    let seeds: Vec<u64> = match args.shard {
        Some(shard) => shard.seeds(args.start, args.seeds),
        None => (args.start..args.start.saturating_add(args.seeds)).collect(),
    };
    let jobs = match args.jobs {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let bar = progress_bar(seeds.len() as u64, args.json);
    #[allow(clippy::disallowed_methods)] // wall time of the sweep, reported; never simulated
    let started = std::time::Instant::now();
    let scenario_for = |seed| args.source.for_seed(&loaded, seed);
    let plain = !args.json && !std::io::stderr().is_terminal();
    let total = seeds.len() as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let outcomes = sweep(&seeds, &scenario_for, jobs, &|o| {
        bar.inc(1);
        if !o.verdict.is_ok() {
            bar.println(format!("seed {} VIOLATED: {:?}", o.seed, o.verdict.violated()));
        }
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        // Not a terminal: a plain line at every tenth of the sweep instead of a bar.
        if plain && (n * 10 / total.max(1) != (n - 1) * 10 / total.max(1) || n == total) {
            eprintln!("progress: {n}/{total} seeds");
        }
    })?;
    bar.finish_and_clear();
    let wall = started.elapsed();
    // The threads that had a seed to run (a sweep of one seed uses one, whatever --jobs says).
    let jobs = jobs.min(seeds.len()).max(1);
    let mut summary = Summary::default();
    outcomes.iter().for_each(|o| summary.add(o));
    if args.json {
        let report = Report {
            summary: summary.clone(),
            source: args.source.flags(),
            start: args.start,
            seeds: args.seeds,
            shard: args.shard,
        };
        print_json(&report, wall, jobs)?;
    } else {
        print_table(&summary, wall, jobs);
    }
    for seed in &summary.failed_seeds {
        eprintln!("replay: keyorder-sim replay {seed} {}", args.source.flags());
    }
    if let (Some(&seed), false) = (summary.failed_seeds.first(), args.no_html) {
        // The first failure as a picture, beside its replay command (one file: a sweep of a
        // broken design fails on most seeds).
        let path = std::path::PathBuf::from(format!("keyorder-sim-seed-{seed}.html"));
        super::write_timeline(&scenario_for(seed), seed, &path)?;
        eprintln!(
            "timeline: {} (keyorder-sim replay {seed} {} --html FILE)",
            path.display(),
            args.source.flags()
        );
    }
    Ok(if summary.failed_seeds.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn progress_bar(len: u64, json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        // Not a terminal: no bar, and no periodic lines either (the summary follows).
        return ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{bar:40} {pos}/{len} seeds  {per_sec}  eta {eta}")
    {
        bar.set_style(style);
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Simulated seconds per wall second per thread: how much faster than real time one core
/// simulates (the figure TigerBeetle's VOPR publishes as time acceleration).
fn acceleration(s: &Summary, wall: Duration, jobs: usize) -> f64 {
    let simulated = s.simulated_ms as f64 / 1000.0;
    simulated / wall.as_secs_f64().max(1e-9) / jobs.max(1) as f64
}

/// The report (what `merge` reads back) and, beside it, the figures of this machine's run.
fn print_json(report: &Report, wall: Duration, jobs: usize) -> anyhow::Result<()> {
    let s = &report.summary;
    let mut json = serde_json::to_value(report)?;
    if let Some(object) = json.as_object_mut() {
        let replay: Vec<String> = s.failed_seeds.iter().map(|&seed| report.replay(seed)).collect();
        object.insert("replay".into(), replay.into());
        object.insert("simulated_seconds".into(), (s.simulated_ms as f64 / 1000.0).into());
        object.insert("wall_seconds".into(), wall.as_secs_f64().into());
        object.insert("jobs".into(), jobs.into());
        object.insert("acceleration_per_thread".into(), acceleration(s, wall, jobs).into());
    }
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(())
}

fn print_table(s: &Summary, wall: Duration, jobs: usize) {
    let secs = wall.as_secs_f64().max(1e-9);
    println!("runs                      {}", s.runs);
    println!("events                    {}", s.events);
    println!("simulated deliveries      {}", s.deliveries);
    println!("simulated time            {:.1} s", s.simulated_ms as f64 / 1000.0);
    for (kind, n) in &s.faults {
        println!("fault {kind:<19} {n}");
    }
    for (kind, n) in &s.counted {
        println!("counted {kind:<17} {n}");
    }
    for (kind, n) in &s.violations {
        println!("violation {kind:<15} {n}");
    }
    println!("violations                {}", s.violation_total());
    println!("runs not drained in time  {}", s.unquiesced_seeds.len());
    println!("wall time                 {secs:.2} s on {jobs} thread(s)");
    println!("deliveries per wall second {:.0}", s.deliveries as f64 / secs);
    println!("seeds per minute          {:.0}", s.runs as f64 * 60.0 / secs);
    println!("time acceleration         {:.0}x per thread", acceleration(s, wall, jobs));
    if s.failed_seeds.is_empty() {
        println!("result                    OK: no violation in {} runs", s.runs);
    } else {
        println!("result                    VIOLATED in seeds {:?}", s.failed_seeds);
    }
}
