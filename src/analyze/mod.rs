//! `tokenmeter analyze`: capacity report (stub).

/// Arguments of `tokenmeter analyze`.
#[derive(Debug, clap::Args)]
pub struct AnalyzeArgs {}

/// Runs the analysis.
pub async fn run_cli(_args: AnalyzeArgs) -> anyhow::Result<()> {
    anyhow::bail!("analyze: not built yet")
}
