//! Acceptance of the production-traffic capacity curve over real sockets: the simulator behind
//! the proxy, driven by `tokenmeter load`'s agent-like traffic and by its sustained method.
//!
//! * Truth: 16 agents with think time and varied lengths; every level with at least 20 clean
//!   seconds is within 3 % of the simulator's step formula N x 1000 / (12.2 + 2.1 N) (the guard
//!   removes the prefill stalls, so no prefill correction applies).
//! * Live: at least half of the run's 10 s windows are steady (new definition), and each steady
//!   window's rate is within 3 % of the simulator's own counter over the same seconds.
//! * Two methods: at 4, 8 and 16 in flight the production figure is within 3 % of
//!   `load --sustained` at the same level (its steady 10 s windows).
//!
//! Slow (minutes): `scripts/capacity_acceptance.sh` runs them, by hand
//! for now (see `.ci/run`).
//! `CAPACITY_TRUTH_S` sets the length of the 16-agent run (default 180 s).

use std::time::Duration;

use crate::common::{busy_agents, env_u64, stats_now, TestProxy};
use tokenmeter::clock::{Clock, NANOS_PER_SEC};
use tokenmeter::load::{Arrivals, LoadOptions, LoadReport, NoProgress};
use tokenmeter::meter::levels::ProductionRow;
use tokenmeter::meter::SnapshotQuery;
use tokenmeter::sim::{SimConfig, SimHandle};

fn truth(n: u32) -> f64 {
    n as f64 * 1000.0 / (12.2 + 2.1 * n as f64)
}

struct Rig {
    sim: SimHandle,
    proxy: TestProxy,
}

/// The simulator with its defaults, except that a late wake (up to 100 ms) is caught up with
/// shorter steps instead of re-anchoring the schedule: on a starved machine (CI, or the 2 shared
/// cores this was written on, where 1 step in 5 woke more than 2 ms late) re-anchoring makes the
/// engine slower than its formula by the slip (3 % measured), while catching up keeps every
/// second's average on the formula, which is what a level's figure averages over.
async fn new_rig() -> Rig {
    let cfg = SimConfig {
        resync_lag_ms: 100.0,
        ..SimConfig::default()
    };
    let sim = crate::common::start_sim(cfg).await;
    let proxy = TestProxy::start(&format!("http://{}", sim.addr()), |_| {}).await;
    Rig { sim, proxy }
}

async fn load(opts: LoadOptions) -> LoadReport {
    tokenmeter::load::run(opts, NoProgress).await.unwrap()
}

fn url(rig: &Rig) -> String {
    format!("http://{}", rig.proxy.addr)
}

/// The proxy's current production rows.
async fn production(rig: &Rig) -> Vec<ProductionRow> {
    let snap = stats_now(rig.proxy.handle.as_ref().unwrap().meter()).await;
    snap.capacity_production
}

fn print_rows(title: &str, rows: &[ProductionRow]) {
    println!("{title}\n| N | clean s | guard s | tok/s | truth | diff % | without guard |");
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        let tr = truth(r.in_flight);
        println!(
            "| {} | {:.1} | {:.1} | {} | {tr:.1} | {} | {} |",
            r.in_flight,
            r.seconds,
            r.guard_s,
            r.gen_tok_s.map_or("thin".into(), |g| format!("{g:.1}")),
            r.gen_tok_s
                .map_or("—".into(), |g| format!("{:+.2}", (g / tr - 1.0) * 100.0)),
            r.gen_tok_s_unguarded
                .map_or("—".into(), |g| format!("{:+.2}", (g / tr - 1.0) * 100.0)),
        );
    }
}

async fn wait_into_next_second(margin_ms: u64) {
    let into = Clock::global().now() % NANOS_PER_SEC;
    tokio::time::sleep(Duration::from_nanos(
        NANOS_PER_SEC - into + margin_ms * 1_000_000,
    ))
    .await;
}

/// (proxy 10 s gen tok/s, steady, steady level, simulator's tok/s over the same seconds).
async fn window_pair(rig: &Rig) -> (f64, bool, Option<u64>, f64) {
    let now = Clock::global().now();
    let sec = now / NANOS_PER_SEC;
    let snap = rig
        .proxy
        .handle
        .as_ref()
        .unwrap()
        .meter()
        .snapshot(
            now,
            SnapshotQuery {
                user: None,
                window: Some("10s".into()),
            },
            "sim",
            &Default::default(),
        )
        .await
        .unwrap();
    let w = snap.windows.get("10s").unwrap();
    let sim = rig.sim.generated_tokens_in(sec - 10, sec) as f64 / 10.0;
    (
        w.gen_tok_s.unwrap_or(0.0),
        w.steady,
        w.steady_in_flight.map(u64::from),
        sim,
    )
}

/// The production figure at `n` agents, then a sustained run at `n` on a fresh proxy; returns
/// (production at n, sustained's steady-window mean).
async fn both_methods(n: usize, agents_s: u64, sustained_s: u64) -> (f64, f64) {
    let rig = new_rig().await;
    let opts = LoadOptions::agents(
        url(&rig),
        Arrivals::Agents { agents: n },
        busy_agents(),
        Duration::from_secs(agents_s),
    );
    load(opts).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rows = production(&rig).await;
    print_rows(&format!("{n} agents, {agents_s} s:"), &rows);
    let prod = rows
        .iter()
        .find(|r| r.in_flight == n as u32)
        .and_then(|r| r.gen_tok_s)
        .unwrap_or_else(|| panic!("no production figure at {n}"));
    rig.proxy.stop().await;
    rig.sim.shutdown().await;
    let rig = new_rig().await;
    let mut opts = LoadOptions::sustained(url(&rig), n, Duration::from_secs(sustained_s));
    opts.max_tokens = Some(1500);
    let report = load(opts).await;
    let p = report.proxy.unwrap();
    let steady = p.steady_10s.expect("sustained run had no steady window");
    let s = report.sustained.unwrap();
    println!(
        "sustained at {n}: steady windows {:.1} tok/s (n {}), client aggregate {:.1} tok/s; production {prod:.1} tok/s ({:+.2}%); truth {:.1}",
        steady.gen_tok_s.avg,
        steady.gen_tok_s.n,
        s.client_aggregate_tok_s.unwrap_or(0.0),
        (prod / steady.gen_tok_s.avg - 1.0) * 100.0,
        truth(n as u32),
    );
    rig.proxy.stop().await;
    rig.sim.shutdown().await;
    (prod, steady.gen_tok_s.avg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes of simulated production traffic: scripts/capacity_acceptance.sh"]
async fn sixteen_agents_truth_per_level_and_live_windows() {
    let secs = env_u64("CAPACITY_TRUTH_S", 180);
    let rig = new_rig().await;
    let opts = LoadOptions::agents(
        url(&rig),
        Arrivals::Agents { agents: 16 },
        busy_agents(),
        Duration::from_secs(secs),
    );
    let run = tokio::spawn(tokenmeter::load::run(opts, NoProgress));
    // 10 s windows, each read just after its last second ended, from the first full one on.
    let started = std::time::Instant::now();
    let mut windows = Vec::new();
    wait_into_next_second(150).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    while started.elapsed().as_secs() + 10 < secs {
        windows.push(window_pair(&rig).await);
        tokio::time::sleep(Duration::from_secs(9)).await;
        wait_into_next_second(150).await;
    }
    let report = run.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rows = production(&rig).await;
    let a = report.agents.as_ref().unwrap();
    println!(
        "16 agents, {secs} s: {} requests ({} failed), client aggregate {:.1} tok/s",
        a.figures.requests,
        a.figures.failures,
        a.client_aggregate_tok_s.unwrap_or(0.0)
    );
    print_rows("Production-traffic curve (live /stats):", &rows);
    // With `resync_lag_ms` = 100 the simulator catches late wakes up and its schedule does not
    // slip; a wake later than that re-anchors it, and the engine is then slower than its
    // formula by the time lost (slip / run), which the truth takes into account. The slip is
    // printed: it is 0 unless the machine starved the simulator for over 100 ms at once.
    let lag = rig.sim.step_lag();
    let slip = lag.slip_ns as f64 / 1e9 / secs as f64;
    println!(
        "simulator: {} steps, lag mean {:.3} ms, max {:.1} ms, {} resyncs losing {:.1} ms ({:.2} % of the run)",
        lag.steps,
        lag.mean_ns as f64 / 1e6,
        lag.max_ns as f64 / 1e6,
        lag.resyncs,
        lag.slip_ns as f64 / 1e6,
        slip * 100.0
    );
    // Every check is evaluated and printed before any fails, so one failing part does not hide
    // the others.
    let mut failures = Vec::new();
    let mut checked = 0;
    for r in rows.iter().filter(|r| r.seconds >= 20.0) {
        let d = r.gen_tok_s.unwrap() / (truth(r.in_flight) / (1.0 + slip)) - 1.0;
        if d.abs() >= 0.03 {
            failures.push(format!(
                "level {}: {:+.2}% from the truth",
                r.in_flight,
                d * 100.0
            ));
        }
        checked += 1;
    }
    if checked < 2 {
        failures.push(format!("only {checked} levels with 20 clean seconds"));
    }
    println!("10 s windows: proxy tok/s | steady (level) | simulator tok/s | diff %");
    for (p, s, n, t) in &windows {
        println!(
            "  {p:.1} | {s} ({}) | {t:.1} | {:+.2}",
            n.map_or("—".into(), |n| n.to_string()),
            (p / t - 1.0) * 100.0
        );
    }
    let steady: Vec<_> = windows.iter().filter(|w| w.1).collect();
    println!("{} of {} windows steady", steady.len(), windows.len());
    if windows.is_empty() || 2 * steady.len() < windows.len() {
        failures.push(format!(
            "{} of {} windows steady",
            steady.len(),
            windows.len()
        ));
    }
    for (p, _, _, t) in &steady {
        if (p / t - 1.0).abs() >= 0.03 {
            failures.push(format!("steady window {p:.1} tok/s vs simulator {t:.1}"));
        }
    }
    // analyze on the same access log, for the note: records only (no per-event times).
    let lines = rig.proxy.finish().await;
    let dir = crate::common::TempDir::new("capacity-analyze");
    let log = dir.0.join("access.jsonl");
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&log, text).unwrap();
    let r = tokenmeter::analyze::analyze(&[log], &Default::default()).unwrap();
    print_rows(
        "Production-traffic curve (analyze on the access log):",
        &r.capacity_production,
    );
    rig.sim.shutdown().await;
    assert!(failures.is_empty(), "{failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes of simulated production traffic: scripts/capacity_acceptance.sh"]
async fn production_agrees_with_sustained_at_4_8_and_16() {
    for (n, agents_s) in [(4usize, 40u64), (8, 40), (16, 50)] {
        let (prod, sustained) = both_methods(n, agents_s, 25).await;
        let d = prod / sustained - 1.0;
        assert!(
            d.abs() < 0.03,
            "at {n}: production {prod:.1} vs sustained {sustained:.1} ({:+.2}%)",
            d * 100.0
        );
    }
}
