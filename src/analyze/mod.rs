//! `tokenmeter analyze FILE...`: the capacity report of one or more access logs.
//!
//! Pass 1 parses every input once, in parallel chunks, adding each selected record into
//! order-independent per-second sums ([`crate::meter::replay`]), per-level and per-user
//! histograms, and spilling 48 bytes per generation request to a temporary file ([`spill`]). The
//! sweep turns the sums into the timeline; pass 2 reads the spill and files each request's tok/s
//! under its exact mean in-flight level (a sweep in arrival order over the spill's sorted runs) for
//! the curve's per-request min/max. Memory follows the number of active seconds, levels, users and
//! the concurrency, never the number of lines (the spill is on disk).

mod build;
mod collect;
pub mod crosscheck;
mod drive;
pub mod filter;
mod grid;
pub mod html;
pub(crate) mod input;
pub(crate) mod kv;
pub(crate) mod parse;
mod production_sweep;
pub mod report;
mod service_table;
pub mod sessions;
pub(crate) mod spill;
pub(crate) mod steady;
pub mod svg;
mod svg_parts;
mod svg_service;
pub mod synth;
pub mod tables;

use std::io::Write;
use std::path::PathBuf;

use crate::clock::{Clock, UnixNanos};
use crate::meter::replay::ReplayTimeline;

pub use filter::Filter;
pub use report::Report;

/// Arguments of `tokenmeter analyze`.
#[derive(Debug, Clone, clap::Args)]
pub struct AnalyzeArgs {
    /// Access logs (JSON lines, plain or gzip); `-` reads stdin.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Only requests that arrived at or after this time (RFC 3339, or relative: -2h, -30m).
    #[arg(long, allow_hyphen_values = true)]
    pub from: Option<String>,
    /// Only requests that arrived before this time (RFC 3339, or relative).
    #[arg(long, allow_hyphen_values = true)]
    pub to: Option<String>,
    /// Only this user (repeatable).
    #[arg(long)]
    pub user: Vec<String>,
    /// Only this model (repeatable).
    #[arg(long)]
    pub model: Vec<String>,
    /// Only this upstream replica, by the name in the lines' `upstream` (repeatable).
    #[arg(long)]
    pub upstream: Vec<String>,
    /// Shortest steady window reported, seconds.
    #[arg(long, default_value_t = 10)]
    pub steady_min_s: u64,
    /// A second is steady at its median level N when the mean |level - N| over it is at most
    /// this % of N (the live windows' `meter.steady_tolerance_pct`).
    #[arg(long, default_value_t = 5.0)]
    pub steady_tolerance_pct: f64,
    /// TTFT knee: first level whose p90 exceeds this factor x the p90 at the lowest level.
    #[arg(long, default_value_t = 2.0)]
    pub knee_factor: f64,
    /// Cross-check: flag a steady window whose proxy and server tok/s differ by more than this, %.
    #[arg(long, default_value_t = 5.0)]
    pub disagreement_threshold_pct: f64,
    /// Production-traffic curve: levels with fewer clean seconds are shown as thin (no rate).
    #[arg(long, default_value_t = 10)]
    pub capacity_min_s: u64,
    /// The serve config file whose `[slo]` table sets the service level (as the live proxy
    /// judged it); without it, the defaults.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// The simulator's per-request record (`tokenmeter demo --sim-truth-log`, `tokenmeter sim
    /// --truth-log`): the service level on the engine's own account is reported beside the
    /// log's (`sim_truth` in --json), judged against the same `[slo]`.
    #[arg(long)]
    pub sim_truth: Option<PathBuf>,
    /// With --json, include every active second.
    #[arg(long)]
    pub per_second: bool,
    /// Write service_level.svg, capacity.svg, ttft.svg and timeline.svg into this directory.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write one self-contained HTML page with all tables and plots.
    #[arg(long)]
    pub html: Option<PathBuf>,
}

/// What to analyse and how (the library form of the arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct AnalyzeOptions {
    /// Record selection.
    pub filter: Filter,
    /// Shortest steady window reported, seconds.
    pub steady_min_s: u64,
    /// Tolerant steadiness: mean |level - N| at most this % of N.
    pub steady_tolerance_pct: f64,
    /// TTFT knee factor.
    pub knee_factor: f64,
    /// Include every active second in the JSON.
    pub per_second: bool,
    /// Cross-check: disagreements beyond this percentage are flagged.
    pub disagreement_threshold_pct: f64,
    /// Production-traffic curve: levels with fewer clean seconds are thin.
    pub capacity_min_s: u64,
    /// The service level: judges records logged without a verdict, and sets the headline's
    /// target and thin mark (the `[slo]` table of `--config`, else the defaults).
    pub slo: crate::slo::SloConfig,
}

impl Default for AnalyzeOptions {
    fn default() -> Self {
        AnalyzeOptions {
            filter: Filter::default(),
            steady_min_s: 10,
            steady_tolerance_pct: 5.0,
            knee_factor: 2.0,
            per_second: false,
            disagreement_threshold_pct: 5.0,
            capacity_min_s: 10,
            slo: crate::slo::SloConfig::default(),
        }
    }
}

/// The `[slo]` table of a serve config file (other tables are not read here).
fn slo_of_config(path: &std::path::Path) -> anyhow::Result<crate::slo::SloConfig> {
    #[derive(serde::Deserialize)]
    struct SloOnly {
        #[serde(default)]
        slo: crate::slo::SloConfig,
    }
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config {}: cannot read it", path.display()))?;
    let c: SloOnly =
        toml::from_str(&text).with_context(|| format!("--config {}", path.display()))?;
    let problems = c.slo.problems();
    if !problems.is_empty() {
        anyhow::bail!("--config {}: {}", path.display(), problems.join("; "));
    }
    Ok(c.slo)
}

impl AnalyzeOptions {
    /// Options from the command line; relative times are relative to `now`.
    pub fn from_args(args: &AnalyzeArgs, now: UnixNanos) -> anyhow::Result<Self> {
        let bound = |s: &Option<String>| {
            s.as_deref()
                .map(|s| filter::parse_time_bound(s, now))
                .transpose()
        };
        Ok(AnalyzeOptions {
            filter: Filter {
                from: bound(&args.from)?,
                to: bound(&args.to)?,
                users: args.user.clone(),
                models: args.model.clone(),
                upstreams: args.upstream.clone(),
            },
            steady_min_s: args.steady_min_s,
            steady_tolerance_pct: args.steady_tolerance_pct,
            knee_factor: args.knee_factor,
            per_second: args.per_second,
            disagreement_threshold_pct: args.disagreement_threshold_pct,
            capacity_min_s: args.capacity_min_s,
            slo: match &args.config {
                Some(path) => slo_of_config(path)?,
                None => crate::slo::SloConfig::default(),
            },
        })
    }
}

/// Analyses the inputs (paths, `-` for stdin) into a report.
pub fn analyze(inputs: &[PathBuf], opts: &AnalyzeOptions) -> anyhow::Result<Report> {
    let sources: Vec<input::Source> = inputs.iter().map(|p| input::Source::open_arg(p)).collect();
    // A file that cannot be opened at all is a usage error; failures mid-file (a truncated gzip
    // member, an I/O error) are reported in `inputs.read_errors` with what was read before.
    for s in &sources {
        if let Some(path) = &s.path {
            std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", s.name))?;
        }
    }
    analyze_sources(&sources, opts)
}

/// Analyses already opened sources.
pub fn analyze_sources(sources: &[input::Source], opts: &AnalyzeOptions) -> anyhow::Result<Report> {
    let mut p1 = drive::pass1(sources, &opts.filter, &opts.slo)?;
    let replay = std::mem::take(&mut p1.replay);
    let timeline: ReplayTimeline = replay.finish();
    let pass2 = p1.pass2()?;
    // With several replicas in the lines, each gets its own capacity curve: the pipeline again
    // over that replica's records, so its levels are its own concurrency (one more pass over
    // the inputs per replica).
    let names: Vec<String> = p1.upstreams.keys().cloned().collect();
    let mut report = build::build(sources, p1, &timeline, &pass2, opts);
    if names.len() > 1 && opts.filter.upstreams.is_empty() {
        for name in names {
            let mut one = opts.clone();
            one.filter.upstreams = vec![name.clone()];
            let r = analyze_sources(sources, &one)?;
            report.upstreams.push(report::UpstreamCapacity {
                upstream: name,
                requests: r.summary.generation_requests,
                capacity: r.capacity,
            });
        }
    }
    Ok(report)
}

/// The service level from the simulator's per-request record at `path`, judged against `slo`
/// ([`crate::sim::request_log::service_level_truth`]).
pub fn sim_truth(
    path: &std::path::Path,
    slo: &crate::slo::SloConfig,
) -> anyhow::Result<report::SimTruth> {
    let records = crate::sim::request_log::read(path)?;
    Ok(report::SimTruth {
        file: path.display().to_string(),
        requests: records.len() as u64,
        service_level: crate::sim::request_log::service_level_truth(slo, &records, false),
    })
}

/// An input without a single request record is a mistake (the wrong file, or not an access log):
/// an error that says so, instead of a page of empty tables.
fn no_records(report: &Report) -> anyhow::Result<()> {
    let i = &report.inputs;
    if i.request_lines > 0 {
        return Ok(());
    }
    let mut why = format!("{} lines read", i.lines);
    if i.bad_lines > 0 {
        why.push_str(&format!(", {} of them bad", i.bad_lines));
        if let Some(first) = i.bad_positions.first() {
            why.push_str(&format!(" (first at {first})"));
        }
    }
    if i.other_lines > 0 {
        why.push_str(&format!(", {} of other types", i.other_lines));
    }
    anyhow::bail!("no request record found in the input ({why}); is it a tokenmeter access log?")
}

/// Runs `tokenmeter analyze`.
pub async fn run_cli(args: AnalyzeArgs) -> anyhow::Result<()> {
    let opts = AnalyzeOptions::from_args(&args, Clock::global().now())?;
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut report = analyze(&args.files, &opts)?;
        no_records(&report)?;
        if let Some(path) = &args.sim_truth {
            report.sim_truth = Some(sim_truth(path, &opts.slo)?);
        }
        if let Some(dir) = &args.svg {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("--svg: cannot create {}: {e}", dir.display()))?;
            for (name, svg) in svg::all(&report) {
                let path = dir.join(name);
                std::fs::write(&path, svg)
                    .map_err(|e| anyhow::anyhow!("--svg: cannot write {}: {e}", path.display()))?;
            }
        }
        if let Some(path) = &args.html {
            std::fs::write(path, html::page(&report))
                .map_err(|e| anyhow::anyhow!("--html: cannot write {}: {e}", path.display()))?;
        }
        let mut out = std::io::stdout().lock();
        if args.json {
            serde_json::to_writer_pretty(&mut out, &report)?;
            writeln!(out)?;
        } else {
            out.write_all(tables::render(&report).as_bytes())?;
        }
        out.flush()?;
        Ok(())
    });
    report.await?
}
