//! `tokenmeter sim`: a vLLM stand-in (stub until the simulator lands).

/// Arguments of `tokenmeter sim`.
#[derive(Debug, clap::Args)]
pub struct SimArgs {}

/// Runs the simulator until interrupted.
pub async fn run_cli(_args: SimArgs) -> anyhow::Result<()> {
    anyhow::bail!("sim: not built yet")
}
