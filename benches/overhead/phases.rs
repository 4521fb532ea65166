//! The three measurement phases: latency rounds, CPU per request/event, ramp with RSS.

use crate::client::{self, HttpClient};
use crate::procs::{cpu_ns, rss_kib, Env};
use crate::stats::{median, pct, rank_paired_us};
use crate::Opts;
use rand::seq::SliceRandom;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arms in the latency phase; the first is the baseline every other is paired against.
pub const ARMS: [&str; 7] = [
    "direct",
    "direct2",
    "tokenmeter",
    "tokenmeter_nometer",
    "tokenmeter_before",
    "tokenmeter_before_nometer",
    "nginx",
];

fn addr_of(env: &Env, arm: &str) -> Option<SocketAddr> {
    match arm {
        "direct" | "direct2" => Some(env.sim),
        "tokenmeter" => Some(env.tm),
        "tokenmeter_nometer" => Some(env.nometer),
        "tokenmeter_before" => env.before.map(|b| b.0),
        "tokenmeter_before_nometer" => env.before.map(|b| b.1),
        _ => env.nginx,
    }
}

async fn batch(
    c: &HttpClient,
    addr: SocketAddr,
    n: usize,
    events: u64,
) -> Vec<client::StreamResult> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(
                async move { client::stream(&c, addr, events, Duration::from_secs(60)).await },
            )
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap_or_default());
    }
    out
}

/// Per arm: TTFT ns per round (one entry per stream), all stamp delays (µs), error count.
struct Rounds {
    ttft: Vec<Vec<Vec<u64>>>,
    delays: Vec<Vec<f64>>,
    errors: Vec<usize>,
}

/// `rounds` rounds of `conc` concurrent `events`-event streams per arm, arms in a fresh random order
/// every round.
async fn rounds(
    env: &Env,
    arms: &[&str],
    clients: &[HttpClient],
    conc: usize,
    n_rounds: usize,
    events: u64,
    rng: &mut impl rand::Rng,
) -> Rounds {
    let n = arms.len();
    let mut r = Rounds {
        ttft: vec![Vec::new(); n],
        delays: vec![Vec::new(); n],
        errors: vec![0; n],
    };
    let mut order: Vec<usize> = (0..n).collect();
    for _ in 0..n_rounds {
        order.shuffle(rng);
        for &i in &order {
            let addr = addr_of(env, arms[i]).unwrap_or(env.sim);
            let rs = batch(&clients[i], addr, conc, events).await;
            let mut round = Vec::with_capacity(conc);
            for s in rs {
                if !s.ok {
                    r.errors[i] += 1;
                }
                if let Some(t) = s.ttft_ns {
                    round.push(t);
                }
                r.delays[i].extend(s.delays_ns.iter().map(|d| *d as f64 / 1e3));
            }
            r.ttft[i].push(round);
        }
    }
    r
}

/// Latency at each concurrency. Added TTFT: 1-event requests, rank-paired against `direct` in the same
/// round. Added per-event delay: `--events`-event requests, quantiles of the stamp delays minus the
/// direct arm's same quantile.
pub async fn latency(env: &Env, o: &Opts, rng: &mut impl rand::Rng) -> Value {
    let arms: Vec<&str> = ARMS
        .iter()
        .copied()
        .filter(|a| addr_of(env, a).is_some())
        .collect();
    let clients: Vec<HttpClient> = arms.iter().map(|_| client::client()).collect();
    let mut out = serde_json::Map::new();
    for (k, &conc) in o.concurrency.iter().enumerate() {
        let t = Instant::now();
        for (i, a) in arms.iter().enumerate() {
            let addr = addr_of(env, a).unwrap_or(env.sim);
            batch(&clients[i], addr, conc, 2).await; // warm the pool
        }
        // `--ttft-rounds 0`: TTFT is read off the event rounds' own first events (issue 19's
        // method: one set of requests gives both numbers).
        let (tt, ev) = if o.ttft_rounds[k] == 0 {
            let ev = rounds(env, &arms, &clients, conc, o.rounds[k], o.events, rng).await;
            let tt = Rounds {
                ttft: ev.ttft.clone(),
                delays: Vec::new(),
                errors: vec![0; arms.len()],
            };
            (tt, ev)
        } else {
            let tt = rounds(env, &arms, &clients, conc, o.ttft_rounds[k], 1, rng).await;
            let ev = rounds(env, &arms, &clients, conc, o.rounds[k], o.events, rng).await;
            (tt, ev)
        };
        let d50 = median(&ev.delays[0]);
        let d99 = pct(&ev.delays[0], 99.0);
        let sub = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a - b);
        let mut per_arm = serde_json::Map::new();
        for (i, arm) in arms.iter().enumerate() {
            let diffs: Vec<f64> = (0..tt.ttft[i].len())
                .flat_map(|r| rank_paired_us(&tt.ttft[i][r], &tt.ttft[0][r]))
                .collect();
            let raw: Vec<f64> = tt.ttft[i]
                .iter()
                .flatten()
                .map(|t| *t as f64 / 1e3)
                .collect();
            let d = &ev.delays[i];
            per_arm.insert(
                arm.to_string(),
                json!({
                    "ttft_us_p50": median(&raw),
                    "added_ttft_us": {"p50": median(&diffs), "p90": pct(&diffs, 90.0), "p99": pct(&diffs, 99.0)},
                    "ttft_pairs": diffs.len(),
                    "event_delay_us": {"p50": median(d), "p99": pct(d, 99.0)},
                    "added_event_delay_us": {"p50": sub(median(d), d50), "p99": sub(pct(d, 99.0), d99)},
                    "events": d.len(),
                    "errors": tt.errors[i] + ev.errors[i],
                }),
            );
        }
        eprintln!(
            "latency c={conc}: {} TTFT rounds + {} event rounds in {:.1} s, load {}",
            o.ttft_rounds[k],
            o.rounds[k],
            t.elapsed().as_secs_f64(),
            crate::support::loadavg()
        );
        per_arm.insert("loadavg".into(), json!(crate::support::loadavg()));
        out.insert(conc.to_string(), Value::Object(per_arm));
    }
    Value::Object(out)
}

async fn run_cpu(
    c: &HttpClient,
    addr: SocketAddr,
    pids: &[u32],
    total: usize,
    conc: usize,
    events: u64,
) -> (f64, usize) {
    let before = cpu_ns(pids);
    let mut errors = 0;
    let mut left = total;
    while left > 0 {
        let k = left.min(conc);
        errors += batch(c, addr, k, events)
            .await
            .iter()
            .filter(|r| !r.ok)
            .count();
        left -= k;
    }
    ((cpu_ns(pids) - before) as f64, errors)
}

/// Quiet before the idle CPU sample.
const IDLE_SETTLE: Duration = Duration::from_secs(2);
/// Length of the idle CPU sample.
const IDLE_SAMPLE: Duration = Duration::from_secs(2);

/// CPU per request and per event of every proxy arm: `/proc` schedstat sampled around bounded runs of
/// 1-event and 64-event requests, arms interleaved in random order per repetition.
pub async fn cpu(env: &Env, o: &Opts, rng: &mut impl rand::Rng) -> Value {
    let mut arms: Vec<&str> = ARMS[2..]
        .iter()
        .copied()
        .filter(|a| addr_of(env, a).is_some())
        .collect();
    let clients: Vec<HttpClient> = arms.iter().map(|_| client::client()).collect();
    let k = o.cpu_requests;
    let mut per_req: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    let mut per_ev: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    let mut idle_ns_s = vec![0.0; arms.len()];
    let mut errors = vec![0usize; arms.len()];
    // Idle: 2 s of nothing after 2 s of quiet, so the tails of the previous phase (timers that
    // back off after traffic stops) are over before the sample starts.
    tokio::time::sleep(IDLE_SETTLE).await;
    for (i, a) in arms.iter().enumerate() {
        let pids = env.pids_of(a);
        let c0 = cpu_ns(&pids);
        tokio::time::sleep(IDLE_SAMPLE).await;
        // Background CPU per idle second.
        idle_ns_s[i] = (cpu_ns(&pids) - c0) as f64 / IDLE_SAMPLE.as_secs_f64();
        batch(&clients[i], addr_of(env, a).unwrap_or(env.sim), 64, 1).await;
    }
    let mut order: Vec<usize> = (0..arms.len()).collect();
    for _ in 0..o.cpu_reps {
        order.shuffle(rng);
        for &i in &order {
            let (addr, pids) = (
                addr_of(env, arms[i]).unwrap_or(env.sim),
                env.pids_of(arms[i]),
            );
            let t1 = Instant::now();
            let (c1, e1) = run_cpu(&clients[i], addr, &pids, k, 64, 1).await;
            let c1 = c1 - idle_ns_s[i] * t1.elapsed().as_secs_f64();
            let t64 = Instant::now();
            let (c64, e64) = run_cpu(&clients[i], addr, &pids, k, 64, 64).await;
            let c64 = c64 - idle_ns_s[i] * t64.elapsed().as_secs_f64();
            errors[i] += e1 + e64;
            per_req[i].push(c1 / k as f64 / 1e3);
            per_ev[i].push((c64 - c1) / 63.0 / k as f64 / 1e3);
        }
    }
    let mut out = serde_json::Map::new();
    out.insert("loadavg".into(), json!(crate::support::loadavg()));
    for (i, a) in arms.drain(..).enumerate() {
        out.insert(
            a.to_string(),
            json!({"cpu_us_per_request": median(&per_req[i]), "cpu_us_per_event": median(&per_ev[i]),
                   "idle_cpu_us_per_s": idle_ns_s[i] / 1e3, "reps": o.cpu_reps, "requests_per_run": k,
                   "errors": errors[i]}),
        );
    }
    Value::Object(out)
}

/// Ramp: per arm, hold N streams open at once for each step N; RSS idle and at each step; stops at the
/// first step with an error. `served` = the largest N held with zero errors.
pub async fn ramp(env: &Env, o: &Opts) -> Value {
    let mut out = serde_json::Map::new();
    for arm in [
        "direct",
        "tokenmeter",
        "tokenmeter_nometer",
        "tokenmeter_before",
        "tokenmeter_before_nometer",
        "nginx",
    ] {
        let Some(addr) = addr_of(env, arm) else {
            continue;
        };
        let pids = env.pids_of(arm);
        let warm = client::client();
        batch(&warm, addr, 16, 1).await;
        drop(warm);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let idle = rss_kib(&pids);
        let mut steps = Vec::new();
        let mut served = 0;
        for &n in &o.ramp {
            let t = Instant::now();
            let c = client::client();
            let opened = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = tokio::sync::watch::channel(false);
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    tokio::spawn(client::hold(
                        c.clone(),
                        addr,
                        600,
                        opened.clone(),
                        rx.clone(),
                        Duration::from_secs(120),
                    ))
                })
                .collect();
            let deadline = Instant::now() + Duration::from_secs(60);
            while opened.load(Ordering::SeqCst) < n
                && Instant::now() < deadline
                && !tasks.iter().all(tokio::task::JoinHandle::is_finished)
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let held = opened.load(Ordering::SeqCst);
            let rss = rss_kib(&pids);
            let load = crate::support::loadavg();
            let _ = tx.send(true);
            let mut ok = 0;
            for t in tasks {
                ok += usize::from(t.await.unwrap_or(false));
            }
            drop(c);
            let errors = n - ok;
            let per_stream = (rss as f64 - idle as f64) / n as f64;
            eprintln!("ramp {arm} n={n}: held {held}, errors {errors}, rss {rss} KiB ({per_stream:.1} KiB/stream), {:.1} s, load {load}", t.elapsed().as_secs_f64());
            steps.push(json!({"loadavg": load, "streams": n, "held_at_once": held, "errors": errors, "rss_kib": rss, "rss_kib_per_stream": per_stream}));
            tokio::time::sleep(Duration::from_secs(2)).await;
            if errors > 0 || held < n {
                break;
            }
            served = n;
        }
        out.insert(
            arm.to_string(),
            json!({"rss_idle_kib": idle, "max_streams_zero_errors": served, "steps": steps}),
        );
    }
    Value::Object(out)
}

/// Peers: the Python clients (`benches/peers/ab_client.py`: plain asyncio and the `openai` SDK)
/// against every arm, in front of the Python upstream `env` was started with; interleaved rounds,
/// added TTFT paired with the same client's direct request in the same round. Returns the
/// client's JSON with the load average at the end.
pub fn peers(env: &Env, o: &Opts, python: &std::path::Path) -> anyhow::Result<Value> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/ab_client.py");
    let mut cmd = std::process::Command::new(python);
    cmd.arg(script)
        .args(["--rounds", &o.peer_rounds.to_string()])
        .args(["--events", &o.peer_events.to_string()])
        .args(["--prompt-chars", &o.peer_prompt_chars.to_string()])
        .args(["--clients", &o.peer_clients]);
    for arm in ARMS {
        if let Some(addr) = addr_of(env, arm) {
            cmd.args(["--arm", &format!("{arm}={addr}")]);
        }
    }
    let t = Instant::now();
    let out = cmd.stderr(std::process::Stdio::inherit()).output()?;
    anyhow::ensure!(out.status.success(), "ab_client.py failed: {}", out.status);
    let mut v: Value = serde_json::from_slice(&out.stdout)?;
    eprintln!(
        "peers: {} rounds in {:.1} s, load {}",
        o.peer_rounds,
        t.elapsed().as_secs_f64(),
        crate::support::loadavg()
    );
    v["loadavg_end"] = json!(crate::support::loadavg());
    Ok(v)
}
