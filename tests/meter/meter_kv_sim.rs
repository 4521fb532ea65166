//! The KV-cache figures against the simulator's ground truth (`/sim/truth`), through the proxy
//! with the cross-check scraping the simulator:
//! - with prefix caching off, the proxy's live estimate of blocks held equals the simulator's
//!   `blocks_held` (and vLLM's usage × usable blocks) at every quiet moment of held streams;
//! - on a KV-starved simulator, agents whose contexts grow until the cache is full: the
//!   headroom reaches 0 before the simulator's first preemption, and the saturation state turns
//!   to queueing, then preempting.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokenmeter::sim::SimConfig;

use crate::common::{post, raw_request, start_sim, TestProxy};

async fn get_json(addr: std::net::SocketAddr, path: &str) -> Value {
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    let r = raw_request(addr, req.as_bytes()).await;
    assert_eq!(r.status, 200, "{path}");
    serde_json::from_slice(&r.body).unwrap()
}

/// A streamed chat request with usage on every event (the proxy then knows the prompt's size
/// from the first token on).
fn body(i: usize, max_tokens: u32) -> String {
    let content = format!("{i:03}{}", "word".repeat(100));
    json!({"model": "sim-model", "messages": [{"role": "user", "content": content}],
           "max_tokens": max_tokens, "ignore_eos": true, "stream": true,
           "stream_options": {"include_usage": true, "continuous_usage_stats": true}})
    .to_string()
}

fn send(proxy: std::net::SocketAddr, i: usize, max_tokens: u32) -> tokio::task::JoinHandle<u16> {
    let b = body(i, max_tokens);
    tokio::spawn(async move {
        let r = raw_request(
            proxy,
            &post(
                "/v1/chat/completions",
                &b,
                &[("x-tokenmeter-user", "agent")],
            ),
        )
        .await;
        r.status
    })
}

async fn proxy_for(sim: &tokenmeter::sim::SimHandle) -> TestProxy {
    let url = format!("http://{}", sim.addr());
    TestProxy::start(&url, |c| {
        c.upstream_metrics_url = Some(format!("{url}/metrics"));
        c.metrics_scrape_interval_s = 0.1;
        c.meter.windows_s = vec![2, 10];
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_estimate_equals_the_simulators_blocks_held_without_prefix_caching() {
    // Slow steps leave quiet moments between the events to read both sides in.
    let sim = start_sim(SimConfig {
        num_gpu_blocks: 2001,
        max_model_len: 4096,
        block_size: 16,
        enable_prefix_caching: false,
        step_base_ms: 150.0,
        step_per_seq_ms: 0.0,
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    })
    .await;
    let proxy = proxy_for(&sim).await;
    let tasks: Vec<_> = (0..6).map(|i| send(proxy.addr, i, 40)).collect();
    let (mut compared, mut nonzero) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && tasks.iter().any(|t| !t.is_finished()) {
        let t1 = get_json(sim.addr(), "/sim/truth").await;
        let s1 = get_json(proxy.addr, "/stats").await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        let s2 = get_json(proxy.addr, "/stats").await;
        let t2 = get_json(sim.addr(), "/sim/truth").await;
        let est = &s1["kv"]["estimate"];
        // Quiet: no step between the two readings of the truth, the proxy's view unchanged, and
        // every running request has passed a token (its prompt is known).
        let quiet = t1 == t2
            && est == &s2["kv"]["estimate"]
            && est["prompt_unknown"] == 0
            && est["in_flight"] == t1["running"];
        if quiet && t1["running"].as_u64() > Some(0) {
            assert_eq!(
                est["blocks"], t1["blocks_held"],
                "estimate {est} vs truth {t1} stats {}",
                s1["kv"]
            );
            assert_eq!(t1["blocks_held"], t1["blocks_in_use"]);
            compared += 1;
            nonzero += (est["blocks"].as_u64() > Some(0)) as u32;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    eprintln!("estimate = truth at {compared} quiet moments");
    assert!(
        nonzero >= 3,
        "only {nonzero} quiet moments with blocks held"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headroom_reaches_zero_before_the_first_preemption_on_a_kv_starved_sim() {
    // 40 usable blocks of 16 tokens: a request's prompt is ~110 tokens (7 blocks) and grows to
    // ~230 (15 blocks); five run at once, then growth needs blocks that are not there.
    let sim = start_sim(SimConfig {
        num_gpu_blocks: 41,
        block_size: 16,
        max_model_len: 640,
        enable_prefix_caching: false,
        step_base_ms: 40.0,
        step_per_seq_ms: 0.0,
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    })
    .await;
    let proxy = proxy_for(&sim).await;
    // Today's contexts: three agents' turns of ~110 + 100 tokens, one at a time.
    for i in 0..3 {
        assert_eq!(send(proxy.addr, 100 + i, 100).await.unwrap(), 200);
    }
    let s = get_json(proxy.addr, "/stats").await;
    let p90 = s["kv"]["contexts"]["p90"].as_u64().unwrap();
    assert_eq!(s["kv"]["cache"]["num_gpu_blocks"], 41);
    assert!(
        s["kv"]["headroom"]["sequences_p90"].as_u64() > Some(0),
        "{}",
        s["kv"]
    );
    // Eight agents whose contexts grow to ~230 tokens.
    let tasks: Vec<_> = (0..8).map(|i| send(proxy.addr, i, 120)).collect();
    let started = Instant::now();
    let (mut headroom_zero, mut preempted) = (None, None);
    let (mut queueing, mut preempting) = (None, None);
    let mut table_seen = Value::Null;
    while tasks.iter().any(|t| !t.is_finished()) && started.elapsed() < Duration::from_secs(60) {
        let s = get_json(proxy.addr, "/stats").await;
        let truth = get_json(sim.addr(), "/sim/truth").await;
        let at = started.elapsed();
        if preempted.is_none() && truth["preemptions"].as_u64() > Some(0) {
            preempted = Some(at);
        }
        // Read after the truth: a zero seen now was there before this preemption was read.
        if headroom_zero.is_none() && s["kv"]["headroom"]["sequences_p90"] == 0 {
            headroom_zero = Some(at);
            table_seen = s["kv"].clone();
        }
        let state = &s["windows"]["2s"]["saturation"]["state"];
        if queueing.is_none() && state == "queueing" {
            queueing = Some(at);
        }
        if preempting.is_none() && state == "preempting" {
            preempting = Some(at);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    eprintln!(
        "p90 context {p90}; headroom 0 at {headroom_zero:?}, first preemption read at {preempted:?}; \
         saturation queueing at {queueing:?}, preempting at {preempting:?}\nkv at headroom 0: {table_seen}"
    );
    let preempted = preempted.expect("the simulator never preempted");
    let headroom_zero = headroom_zero.expect("the headroom never reached 0");
    assert!(
        headroom_zero < preempted,
        "headroom 0 at {headroom_zero:?}, preemption at {preempted:?}"
    );
    assert!(queueing.is_some() || preempting.is_some());
    assert!(preempting.is_some(), "the preemption was not named");
    proxy.stop().await;
}
