//! `tokenmeter load`: load generator (stub).

/// Arguments of `tokenmeter load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {}

/// Runs the load.
pub async fn run_cli(_args: LoadArgs) -> anyhow::Result<()> {
    anyhow::bail!("load: not built yet")
}
