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
    /// Write the proxy's access log here (default: tokenmeter-demo-<pid>.jsonl in the temporary
    /// directory, named at the start and in the closing summary).
    #[arg(long)]
    pub access_log: Option<std::path::PathBuf>,
    /// Write the simulator's record of every request it finished here (its own timings: the
    /// truth `tokenmeter analyze LOG --sim-truth FILE` compares the log's service level with).
    #[arg(long)]
    pub sim_truth_log: Option<std::path::PathBuf>,
    /// Write the final `/stats` document here (taken when the agents have stopped, before the
    /// proxy does), to compare the live figures with `analyze` of the log.
    #[arg(long)]
    pub final_stats: Option<std::path::PathBuf>,
    /// Stop after this long, e.g. 100s, 2m (default: run until Ctrl-C); spelled as `load
    /// --duration` (`--duration-s N`, seconds, still works).
    #[arg(long, alias = "duration-s", value_parser = crate::load::duration::parse_duration)]
    pub duration: Option<Duration>,
}

/// What ends the demo.
enum Until {
    /// `--duration`.
    Elapsed(Duration),
    /// SIGTERM or SIGINT (Ctrl-C).
    Signal(crate::signals::Signals),
}

/// Runs the demo until Ctrl-C (or `--duration`).
pub async fn run_cli(args: DemoArgs) -> anyhow::Result<()> {
    // The handlers before the "listening on" lines, like serve's (crate::signals says why);
    // with `--duration` none, so a signal keeps its default action.
    let until = match args.duration {
        Some(d) => Until::Elapsed(d),
        None => Until::Signal(crate::signals::Signals::install(true)),
    };
    let sim_listener = tokio::net::TcpListener::bind(&args.sim_listen)
        .await
        .with_context(|| format!("binding {}", args.sim_listen))?;
    // Cached prompt tokens reported in every API's usage, so the proxy's cache audit has them.
    let sim_config = SimConfig {
        enable_prompt_tokens_details: true,
        truth_log: args.sim_truth_log.clone(),
        ..SimConfig::default()
    };
    let sim = crate::sim::spawn(sim_config, sim_listener).await?;
    // Always a log: the summary ends with the `analyze` command to run on it.
    let log = args.access_log.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("tokenmeter-demo-{}.jsonl", std::process::id()))
    });
    let config = ServeConfig {
        listen: args.listen.clone(),
        upstream: format!("http://{}", sim.addr()),
        access_log: Some(log.clone()),
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
    println!("  access log      : {}", log.display());
    if let Some(t) = &args.sim_truth_log {
        println!("  simulator truth : {}", t.display());
    }
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
    let started = std::time::Instant::now();
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
    let run_s = started.elapsed().as_secs_f64();
    // The meter's figures before it stops; the log's lines once the drain has written them all.
    let now = crate::clock::Clock::global().now();
    let snap = proxy
        .meter()
        .snapshot(now, Default::default(), "", &Default::default())
        .await
        .ok()
        .and_then(|s| serde_json::to_value(&s).ok());
    if let (Some(path), Some(v)) = (&args.final_stats, &snap) {
        let text = serde_json::to_vec_pretty(v)?;
        std::fs::write(path, text)
            .with_context(|| format!("--final-stats: writing {}", path.display()))?;
    }
    proxy.shutdown().await;
    sim.shutdown().await;
    let records = std::fs::read_to_string(&log)
        .map(|t| t.lines().count())
        .unwrap_or(0);
    println!();
    for line in summary(snap.as_ref(), run_s, &log, records) {
        println!("{line}");
    }
    Ok(())
}

/// The closing summary: one screen of the figures the demo measured, one line each, the
/// capacity at the service level first among them. `snap` is the final `/stats` document
/// (`None` when the meter did not answer), `run_s` how long the demo ran, `records` the lines
/// the access log at `log` holds.
pub fn summary(
    snap: Option<&serde_json::Value>,
    run_s: f64,
    log: &std::path::Path,
    records: usize,
) -> Vec<String> {
    let mut out = vec![format!("tokenmeter demo: summary of {run_s:.1} s")];
    match snap {
        Some(v) => {
            let sl = &v["service_level"];
            if let Some(text) = sl["capacity"]["text"].as_str() {
                out.push(format!("  capacity        : at the service level, {text}"));
                out.push(format!(
                    "                    ({})",
                    sl["objective_text"].as_str().unwrap_or("")
                ));
            }
            let t = &v["totals"];
            out.push(format!(
                "  requests        : {} finished, {} generated tokens, {} errors of the server",
                t["requests"].as_u64().unwrap_or(0),
                t["completion_tokens"].as_u64().unwrap_or(0),
                t["errors"].as_u64().unwrap_or(0)
            ));
            out.extend(user_rates(v, run_s));
        }
        None => out.push("  requests        : the meter did not answer".into()),
    }
    out.push(format!(
        "  access log      : {} ({records} records)",
        log.display()
    ));
    out.push(format!(
        "  analyze it      : tokenmeter analyze {} --html report.html",
        log.display()
    ));
    out
}

/// Per user: finished requests, generated tokens and their rate averaged over the run
/// (completion tokens / run time), fastest first; at most 8 users, and how many more there were.
fn user_rates(v: &serde_json::Value, run_s: f64) -> Vec<String> {
    const SHOWN: usize = 8;
    let Some(users) = v["users"].as_object() else {
        return Vec::new();
    };
    let mut rows: Vec<(&str, u64, u64)> = users
        .iter()
        .map(|(name, u)| {
            let t = &u["totals"];
            (
                name.as_str(),
                t["requests"].as_u64().unwrap_or(0),
                t["completion_tokens"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    rows.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
    let mut out = vec![format!(
        "  per user        : generated tok/s averaged over the run (tokens / {run_s:.1} s)"
    )];
    for (name, requests, tokens) in rows.iter().take(SHOWN) {
        let rate = if run_s > 0.0 {
            format!("{:.1}", *tokens as f64 / run_s)
        } else {
            "n/a".into()
        };
        out.push(format!(
            "    {name:<14} {rate:>8} tok/s  {tokens:>7} tokens  {requests:>5} requests"
        ));
    }
    if rows.len() > SHOWN {
        out.push(format!("    … and {} more users", rows.len() - SHOWN));
    }
    if rows.is_empty() {
        out.push("    (no requests)".into());
    }
    out
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
        // The headline, as /stats gives it: "not known yet: …" and "at least N (not reached)"
        // until a level misses.
        let capacity = format!(
            "; capacity at the service level: {}",
            snap.service_level.capacity.text
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_the_rates_the_log_and_the_command() {
        let snap = serde_json::json!({
            "totals": {"requests": 5, "completion_tokens": 300, "errors": 0},
            "service_level": {
                "capacity": {"text": "at least 2 (not reached)"},
                "objective_text": "TTFT ≤ 1000 ms"
            },
            "users": {
                "agent-0": {"totals": {"requests": 2, "completion_tokens": 100}},
                "agent-1": {"totals": {"requests": 3, "completion_tokens": 200}},
            }
        });
        let log = std::path::Path::new("/tmp/x.jsonl");
        let lines = summary(Some(&snap), 10.0, log, 5);
        let text = lines.join("\n");
        assert!(lines.len() <= 24, "one screen: {text}");
        let a1 = lines.iter().position(|l| l.contains("agent-1")).unwrap();
        let a0 = lines.iter().position(|l| l.contains("agent-0")).unwrap();
        assert!(a1 < a0, "fastest first: {text}");
        assert!(lines[a1].contains("20.0 tok/s"), "{text}");
        assert!(
            lines[1].contains("at the service level, at least 2 (not reached)"),
            "the capacity answer first: {text}"
        );
        assert!(text.contains("/tmp/x.jsonl (5 records)"), "{text}");
        assert!(text.contains("tokenmeter analyze /tmp/x.jsonl"), "{text}");
    }
}
