//! `analyze` on the access log reproduces the live production-traffic curve (`/stats`
//! `capacity_production`) of the same run, over real sockets: the simulator behind the proxy,
//! driven by the demo's own agents (think 0.2–3 s, a third of the requests non-streamed, prompts
//! of 10–2,000 words, 20–300 output tokens, the four APIs), where arrivals are frequent and most
//! of the time is guarded. The comparison is of the same run's two views, so the machine's speed
//! changes the curve but not the agreement.
//!
//! Each check is also run on the same log with `token_curve` removed (lines written before the
//! field): the old spreading over `[TTFT, end]` must fail it, or the check proves nothing.
//!
//! `OFFLINE_S` sets the length of the by-hand run (`scripts/capacity_acceptance.sh` runs it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{env_u64, stats_now, TempDir, TestProxy};
use tokenmeter::analyze::{analyze, AnalyzeOptions, Report};
use tokenmeter::load::{Arrivals, LoadOptions, NoProgress};
use tokenmeter::meter::levels::ProductionRow;
use tokenmeter::sim::SimConfig;

/// One run: the live rows at its end, and the access log the proxy wrote.
struct Run {
    live: Vec<ProductionRow>,
    log: PathBuf,
    _dir: TempDir,
}

async fn run(agents: usize, secs: u64) -> Run {
    let sim = crate::common::start_sim(SimConfig {
        resync_lag_ms: 100.0,
        ..SimConfig::default()
    })
    .await;
    let mut proxy = TestProxy::start(&format!("http://{}", sim.addr()), |_| {}).await;
    let opts = LoadOptions::agents(
        format!("http://{}", proxy.addr),
        Arrivals::Agents { agents },
        tokenmeter::demo::demo_agents(),
        Duration::from_secs(secs),
    );
    tokenmeter::load::run(opts, NoProgress).await.unwrap();
    let handle = proxy.handle.take().unwrap();
    // Every request has ended (the load waits for its agents): the live curve is final.
    let live = stats_now(handle.meter()).await.capacity_production;
    handle.shutdown().await;
    sim.shutdown().await;
    let dir = TempDir::new("offline-live");
    let log = dir.0.join("access.jsonl");
    std::fs::copy(&proxy.log_path, &log).unwrap();
    Run {
        live,
        log,
        _dir: dir,
    }
}

/// The same log with `token_curve` taken out of every line.
fn without_curves(log: &Path) -> PathBuf {
    let out = log.with_file_name("no-curves.jsonl");
    let text: String = std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("token_curve");
            format!("{v}\n")
        })
        .collect();
    std::fs::write(&out, text).unwrap();
    out
}

/// The levels with at least `min_s` clean seconds live, each as (N, live, offline tok/s, error),
/// printed; the largest error's magnitude.
fn compare(title: &str, live: &[ProductionRow], offline: &Report, min_s: f64) -> (usize, f64) {
    println!(
        "{title}\n| N | live clean s | offline clean s | live tok/s | offline tok/s | diff % |"
    );
    println!("|---|---|---|---|---|---|");
    let (mut checked, mut worst) = (0, 0.0f64);
    for l in live.iter().filter(|r| r.seconds >= min_s) {
        let o = offline
            .capacity_production
            .iter()
            .find(|o| o.in_flight == l.in_flight);
        // Rates from time and tokens, so levels under the thin mark compare too.
        let rate = |r: &ProductionRow| r.tokens / r.seconds;
        let (o_s, o_rate) = o.map_or((0.0, 0.0), |o| (o.seconds, rate(o)));
        let d = o_rate / rate(l) - 1.0;
        println!(
            "| {} | {:.2} | {o_s:.2} | {:.1} | {o_rate:.1} | {:+.2} |",
            l.in_flight,
            l.seconds,
            rate(l),
            d * 100.0
        );
        // Clean time is rebuilt from the same arrivals, first tokens and ends (to the ms).
        assert!(
            (o_s / l.seconds - 1.0).abs() < 0.005,
            "level {}: offline clean {o_s} s vs live {} s",
            l.in_flight,
            l.seconds
        );
        checked += 1;
        worst = worst.max(d.abs());
    }
    (checked, worst)
}

/// Bytes `token_curve` adds to a line, on average over every line of `log`.
fn curve_bytes_per_line(log: &Path) -> f64 {
    let text = std::fs::read_to_string(log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let field: usize = lines
        .iter()
        .map(|v| ",\"token_curve\":".len() + v["token_curve"].to_string().len())
        .sum();
    field as f64 / lines.len() as f64
}

/// Live against offline, with curves and without; returns the levels checked.
fn check(r: &Run, min_s: f64) -> usize {
    let opts = AnalyzeOptions::default();
    let with = analyze(std::slice::from_ref(&r.log), &opts).unwrap();
    let placed = with.capacity_production_tokens;
    println!(
        "token placement: {placed:?}; token_curve adds {:.1} bytes per line on average",
        curve_bytes_per_line(&r.log)
    );
    assert!(placed.token_curve > 0 && placed.no_first_token > 0);
    assert_eq!(placed.spread, 0, "every streamed line has its curve");
    let (checked, worst) = compare("With token_curve:", &r.live, &with, min_s);
    assert!(
        checked >= 2,
        "only {checked} levels with {min_s} clean seconds"
    );
    assert!(
        worst < 0.01,
        "offline differs from live by {:.2} %",
        worst * 100.0
    );
    let old = without_curves(&r.log);
    let spread = analyze(&[old], &opts).unwrap();
    assert_eq!(spread.capacity_production_tokens.token_curve, 0);
    assert_eq!(spread.capacity_production_tokens.spread, placed.token_curve);
    let (_, worst_spread) = compare(
        "Without token_curve (spread over [TTFT, end]):",
        &r.live,
        &spread,
        min_s,
    );
    assert!(
        worst_spread > 0.03,
        "the old spreading should miss by more than 3 %, missed by {:.2} %",
        worst_spread * 100.0
    );
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn analyze_reproduces_the_live_production_curve() {
    // 45 s of 16 agents: several levels with a few clean seconds each (none reaches the 10 s
    // of a non-thin row; the by-hand run below checks those).
    let r = run(
        env_u64("OFFLINE_AGENTS", 8) as usize,
        env_u64("OFFLINE_SHORT_S", 45),
    )
    .await;
    check(&r, env_u64("OFFLINE_MIN_DS", 20) as f64 / 10.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes of the demo's traffic: scripts/capacity_acceptance.sh"]
async fn analyze_reproduces_every_non_thin_level_of_the_demo() {
    let secs = env_u64("OFFLINE_S", 300);
    let r = run(16, secs).await;
    check(&r, 10.0);
}
