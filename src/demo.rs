//! `tokenmeter demo`: the simulator and the proxy in one process, with optional synthetic agents,
//! so a newcomer sees tokenmeter measure something with one command and no GPU.

use std::time::Duration;

use anyhow::Context;

use crate::config::ServeConfig;
use crate::load::agents::{start_traffic, Traffic};
use crate::load::{api::MIX, AgentSpec, Api, Arrivals, ChatSpec, HttpClient};
use crate::sim::SimConfig;

/// The synthetic agents' traffic: `load --agents N --api mix --stream-share 0.7` with `load`'s
/// default shape (think 200..3000 ms, prompts of 10..2000 words, 20..300 output tokens). Agent i
/// speaks the (i mod 4)-th API of [`MIX`], so a team of four has a chat client, a Codex-style
/// Responses agent, a Claude-Code-style Messages agent and a completions tool.
pub fn demo_agents() -> AgentSpec {
    AgentSpec {
        apis: MIX.to_vec(),
        stream_share: 0.7,
        ..AgentSpec::default()
    }
}

/// Starts `n` synthetic agents against the proxy at `base`; their results are dropped (the
/// proxy measures them).
fn start_agents(base: &str, n: usize) -> Traffic {
    let client = HttpClient::new(base.to_owned(), None, None, Duration::from_secs(600));
    let chat = ChatSpec {
        api: Api::Chat,
        model: SimConfig::default().served_model_name,
        prompt: String::new(),
        max_tokens: 1,
        stream: true,
        ignore_eos: false,
    };
    start_traffic(
        &client,
        &chat,
        None,
        Arrivals::Agents { agents: n },
        &demo_agents(),
    )
}

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

/// What ends the demo.
enum Until {
    /// `--duration-s`.
    Elapsed(Duration),
    /// SIGTERM or SIGINT (Ctrl-C).
    Signal(crate::signals::Signals),
}

/// Runs the demo until Ctrl-C (or `--duration-s`).
pub async fn run_cli(args: DemoArgs) -> anyhow::Result<()> {
    // The handlers before the "listening on" lines, like serve's (crate::signals says why);
    // with `--duration-s` none, so a signal keeps its default action.
    let until = match args.duration_s {
        Some(s) => Until::Elapsed(Duration::from_secs(s)),
        None => Until::Signal(crate::signals::Signals::install(true)),
    };
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
    let proxy = crate::app::spawn(config, Vec::new()).await?;
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
    let mut agents = if args.agents > 0 {
        let apis: Vec<&str> = (0..args.agents.min(MIX.len()))
            .map(|i| MIX[i].as_str())
            .collect();
        println!(
            "{} synthetic agents are sending requests (varied prompts, some streaming; APIs: {}); Ctrl-C stops.",
            args.agents,
            apis.join(", ")
        );
        let mut traffic = start_agents(&base, args.agents);
        // The proxy measures the answers; the agents' own results are not kept.
        let drain = async move {
            while traffic.results.recv().await.is_some() {}
            traffic
        };
        Some(tokio::spawn(drain))
    } else {
        println!("No synthetic agents (--agents 0); Ctrl-C stops.");
        None
    };
    let ticker = tokio::spawn(report_every_10s(proxy.meter().clone()));
    match until {
        Until::Elapsed(d) => tokio::time::sleep(d).await,
        Until::Signal(signals) => signals.wait(|| {}).await,
    }
    if let Some(a) = agents.take() {
        // Aborting the drain drops the traffic, which cancels the agents and their requests.
        a.abort();
        let _ = a.await;
    }
    ticker.abort();
    proxy.shutdown().await;
    sim.shutdown().await;
    Ok(())
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
