//! The `tokenmeter` binary: parses the command line and hands each subcommand to the library.

use clap::Parser;
use tokenmeter::cli::{exit_code, LogFormat};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Usage errors exit with 2 from inside `parse`, before anything is logged.
    let cli = tokenmeter::cli::Cli::parse();
    init_logging(cli.log_format);
    match tokenmeter::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokenmeter: {e:#}");
            std::process::ExitCode::from(exit_code(&e))
        }
    }
}

/// The process log on stderr: `TOKENMETER_LOG`, else `RUST_LOG`, else `info`; one JSON object per
/// line with `json`, else human-readable text (coloured only on a terminal).
fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("TOKENMETER_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
}
