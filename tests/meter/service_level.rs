//! Capacity at the service level against the simulator's ground truth: its decode pace at N is
//! 1000 / (12.2 + 2.1 N) tok/s per request (30.1 at 10, 28.3 at 11), so with a pace bound of
//! 29 tok/s and levels held at 8, 10, 11 and 12 the answer is exactly 10, and pace binds.
//! The simulator's own per-request timings (vLLM's `metrics` field, logged as
//! `server_ttft_ms`/`server_mean_itl_ms`) give each request's true verdict, which the proxy's
//! attainment per level must match; `analyze` on the same log must give the same answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use tokenmeter::clock::Clock;
use tokenmeter::meter::SnapshotQuery;
use tokenmeter::sim::SimConfig;
use tokenmeter::slo::SloConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Output tokens per request: short requests, so each level sees many arrivals quickly.
const MAX_TOKENS: u32 = 24;

fn slo() -> SloConfig {
    SloConfig {
        max_ttft_ms: 10_000.0,
        ttft_ms_per_1k_uncached_tokens: 0.0,
        max_tpot_ms: 1_000.0 / 29.0,
        attainment_pct: 95.0,
        min_requests: 20,
    }
}

/// One request through the proxy, read to its end.
async fn one_request(addr: std::net::SocketAddr, i: usize) {
    let body = format!(
        r#"{{"model":"sim-model","messages":[{{"role":"user","content":"task {i}"}}],"max_tokens":{MAX_TOKENS},"stream":true,"stream_options":{{"include_usage":true}}}}"#
    );
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&post("/v1/chat/completions", &body, &[]))
        .await
        .unwrap();
    let mut buf = vec![0u8; 16 * 1024];
    let mut seen = Vec::new();
    loop {
        let k = c.read(&mut buf).await.unwrap();
        if k == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..k]);
        if find(&seen, b"data: [DONE]").is_some() {
            break;
        }
    }
}

/// Holds `n` requests in flight (each slot sends its next request when the last one ended) until
/// `stop` is set.
fn hold(
    addr: std::net::SocketAddr,
    n: usize,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    one_request(addr, i).await;
                }
            })
        })
        .collect()
}

async fn stats(proxy: &TestProxy) -> serde_json::Value {
    let snap = proxy
        .handle
        .as_ref()
        .unwrap()
        .meter()
        .snapshot(
            Clock::global().now(),
            SnapshotQuery::default(),
            "sim",
            &Default::default(),
        )
        .await
        .unwrap();
    serde_json::to_value(&snap).unwrap()
}

/// Judged requests that arrived at `n`, as `/stats` counts them.
fn judged_at(v: &serde_json::Value, n: u64) -> u64 {
    v["service_level"]["levels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["in_flight"] == n)
        .map_or(0, |r| r["requests"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_levels_give_exactly_ten_and_pace_binds() {
    let sim = start_sim(SimConfig {
        stop_probability_per_token: 0.0,
        per_request_metrics: true,
        ..Default::default()
    })
    .await;
    let proxy = TestProxy::start(&format!("http://{}", sim.addr()), |c| c.slo = slo()).await;
    let limit = Instant::now() + Duration::from_secs(120);
    for n in [8usize, 10, 11, 12] {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = hold(proxy.addr, n, stop.clone());
        loop {
            let v = stats(&proxy).await;
            if judged_at(&v, n as u64) >= 40 {
                break;
            }
            assert!(
                Instant::now() < limit,
                "level {n} did not collect 40 requests"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
    }
    let live = stats(&proxy).await;
    let sl = &live["service_level"];
    eprintln!("{}", serde_json::to_string_pretty(&sl["capacity"]).unwrap());
    for r in sl["levels"].as_array().unwrap() {
        eprintln!(
            "N={} requests={} met={} attainment={} thin={} per_request={:?} model={:?}",
            r["in_flight"],
            r["requests"],
            r["met"],
            r["attainment_pct"],
            r["thin"],
            r["per_request_tok_s"],
            r["model_per_request_tok_s"]
        );
    }
    assert_eq!(sl["capacity"]["in_flight"], 10, "{}", sl["capacity"]);
    assert_eq!(sl["capacity"]["reached"], true);
    assert_eq!(sl["capacity"]["binds"], "pace");
    assert_eq!(sl["capacity"]["first_miss"], 11);
    // The model, fitted to the clean time of every level, gives the same pace limit.
    assert_eq!(sl["model"]["pace_capacity"], 10, "{}", sl["model"]);
    // Prometheus gives the same headline (the gauges read the view `/stats` gives).
    let req = "GET /stats/metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n";
    let metrics = String::from_utf8(raw_request(proxy.addr, req.as_bytes()).await.body).unwrap();
    let gauge = |name: &str| -> Option<String> {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ').map(String::from))
    };
    assert_eq!(
        gauge("tokenmeter_capacity_at_service_level").as_deref(),
        Some("10")
    );
    assert_eq!(
        gauge("tokenmeter_capacity_at_service_level_reached").as_deref(),
        Some("1")
    );

    let lines = proxy.finish().await;
    let slo = slo();
    // The log as written, and the same log with each verdict replaced by the simulator's own
    // (its TTFT and mean inter-token latency for that request, vLLM's `metrics` field): run
    // through `analyze`, both are grouped by the same levels.
    let as_log = |truth: bool| -> String {
        lines
            .iter()
            .map(|l| {
                let mut l = l.clone();
                if truth {
                    let ttft = l["server_ttft_ms"].as_f64().unwrap();
                    let itl = l["server_mean_itl_ms"].as_f64().unwrap();
                    let (ttft_ok, pace_ok) = (ttft <= slo.max_ttft_ms, itl <= slo.max_tpot_ms);
                    l["slo_ok"] = (ttft_ok && pace_ok).into();
                    l["slo_miss"] = match (ttft_ok, pace_ok) {
                        (true, true) => serde_json::Value::Null,
                        (false, true) => "ttft".into(),
                        (true, false) => "pace".into(),
                        (false, false) => "ttft_pace".into(),
                    };
                }
                serde_json::to_string(&l).unwrap() + "\n"
            })
            .collect()
    };
    let dir = TempDir::new("slo-analyze");
    let report_of = |name: &str, text: String| {
        let log = dir.0.join(name);
        std::fs::write(&log, text).unwrap();
        let opts = tokenmeter::analyze::AnalyzeOptions {
            slo,
            ..Default::default()
        };
        let r = tokenmeter::analyze::analyze(&[log], &opts).unwrap();
        serde_json::to_value(&r.service_level).unwrap()
    };
    let offline = report_of("proxy.jsonl", as_log(false));
    let truth = report_of("truth.jsonl", as_log(true));
    // analyze on the same log gives the live answer, and the same counts on every level.
    assert_eq!(offline["capacity"], sl["capacity"], "analyze vs live");
    let live_rows = sl["levels"].as_array().unwrap();
    for (r, t) in offline["levels"]
        .as_array()
        .unwrap()
        .iter()
        .zip(truth["levels"].as_array().unwrap())
    {
        let n = r["in_flight"].as_u64().unwrap();
        let live = live_rows.iter().find(|l| l["in_flight"] == n).unwrap();
        assert_eq!(
            r["requests"], live["requests"],
            "level {n}: analyze vs live"
        );
        assert_eq!(r["met"], live["met"], "level {n}: analyze vs live");
        if r["thin"] == true {
            continue;
        }
        // Attainment against the simulator's verdicts: within 1 point, or one request when a
        // level has fewer than 100 (a request near the bound can fall either side of it by the
        // microseconds between the simulator's clock and the proxy's).
        let judged = r["requests"].as_f64().unwrap();
        let (p, t) = (
            r["attainment_pct"].as_f64().unwrap(),
            t["attainment_pct"].as_f64().unwrap(),
        );
        eprintln!("N={n}: proxy {p:.1} %, simulator {t:.1} % of {judged}");
        assert!(
            (p - t).abs() <= (100.0 / judged).max(1.0) + 1e-9,
            "level {n}: proxy {p:.1} %, simulator {t:.1} %"
        );
    }
    assert_eq!(
        truth["capacity"], sl["capacity"],
        "the simulator's own verdicts"
    );
}
