//! `tokenmeter healthcheck`: one GET to a probe URL, exit status 0 on a 200. For container
//! healthchecks in images that have no curl.

use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Flags of `tokenmeter healthcheck`.
#[derive(Debug, clap::Args)]
pub struct HealthcheckArgs {
    /// The probe to ask (`https://` is checked against the public roots, or `--ca-file`).
    #[arg(long, default_value = "http://127.0.0.1:8080/stats/healthz")]
    pub url: String,
    /// CA certificates (PEM) to trust for an `https://` URL.
    #[arg(long)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
}

/// Asks the probe; an error (exit status 1) unless it answers 200 in time.
pub async fn run_cli(args: HealthcheckArgs) -> anyhow::Result<()> {
    let uri: http::Uri = args
        .url
        .parse()
        .with_context(|| format!("`{}` is not a URL", args.url))?;
    let timeout = Duration::from_millis(args.timeout_ms);
    let tls = crate::tls::UpstreamTlsConfig {
        ca_file: args.ca_file.clone(),
        ..Default::default()
    };
    let connector = crate::tls::upstream_connector(&tls, timeout)?;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let resp = tokio::time::timeout(timeout, client.get(uri))
        .await
        .with_context(|| format!("{}: no answer within {} ms", args.url, args.timeout_ms))?
        .with_context(|| format!("{}: cannot connect", args.url))?;
    if resp.status() != http::StatusCode::OK {
        bail!("{}: status {}", args.url, resp.status());
    }
    Ok(())
}
