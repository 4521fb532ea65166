//! Command-line interface: one subcommand per job, each defined beside the code it runs.

use clap::{Parser, Subcommand};

/// tokenmeter: measure what a vLLM server really delivers, from the traffic it serves.
#[derive(Debug, Parser)]
#[command(name = "tokenmeter", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
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
}

/// Runs the parsed command line to completion.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => crate::proxy::run_cli(args).await,
        Command::Demo(args) => crate::demo::run_cli(args).await,
        Command::Sim(args) => crate::sim::run_cli(args).await,
        Command::Load(args) => crate::load::run_cli(args).await,
        Command::Analyze(args) => crate::analyze::run_cli(args).await,
    }
}
