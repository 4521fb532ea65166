//! The cross-check end to end: the proxy scrapes the simulator's `/metrics` (1 s interval) while
//! 16 streams pass through it. Steady windows agree within 1 %; traffic sent straight to the
//! simulator, bypassing the proxy, raises the flag. Also: scraping off, a dead and a silent
//! `/metrics`, and the `server_sample` log lines against their schema.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use tokenmeter::clock::{Clock, NANOS_PER_SEC};
use tokenmeter::meter::SnapshotQuery;
use tokenmeter::sim::{SimConfig, SimHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const WINDOW_S: u64 = 8;

async fn sim() -> SimHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cfg = SimConfig {
        stop_probability_per_token: 0.0,
        ..Default::default()
    };
    tokenmeter::sim::spawn(cfg, listener).await.unwrap()
}

async fn proxy(upstream: &str, metrics: Option<&str>) -> TestProxy {
    let metrics = metrics.map(str::to_string);
    TestProxy::start(upstream, move |c| {
        c.upstream_metrics_url = metrics;
        c.metrics_scrape_interval_s = 1.0;
        c.meter.windows_s = vec![WINDOW_S];
    })
    .await
}

/// Keeps `n` long streams open to `addr` until `deadline`; counts streams that got a token.
fn hold_streams(
    addr: std::net::SocketAddr,
    n: usize,
    tag: &str,
    deadline: Instant,
    started: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let started = started.clone();
            let body = format!(r#"{{"model":"sim-model","messages":[{{"role":"user","content":"{tag} {i}"}}],"max_tokens":3000,"stream":true}}"#);
            tokio::spawn(async move {
                let mut c = TcpStream::connect(addr).await.unwrap();
                c.write_all(&post("/v1/chat/completions", &body, &[])).await.unwrap();
                let mut buf = vec![0u8; 16 * 1024];
                let mut first = true;
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let Ok(Ok(k)) = tokio::time::timeout(left, c.read(&mut buf)).await else {
                        return;
                    };
                    if k == 0 {
                        return;
                    }
                    if first && buf[..k].windows(11).any(|w| w == b"\"content\":\"") {
                        first = false;
                        started.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect()
}

async fn wait_for(count: &AtomicU64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while count.load(Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "streams did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sleeps until `margin_ms` into the second after `secs` more seconds.
async fn sleep_seconds(secs: u64, margin_ms: u64) {
    let into = Clock::global().now() % NANOS_PER_SEC;
    let ns = (secs + 1) * NANOS_PER_SEC - into + margin_ms * 1_000_000;
    tokio::time::sleep(Duration::from_nanos(ns)).await;
}

/// The aggregate window as JSON, from the meter at the current instant.
async fn window(p: &TestProxy) -> serde_json::Value {
    let snap = p
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
    let v = serde_json::to_value(&snap).unwrap();
    assert_schema("stats.schema.json", &v);
    v["windows"][format!("{WINDOW_S}s")].clone()
}

async fn get_stats(p: &TestProxy) -> serde_json::Value {
    let r = raw_request(
        p.addr,
        b"GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let v = r.json();
    assert_schema("stats.schema.json", &v);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_window_agrees_with_the_server_within_one_percent() {
    let sim = sim().await;
    let p = proxy(&format!("http://{}", sim.addr()), Some("auto")).await;
    let started = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    let tasks = hold_streams(p.addr, 16, "through", deadline, started.clone());
    wait_for(&started, 16).await;
    sleep_seconds(WINDOW_S, 150).await;
    let w = window(&p).await;
    for t in tasks {
        t.abort();
    }
    eprintln!("{w:#}");
    assert_eq!(w["steady"], true, "{w}");
    let s = &w["server"];
    assert!(s["samples"].as_u64().unwrap() >= WINDOW_S - 1, "{s}");
    let pct = s["disagreement_pct"].as_f64().unwrap();
    assert!(pct.abs() < 1.0, "disagreement {pct}%");
    assert_eq!(s["disagreement"], false);
    let server = s["gen_tok_s"].as_f64().unwrap();
    assert!(
        (server - 349.3).abs() / 349.3 < 0.05,
        "server {server} tok/s"
    );
    assert_eq!(s["running"]["min"], 16.0);
    assert_eq!(s["running"]["max"], 16.0);
    assert_eq!(s["waiting"]["max"], 0.0);
    assert_eq!(s["proxy_in_flight"], 16.0);
    assert_eq!(s["server_running_plus_waiting"], 16.0);
    assert_eq!(s["in_flight_diff"], 0.0);
    assert_eq!(s["counter_resets"], 0);
    assert!(s["kv_cache_usage"].as_f64().unwrap() > 0.0);
    let stats = get_stats(&p).await;
    let scrape = &stats["server_scrape"];
    assert!(scrape["ok"].as_u64().unwrap() >= WINDOW_S, "{scrape}");
    assert_eq!(scrape["errors"], 0);
    // The samples are in the access log too, beside the request lines.
    let lines = p.finish().await;
    let samples: Vec<_> = lines
        .iter()
        .filter(|l| l["type"] == "server_sample")
        .collect();
    assert!(samples.len() as u64 >= WINDOW_S, "{}", samples.len());
    for s in &samples {
        assert_schema("server_sample.schema.json", s);
    }
    let last = samples.last().unwrap();
    assert_eq!(last["running"], 16.0);
    assert!(last["ttft_count"].as_f64().unwrap() >= 16.0);
    let gen: Vec<f64> = samples
        .iter()
        .map(|s| s["generation_tokens_total"].as_f64().unwrap())
        .collect();
    assert!(gen.windows(2).all(|w| w[0] <= w[1]));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_bypassing_the_proxy_raises_the_flag() {
    let sim = sim().await;
    let p = proxy(&format!("http://{}", sim.addr()), Some("auto")).await;
    let started = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tasks = hold_streams(p.addr, 16, "through", deadline, started.clone());
    tasks.extend(hold_streams(
        sim.addr(),
        8,
        "bypass",
        deadline,
        started.clone(),
    ));
    wait_for(&started, 24).await;
    sleep_seconds(WINDOW_S, 150).await;
    let w = window(&p).await;
    for t in tasks {
        t.abort();
    }
    let s = &w["server"];
    eprintln!("{s:#}");
    // The server generates for 24 streams, the proxy sees 16: −33.3 %.
    let pct = s["disagreement_pct"].as_f64().unwrap();
    assert!((pct + 33.33).abs() < 1.0, "disagreement {pct}%");
    assert_eq!(s["disagreement"], true);
    assert_eq!(s["running"]["max"], 24.0);
    assert_eq!(s["proxy_in_flight"], 16.0);
    assert_eq!(s["in_flight_diff"], -8.0);
    p.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn scraping_off_leaves_server_null() {
    let sim = sim().await;
    let p = proxy(&format!("http://{}", sim.addr()), None).await;
    let stats = get_stats(&p).await;
    assert!(stats["server_scrape"].is_null());
    assert!(stats["windows"][format!("{WINDOW_S}s")]["server"].is_null());
    p.stop().await;
    sim.shutdown().await;
}

/// Polls `/stats` until the scraper reports an error (bounded).
async fn stats_after_an_error(p: &TestProxy) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let v = get_stats(p).await;
        if v["server_scrape"]["errors"].as_u64().unwrap() > 0 {
            return v;
        }
        assert!(Instant::now() < deadline, "no scrape error reported: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_dead_metrics_endpoint_is_an_error_and_the_proxy_keeps_serving() {
    let sim = sim().await;
    // A port with nothing listening.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", dead.local_addr().unwrap());
    drop(dead);
    let p = proxy(&format!("http://{}", sim.addr()), Some(&url)).await;
    let v = stats_after_an_error(&p).await;
    let scrape = &v["server_scrape"];
    assert_eq!(scrape["ok"], 0);
    assert!(scrape["last_error"].is_string());
    assert!(scrape["last_ok"].is_null());
    let s = &v["windows"][format!("{WINDOW_S}s")]["server"];
    assert_eq!(s["samples"], 0);
    for k in [
        "gen_tok_s",
        "proxy_gen_tok_s",
        "disagreement_pct",
        "disagreement",
        "running",
    ] {
        assert!(s[k].is_null(), "{k}: {s}");
    }
    let r = raw_request(
        p.addr,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
    p.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_silent_metrics_endpoint_times_out() {
    let sim = sim().await;
    // Accepts connections and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", silent.local_addr().unwrap());
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let p = proxy(&format!("http://{}", sim.addr()), Some(&url)).await;
    let v = stats_after_an_error(&p).await;
    let err = v["server_scrape"]["last_error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(err.contains("timed out"), "{err}");
    assert_eq!(v["server_scrape"]["timeout_ms"], 500);
    hold.abort();
    p.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn the_simulators_metrics_parse_to_its_exact_counters() {
    let sim = sim().await;
    for (i, max) in [7, 11, 13].iter().enumerate() {
        let body = format!(
            r#"{{"model":"sim-model","messages":[{{"role":"user","content":"count {i}"}}],"max_tokens":{max}}}"#
        );
        let r = raw_request(sim.addr(), &post("/v1/chat/completions", &body, &[])).await;
        assert_eq!(r.status, 200);
    }
    let r = raw_request(
        sim.addr(),
        b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let text = tokenmeter::scrape::prom_text::parse(&String::from_utf8(r.body).unwrap());
    assert_eq!(text.garbage, 0);
    let v = tokenmeter::scrape::prom_text::extract(&text);
    let c = sim.counters();
    assert_eq!(c.generation_tokens_total, 31);
    assert_eq!(v.generation_tokens_total, Some(31.0));
    assert_eq!(v.prompt_tokens_total, Some(c.prompt_tokens_total as f64));
    assert_eq!((v.running, v.waiting), (Some(0.0), Some(0.0)));
    assert_eq!(v.kv_cache_usage, Some(0.0));
    let h = v.ttft.unwrap();
    assert_eq!(h.count, 3.0);
    assert_eq!(h.buckets.last().unwrap().1, 3.0);
    assert!(h.sum > 0.0);
    sim.shutdown().await;
}

/// One run of the 10 s measurement: 16 streams through the proxy (plus `bypass` straight to the
/// simulator) for about 70 s, scraping every 10 s. Prints the live 20 s window every 10 s (it
/// holds two samples, so each row is one 10 s scrape interval), the live 60 s window, and the
/// offline report over the access log.
async fn measured_run(bypass: usize) -> Vec<serde_json::Value> {
    let sim = sim().await;
    let p = TestProxy::start(&format!("http://{}", sim.addr()), |c| {
        c.upstream_metrics_url = Some("auto".into());
        c.metrics_scrape_interval_s = 10.0;
        c.meter.windows_s = vec![20, 60];
    })
    .await;
    let started = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(80);
    let mut tasks = hold_streams(p.addr, 16, "through", deadline, started.clone());
    tasks.extend(hold_streams(
        sim.addr(),
        bypass,
        "bypass",
        deadline,
        started.clone(),
    ));
    wait_for(&started, 16 + bypass as u64).await;
    println!(
        "\n{} streams through the proxy, {bypass} straight to the simulator; scrape every 10 s",
        16
    );
    println!(
        "{:<10} {:>12} {:>13} {:>9} {:>8} {:>8} {:>8}",
        "window", "proxy tok/s", "server tok/s", "diff %", "flag", "running", "proxy N"
    );
    let mut rows = Vec::new();
    let mut sixty = serde_json::Value::Null;
    for i in 0..7 {
        sleep_seconds(9, 150).await;
        let snap = p
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
        let v = serde_json::to_value(&snap).unwrap();
        let s = v["windows"]["20s"]["server"].clone();
        println!(
            "{:<10} {:>7} {:>12.1} {:>13.1} {:>9} {:>8} {:>8} {:>8}",
            format!("#{i} ({:.1}s)", s["interval_s"].as_f64().unwrap_or(0.0)),
            v["windows"]["20s"]["steady"],
            s["proxy_gen_tok_s"].as_f64().unwrap_or(f64::NAN),
            s["gen_tok_s"].as_f64().unwrap_or(f64::NAN),
            s["disagreement_pct"]
                .as_f64()
                .map_or("-".into(), |x| format!("{x:+.3}")),
            s["disagreement"],
            s["running"]["max"],
            s["proxy_in_flight"],
        );
        rows.push(serde_json::json!({"steady": v["windows"]["20s"]["steady"], "server": s}));
        sixty = v["windows"]["60s"]["server"].clone();
    }
    println!(
        "live 60 s window: proxy {:.1} tok/s, server {:.1} tok/s, diff {:+.3}%, flag {}",
        sixty["proxy_gen_tok_s"].as_f64().unwrap_or(f64::NAN),
        sixty["gen_tok_s"].as_f64().unwrap_or(f64::NAN),
        sixty["disagreement_pct"].as_f64().unwrap_or(f64::NAN),
        sixty["disagreement"]
    );
    for t in tasks {
        t.abort();
    }
    let lines = p.finish().await;
    let records: Vec<tokenmeter::record::RequestRecord> = lines
        .iter()
        .filter(|l| l["type"] == "request")
        .map(|l| serde_json::from_value(l.clone()).unwrap())
        .collect();
    let samples: Vec<_> = lines
        .iter()
        .filter_map(tokenmeter::scrape::ServerSample::from_json)
        .collect();
    let tl = tokenmeter::meter::replay::Timeline::from_records(&records);
    let report = tokenmeter::scrape::report::crosscheck_report(&tl, &samples, 10, 5.0);
    println!(
        "offline, from the access log (request lines replayed):\n{}",
        tokenmeter::scrape::report::render_text(&report)
    );
    sim.shutdown().await;
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "two 75 s runs with 10 s scrapes; `cargo test --test scrape_crosscheck -- --ignored --nocapture`"]
async fn measured_ten_second_scrapes_through_and_bypassing() {
    let rows = measured_run(0).await;
    let steady: Vec<_> = rows.iter().filter(|r| r["steady"] == true).collect();
    assert!(steady.len() >= 5);
    for r in steady {
        let pct = r["server"]["disagreement_pct"].as_f64().unwrap();
        assert!(pct.abs() < 1.0, "{r}");
    }
    let rows = measured_run(8).await;
    assert!(rows
        .iter()
        .filter(|r| r["steady"] == true)
        .all(|r| r["server"]["disagreement"] == true));
}
