//! `tokenmeter demo`: the simulator and the proxy in one process, with optional synthetic agents,
//! so a newcomer sees tokenmeter measure something with one command and no GPU.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use rand::{rngs::SmallRng, Rng, SeedableRng};

use crate::config::ServeConfig;
use crate::load::Api;
use crate::sim::SimConfig;

/// The APIs the synthetic agents speak, by agent index: a team whose agents differ (a chat client,
/// a Codex-style Responses agent, a Claude-Code-style Messages agent, a completions tool).
const AGENT_APIS: [Api; 4] = [Api::Chat, Api::Responses, Api::Messages, Api::Completions];

/// Arguments of `tokenmeter demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Proxy address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Simulator address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub sim_listen: String,
    /// Synthetic agents sending requests through the proxy (0: none, send your own).
    #[arg(long, default_value_t = 4)]
    pub agents: usize,
    /// Write the proxy's access log here.
    #[arg(long)]
    pub access_log: Option<std::path::PathBuf>,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    pub duration_s: Option<u64>,
}

/// Runs the demo until Ctrl-C (or `--duration-s`).
pub async fn run_cli(args: DemoArgs) -> anyhow::Result<()> {
    let sim_listener = tokio::net::TcpListener::bind(&args.sim_listen)
        .await
        .with_context(|| format!("binding {}", args.sim_listen))?;
    let sim = crate::sim::spawn(SimConfig::default(), sim_listener).await?;
    let config = ServeConfig {
        listen: args.listen.clone(),
        upstream: format!("http://{}", sim.addr()),
        access_log: args.access_log.clone(),
        // Show the cross-check too: the simulator serves vLLM's /metrics.
        upstream_metrics_url: Some("auto".into()),
        ..ServeConfig::default()
    };
    let proxy = crate::proxy::spawn(config, Vec::new()).await?;
    let base = format!("http://{}", proxy.addr());
    tracing::info!("simulator (vLLM stand-in) listening on {}", sim.addr());
    tracing::info!("listening on {}", proxy.addr());
    println!(
        "tokenmeter demo: a simulated vLLM at http://{} behind the proxy at {base}",
        sim.addr()
    );
    println!();
    println!("  OpenAI base URL : {base}/v1");
    println!("  dashboard       : {}", proxy.dashboard_url());
    println!("  live stats      : {base}/stats   (Prometheus: {base}/stats/metrics)");
    println!("  try             : curl -sN {base}/v1/chat/completions -H 'content-type: application/json' \\");
    println!("                      -H 'x-tokenmeter-user: me' -d '{{\"model\":\"sim-model\",\"stream\":true,\"max_tokens\":20,\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}]}}'");
    println!();
    if args.agents > 0 {
        let apis: Vec<&str> = (0..args.agents.min(AGENT_APIS.len()))
            .map(|i| AGENT_APIS[i].as_str())
            .collect();
        println!(
            "{} synthetic agents are sending requests (varied prompts, some streaming; APIs: {}); Ctrl-C stops.",
            args.agents,
            apis.join(", ")
        );
    } else {
        println!("No synthetic agents (--agents 0); Ctrl-C stops.");
    }
    let agents: Vec<_> = (0..args.agents)
        .map(|i| tokio::spawn(agent(proxy.addr(), i)))
        .collect();
    let ticker = tokio::spawn(report_every_10s(proxy.meter().clone()));
    match args.duration_s {
        Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
        None => crate::proxy::serve_cli::wait_for_shutdown_signal(|| {}).await,
    }
    for a in agents {
        a.abort();
    }
    ticker.abort();
    proxy.shutdown().await;
    sim.shutdown().await;
    Ok(())
}

/// One synthetic agent: requests of varied size in its API ([`AGENT_APIS`]), streaming or not,
/// with think time between.
async fn agent(proxy: SocketAddr, index: usize) {
    let api = AGENT_APIS[index % AGENT_APIS.len()];
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut rng = SmallRng::seed_from_u64(index as u64 + 1);
    let user = format!("agent-{index}");
    loop {
        let words = rng.gen_range(10..2000);
        let prompt: String = (0..words)
            .map(|w| if w % 7 == 0 { "fn " } else { "code " })
            .collect();
        let stream = rng.gen_bool(0.7);
        let max_tokens = rng.gen_range(20..300);
        let body =
            crate::load::api::body(api, "sim-model", &prompt, max_tokens, stream, false, None);
        let mut req = http::Request::post(format!("http://{proxy}{}", crate::load::api::path(api)))
            .header("content-type", "application/json")
            .header("x-tokenmeter-user", &user);
        if api == Api::Messages {
            req = req.header("anthropic-version", "2023-06-01");
        }
        let req = req.body(Full::new(Bytes::from(body)));
        if let Ok(req) = req {
            if let Ok(resp) = client.request(req).await {
                let _ = resp.into_body().collect().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(200..3000))).await;
    }
}

/// Prints the 10 s window every 10 s, so the demo shows what `/stats` holds.
async fn report_every_10s(meter: crate::meter::MeterHandle) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = crate::clock::Clock::global().now();
        let q = crate::meter::SnapshotQuery {
            user: None,
            window: Some("10s".into()),
        };
        let Ok(snap) = meter.snapshot(now, q, "", &Default::default()).await else {
            return;
        };
        // The best-founded row of the production-traffic curve: the level with the most time.
        let capacity = snap
            .capacity_production
            .iter()
            .filter(|r| !r.thin)
            .max_by(|a, b| a.seconds.total_cmp(&b.seconds))
            .and_then(|r| {
                r.gen_tok_s.map(|g| {
                    format!(
                        "; capacity at {} in flight: {g:.1} tok/s ({:.0} s measured)",
                        r.in_flight, r.seconds
                    )
                })
            })
            .unwrap_or_default();
        let v = serde_json::to_value(&snap).unwrap_or_default();
        let w = &v["windows"]["10s"];
        println!(
            "last 10 s: {:.1} tok/s generated, {} requests finished, in flight {}..{}{}; users {}{capacity}",
            w["gen_tok_s"].as_f64().unwrap_or(0.0),
            w["requests_finished"].as_u64().unwrap_or(0),
            w["in_flight"]["min"].as_u64().unwrap_or(0),
            w["in_flight"]["max"].as_u64().unwrap_or(0),
            if w["steady"].as_bool() == Some(true) {
                " (steady)"
            } else {
                ""
            },
            v["users"]
                .as_object()
                .map(serde_json::Map::len)
                .unwrap_or(0),
        );
    }
}
