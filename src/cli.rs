//! Command-line interface: one subcommand per job, each defined beside the code it runs.

use clap::{Parser, Subcommand};

/// tokenmeter: measure what a vLLM server really delivers, from the traffic it serves.
#[derive(Debug, Parser)]
#[command(name = "tokenmeter", version, about)]
pub struct Cli {
    /// Process-log format on stderr: `text`, or `json` for one JSON object per line.
    #[arg(long, global = true, env = "TOKENMETER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// How process-log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `message` and the fields).
    Json,
}

/// Exit status of a run that failed: 2 when the command line or the configuration is invalid
/// (as for clap's usage errors), 1 for anything else (a port in use, an unreadable file, ...).
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if err.downcast_ref::<crate::config::InvalidConfig>().is_some() {
        2
    } else {
        1
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The measuring proxy: forwards everything to vLLM and measures every generation.
    Serve(crate::config::ServeArgs),
    /// The simulator and the proxy in one process, with synthetic agents: see it work.
    Demo(crate::demo::DemoArgs),
    /// A vLLM stand-in with continuous batching, vLLM's wire format and /metrics.
    Sim(crate::sim::SimArgs),
    /// Load generator: the burst sweep and the sustained method, against any OpenAI-compatible URL.
    Load(crate::load::LoadArgs),
    /// The capacity report from access logs.
    Analyze(crate::analyze::AnalyzeArgs),
    /// One GET to a health probe; exit status 0 on a 200 (for container healthchecks).
    Healthcheck(crate::probe::HealthcheckArgs),
}

/// Runs the parsed command line to completion.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => crate::app::serve_cli::run_cli(args).await,
        Command::Demo(args) => crate::demo::run_cli(args).await,
        Command::Sim(args) => crate::sim::run_cli(args).await,
        Command::Load(args) => crate::load::run_cli(args).await,
        Command::Analyze(args) => crate::analyze::run_cli(args).await,
        Command::Healthcheck(args) => crate::probe::run_cli(args).await,
    }
}
