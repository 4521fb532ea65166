//! Latency histograms that move while streams are open: TTFT is observed at a stream's first
//! token and ITL at its events (reported with the stream's tokens, at most a second late), as
//! vLLM observes `vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds`, so
//! held streams show in `tokenmeter_time_to_first_token_seconds`,
//! `tokenmeter_inter_token_latency_seconds` and the windows' `ttft_ms` and `itl_ms` before they
//! end, and are not counted again at their end. Checked against the simulator's own vLLM-named
//! histograms over real sockets.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokenmeter::sim::SimConfig;

use crate::common::{post, raw_request, start_sim, TestProxy};

async fn get(addr: std::net::SocketAddr, path: &str) -> Vec<u8> {
    let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    let r = raw_request(addr, req.as_bytes()).await;
    assert_eq!(r.status, 200, "{path}");
    r.body
}

/// The sum over label sets of the samples of `name` (no other series starts with it and a brace
/// or a space).
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_and_itl_counts_move_with_vllms_while_streams_are_held() {
    // 8 streams of 200 tokens at 50 ms a step: 10 s each, held while the counts are compared.
    let sim = start_sim(SimConfig {
        step_base_ms: 50.0,
        step_per_seq_ms: 0.0,
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    })
    .await;
    let url = format!("http://{}", sim.addr());
    let proxy = TestProxy::start(&url, |c| c.meter.windows_s = vec![10]).await;
    let n = 8;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let body = json!({"model": "sim-model", "stream": true, "max_tokens": 200,
                "ignore_eos": true, "messages": [{"role": "user", "content": format!("agent {i}")}]})
            .to_string();
            let addr = proxy.addr;
            tokio::spawn(async move {
                let r = raw_request(addr, &post("/v1/chat/completions", &body, &[])).await;
                r.status
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut agreed = None;
    while Instant::now() < deadline {
        let vllm = String::from_utf8(get(sim.addr(), "/metrics").await).unwrap();
        let ours = String::from_utf8(get(proxy.addr, "/stats/metrics").await).unwrap();
        let stats: Value = serde_json::from_slice(&get(proxy.addr, "/stats").await).unwrap();
        let vllm_ttft = total(&vllm, "vllm:time_to_first_token_seconds_count");
        let ended = total(&vllm, "vllm:e2e_request_latency_seconds_count");
        let our_ttft = total(&ours, "tokenmeter_time_to_first_token_seconds_count");
        eprintln!("vLLM TTFT count {vllm_ttft}, ours {our_ttft}, ended {ended}");
        if vllm_ttft == n as f64 && our_ttft == vllm_ttft && ended == 0.0 {
            agreed = Some(stats);
            break;
        }
        assert!(ended == 0.0, "a stream ended before the counts agreed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stats = agreed.expect("the TTFT counts did not agree while the streams were held");
    assert_eq!(stats["in_flight"], n, "{stats}");
    // ITL: ours trails vLLM's by at most the tokens of a stream's current second (reports are
    // coalesced per request and second): never above vLLM's count read after it, never below
    // vLLM's count read 2.5 s before it (a second of coalescing, with room for a loaded machine).
    let itl = "vllm:inter_token_latency_seconds_count";
    let ours_itl = "tokenmeter_inter_token_latency_seconds_count";
    let start = Instant::now();
    let mut history: Vec<(Instant, f64)> = Vec::new();
    let mut checked = 0;
    while start.elapsed() < Duration::from_secs(5) {
        let before = total(
            &String::from_utf8(get(sim.addr(), "/metrics").await).unwrap(),
            itl,
        );
        let at = Instant::now();
        let ours = String::from_utf8(get(proxy.addr, "/stats/metrics").await).unwrap();
        let stats: Value = serde_json::from_slice(&get(proxy.addr, "/stats").await).unwrap();
        let vllm = String::from_utf8(get(sim.addr(), "/metrics").await).unwrap();
        let (o, after) = (total(&ours, ours_itl), total(&vllm, itl));
        assert_eq!(total(&vllm, "vllm:e2e_request_latency_seconds_count"), 0.0);
        history.push((at, before));
        let old = history
            .iter()
            .rev()
            .find(|(t, _)| at.duration_since(*t) >= Duration::from_millis(2500));
        eprintln!("ITL count: vLLM {before}..{after}, ours {o}");
        assert!(o <= after, "ours {o} above vLLM's {after}");
        if let Some((_, v)) = old {
            assert!(o >= *v, "ours {o} below vLLM's {v} of 2.5 s before");
            assert!(o > 0.0);
            checked += 1;
        }
        // The window holds complete seconds: once the first tokens' second is one, its TTFT and
        // ITL show though no request has finished.
        let w = &stats["windows"]["10s"];
        if start.elapsed() > Duration::from_millis(1500) {
            assert_eq!(w["requests_finished"], 0, "{w}");
            assert!(w["ttft_ms"]["p50"].as_f64().is_some_and(|v| v > 0.0), "{w}");
            assert!(w["itl_ms"]["p50"].as_f64().is_some_and(|v| v > 0.0), "{w}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(checked >= 10, "{checked}");
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    // At their ends nothing is counted again.
    let vllm = String::from_utf8(get(sim.addr(), "/metrics").await).unwrap();
    let ours = String::from_utf8(get(proxy.addr, "/stats/metrics").await).unwrap();
    assert_eq!(
        total(&vllm, "vllm:e2e_request_latency_seconds_count"),
        n as f64
    );
    assert_eq!(
        total(&ours, "tokenmeter_time_to_first_token_seconds_count"),
        total(&vllm, "vllm:time_to_first_token_seconds_count")
    );
    eprintln!(
        "after the ends: ITL count vLLM {}, ours {}",
        total(&vllm, "vllm:inter_token_latency_seconds_count"),
        total(&ours, "tokenmeter_inter_token_latency_seconds_count")
    );
    assert_eq!(
        total(&ours, "tokenmeter_inter_token_latency_seconds_count"),
        total(&vllm, "vllm:inter_token_latency_seconds_count")
    );
    proxy.stop().await;
}
