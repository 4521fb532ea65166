//! `tokenmeter serve` as a command: config loading (or `--check-config`), the signals
//! (SIGTERM/SIGINT stop, SIGHUP reopens the log and reloads), and the reload's report.

use super::{spawn, ProxyHandle};
use crate::config::ServeArgs;
use crate::signals::Signals;

/// Runs `tokenmeter serve` until SIGTERM or SIGINT; SIGHUP reopens the access log.
pub async fn run_cli(args: ServeArgs) -> anyhow::Result<()> {
    if args.check_config {
        let config = crate::config::check(&args, std::env::vars())?;
        // A TOML comment first, so that the whole output is a config file again.
        use std::io::Write as _;
        // A closed stdout (`| head`) is not an error worth a panic.
        let _ = writeln!(std::io::stdout(), "# config ok\n{}", config.to_toml()?);
        return Ok(());
    }
    let config = crate::config::load(&args, std::env::vars())?;
    let upstream = config.upstream_label();
    // Before the "listening on" line: a SIGTERM sent on seeing it must drain, not kill.
    let signals = Signals::install(true);
    let handle = spawn(config, Vec::new()).await?;
    tracing::info!(upstream = %upstream, "listening on {}", handle.addr());
    if let Some(a) = handle.admin_addr() {
        tracing::info!("stats listening on {a}");
    }
    tracing::info!("dashboard at {}", handle.dashboard_url());
    signals
        .wait(|| {
            handle.reopen_access_log();
            reload_from(&handle, &args);
        })
        .await;
    handle.shutdown().await;
    Ok(())
}

/// Reads the configuration again (file, environment, flags) and applies what can change while
/// serving; a file that does not load is rejected whole, with the reason, and nothing changes.
fn reload_from(handle: &ProxyHandle, args: &ServeArgs) {
    let new = match crate::config::load(args, std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            // Every problem on the one log line (the startup error lists them one per line).
            let why = format!("{e:#}").replace("\n  ", " | ");
            tracing::error!("reload rejected, the running configuration stays: {why}");
            return;
        }
    };
    let report = handle.reload(&new);
    if !report.need_restart.is_empty() {
        tracing::warn!(
            settings = %report.need_restart.join(", "),
            "reload: these changed settings need a restart; their running values stay"
        );
    }
    if let Some(e) = &report.tls_error {
        tracing::error!("reload: the TLS certificate stays as it was: {e}");
    }
    tracing::info!(applied = %report.applied.join(", "), "configuration reloaded");
}
