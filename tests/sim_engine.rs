//! The running simulator over real sockets: decode rates per concurrency level against the step
//! formula, exact token accounting, aborts, FIFO queueing, /metrics text and fixed-pace mode.

mod sim_support;

use std::time::{Duration, Instant};

use serde_json::Value;
use sim_support::*;
use tokenmeter::sim::SimConfig;
use tokio::net::TcpStream;

fn stream_body(content: &str, max_tokens: u64) -> String {
    format!(
        r#"{{"messages":[{{"role":"user","content":"{content}"}}],"max_tokens":{max_tokens},"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}}}}"#
    )
}

/// Arrival times of the content (token) events of a streamed response.
fn token_times(r: &Resp) -> Vec<Instant> {
    r.chunks
        .iter()
        .filter(|(_, c)| c.contains("\"delta\":{\"content\""))
        .map(|(t, _)| *t)
        .collect()
}

/// Per-stream decode rate (tokens/s) seen by the client: (tokens − 1) / (last − first token).
fn decode_rate(r: &Resp) -> f64 {
    let t = token_times(r);
    (t.len() - 1) as f64 / t[t.len() - 1].duration_since(t[0]).as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_rate_per_level_matches_the_step_formula() {
    let c = cfg();
    let (base, per) = (c.step_base_ms, c.step_per_seq_ms);
    let sim = start(c).await;
    for n in [1usize, 4, 16] {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let a = sim.addr();
                tokio::spawn(async move {
                    post(
                        a,
                        "/v1/chat/completions",
                        &stream_body(&format!("level {i}"), 40),
                    )
                    .await
                })
            })
            .collect();
        let mut rates = Vec::new();
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(token_times(&r).len(), 40);
            rates.push(decode_rate(&r));
        }
        let want = 1000.0 / (base + per * n as f64);
        let mean = rates.iter().sum::<f64>() / n as f64;
        eprintln!("level {n}: mean per-stream decode rate {mean:.2} tok/s, formula {want:.2} tok/s, rates {rates:.1?}");
        assert!(
            (mean / want - 1.0).abs() < 0.05,
            "level {n}: {mean} vs {want}"
        );
    }
    let lag = sim.step_lag();
    eprintln!(
        "step lag: {} steps, max {:.3} ms, mean {:.3} ms",
        lag.steps,
        lag.max_ns as f64 / 1e6,
        lag.mean_ns as f64 / 1e6
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_equal_the_sum_of_usage_exactly() {
    let sim = start(SimConfig {
        stop_probability_per_token: 0.05,
        step_base_ms: 2.0,
        step_per_seq_ms: 0.2,
        ..cfg()
    })
    .await;
    let bodies: Vec<(&str, String)> = (0..12)
        .map(|i| match i % 4 {
            0 => ("/v1/chat/completions", format!(r#"{{"messages":[{{"role":"user","content":"p{i}"}}],"max_tokens":30,"stream":true,"stream_options":{{"include_usage":true}}}}"#)),
            1 => ("/v1/chat/completions", format!(r#"{{"messages":[{{"role":"user","content":"p{i}"}}],"max_tokens":30}}"#)),
            2 => ("/v1/chat/completions", format!(r#"{{"messages":[{{"role":"user","content":"p{i}"}}],"max_tokens":30,"n":2}}"#)),
            _ => ("/v1/completions", format!(r#"{{"prompt":"p{i}","max_tokens":30,"stream":true,"stream_options":{{"include_usage":true}}}}"#)),
        })
        .collect();
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|(p, b)| {
            let a = sim.addr();
            tokio::spawn(async move { post(a, p, &b).await })
        })
        .collect();
    let (mut completion, mut prompt, mut stops) = (0u64, 0u64, 0usize);
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        let usage = if r.header("content-type") == Some("application/json") {
            let v = r.json();
            stops += v["choices"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|c| c["finish_reason"] == "stop")
                .count();
            v["usage"].clone()
        } else {
            let ev = r.events();
            stops += ev
                .iter()
                .filter(|e| e.contains("\"finish_reason\":\"stop\""))
                .count();
            serde_json::from_str::<Value>(&ev[ev.len() - 2]).unwrap()["usage"].clone()
        };
        completion += usage["completion_tokens"].as_u64().unwrap();
        prompt += usage["prompt_tokens"].as_u64().unwrap();
    }
    assert!(
        stops > 0,
        "with p = 0.05 over 30 tokens some sequences must stop early"
    );
    let c = sim.counters();
    assert_eq!(c.generation_tokens_total, completion);
    assert_eq!(c.prompt_tokens_total, prompt);
    assert_eq!(
        (
            c.requests_finished,
            c.requests_aborted,
            c.requests_running,
            c.requests_waiting
        ),
        (12, 0, 0, 0)
    );
    assert_eq!(
        sim.generated_tokens_in(0, u64::MAX),
        completion,
        "per-second ring holds every token"
    );
    let now_s = tokenmeter::clock::Clock::global().now() / 1_000_000_000;
    assert_eq!(sim.generated_tokens_in(now_s + 1, now_s + 100), 0);
    sim.shutdown().await;
}

/// Polls `cond` every 5 ms for at most 3 s (the engine's state changes at step boundaries).
async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_aborts_and_frees_the_slot() {
    let sim = start(SimConfig {
        step_base_ms: 5.0,
        step_per_seq_ms: 0.5,
        ..cfg()
    })
    .await;
    // Streaming: read a few events, then hang up.
    let mut s = TcpStream::connect(sim.addr()).await.unwrap();
    send(
        &mut s,
        "POST",
        "/v1/chat/completions",
        Some("application/json"),
        &stream_body("abort me", 100_000),
    )
    .await;
    let mut buf = vec![0u8; 4096];
    let mut got = 0usize;
    while got < 5 {
        use tokio::io::AsyncReadExt;
        let n = s.read(&mut buf).await.unwrap();
        got += String::from_utf8_lossy(&buf[..n])
            .matches("\"delta\":{\"content\"")
            .count();
    }
    assert_eq!(sim.counters().requests_running, 1);
    drop(s);
    assert!(
        eventually(|| sim.counters().requests_aborted == 1).await,
        "stream abort not seen"
    );
    let c = sim.counters();
    assert_eq!(c.requests_running, 0);
    assert!(c.generation_tokens_total >= got as u64);
    // Non-streaming: hang up while it generates.
    let mut s = TcpStream::connect(sim.addr()).await.unwrap();
    send(
        &mut s,
        "POST",
        "/v1/chat/completions",
        Some("application/json"),
        r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":100000,"ignore_eos":true}"#,
    )
    .await;
    assert!(eventually(|| sim.counters().requests_running == 1).await);
    drop(s);
    assert!(
        eventually(|| sim.counters().requests_aborted == 2).await,
        "non-streaming abort not seen"
    );
    let total = sim.counters().generation_tokens_total;
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(
        sim.counters().generation_tokens_total,
        total,
        "nothing generated after the abort"
    );
    assert_eq!(sim.counters().requests_running, 0);
    assert_eq!(sim.generated_tokens_in(0, u64::MAX), total);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_request_waits_for_a_slot() {
    let sim = start(SimConfig {
        max_num_seqs: 2,
        step_base_ms: 4.0,
        step_per_seq_ms: 0.5,
        ..cfg()
    })
    .await;
    let a = sim.addr();
    let tasks: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(async move {
                post(
                    a,
                    "/v1/chat/completions",
                    &stream_body(&format!("q{i}"), 20),
                )
                .await
            })
        })
        .collect();
    assert!(
        eventually(|| {
            let c = sim.counters();
            c.requests_running == 2 && c.requests_waiting == 1
        })
        .await
    );
    let mut rs = Vec::new();
    for t in tasks {
        rs.push(t.await.unwrap());
    }
    rs.sort_by_key(|r| token_times(r)[0]);
    let last_of_first_two = token_times(&rs[0])[19].max(token_times(&rs[1])[19]);
    assert!(
        token_times(&rs[2])[0] > last_of_first_two,
        "the third starts after a slot frees"
    );
    assert_eq!(sim.counters().requests_waiting, 0);
    sim.shutdown().await;
}

/// Parses Prometheus text: every sample line is `name{labels} value`; returns (series, value).
fn parse_prom(text: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            assert!(
                line.is_empty() || line.starts_with("# HELP ") || line.starts_with("# TYPE "),
                "{line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line}"));
        let name_end = series
            .find('{')
            .unwrap_or_else(|| panic!("no labels: {line}"));
        assert!(series.ends_with('}'), "{line}");
        assert!(
            series[..name_end]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        for pair in series[name_end + 1..series.len() - 1].split("\",") {
            let (k, v) = pair
                .split_once("=\"")
                .unwrap_or_else(|| panic!("bad label in {line}"));
            assert!(
                !k.is_empty() && !v.contains('"') || v.ends_with('"'),
                "{line}"
            );
        }
        out.push((
            series.to_string(),
            value.parse().unwrap_or_else(|_| panic!("bad value {line}")),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_text_parses_and_counters_are_monotonic() {
    let sim = start(SimConfig {
        step_base_ms: 2.0,
        step_per_seq_ms: 0.2,
        ..cfg()
    })
    .await;
    let a = sim.addr();
    post(a, "/v1/chat/completions", &stream_body("m1", 10)).await;
    let first = parse_prom(&request(a, "GET", "/metrics", None, "").await.body);
    post(a, "/v1/chat/completions", &stream_body("m2", 7)).await;
    let r = request(a, "GET", "/metrics", None, "").await;
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let second = parse_prom(&r.body);
    let get =
        |s: &[(String, f64)], k: &str| s.iter().find(|(n, _)| n == k).map(|(_, v)| *v).unwrap();
    let gen = "vllm:generation_tokens_total{engine=\"0\",model_name=\"sim-model\"}";
    assert_eq!((get(&first, gen), get(&second, gen)), (10.0, 17.0));
    assert_eq!(
        get(&second, gen) as u64,
        sim.counters().generation_tokens_total
    );
    for (series, v) in &first {
        let cumulative = ["_total{", "_count{", "_sum{", "_bucket{"]
            .iter()
            .any(|s| series.contains(s));
        if cumulative {
            assert!(get(&second, series) >= *v, "{series} went down");
        }
    }
    let ttft_count =
        "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"sim-model\"}";
    assert_eq!(get(&second, ttft_count), 2.0);
    let itl_count = "vllm:inter_token_latency_seconds_count{engine=\"0\",model_name=\"sim-model\"}";
    assert_eq!(get(&second, itl_count), (9 + 6) as f64);
    let length = "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"sim-model\"}";
    assert_eq!(get(&second, length), 2.0);
    let fixture = std::fs::read_to_string(format!(
        "{}/tests/fixtures/vllm/metrics_during_load_c8.txt",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    for name in [
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
    ] {
        let les = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| l.starts_with(&format!("vllm:{name}_bucket{{")))
                .map(|l| {
                    l.split("le=\"")
                        .nth(1)
                        .unwrap()
                        .split('"')
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        assert_eq!(les(&r.body), les(&fixture), "{name} bucket bounds");
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_pace_emits_stamped_events_on_schedule() {
    let sim = start(SimConfig {
        fixed_pace: true,
        fixed_ttft_ms: 30.0,
        fixed_gap_ms: 10.0,
        stamp_events: true,
        ..cfg()
    })
    .await;
    let before = tokenmeter::sim::wire::monotonic_ns();
    let r = post(
        sim.addr(),
        "/v1/chat/completions",
        &stream_body("fixed", 10),
    )
    .await;
    let after = tokenmeter::sim::wire::monotonic_ns();
    let ev = r.events();
    assert_eq!(ev.len(), 1 + 10 + 1 + 1, "role, 10 tokens, usage, [DONE]");
    let stamps: Vec<u64> = ev[..ev.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["tm_sent_ns"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(stamps.iter().all(|s| *s >= before && *s <= after));
    let first_token = stamps[1] as f64;
    assert!(
        (first_token - before as f64) / 1e6 >= 30.0,
        "TTFT at least 30 ms"
    );
    for w in stamps[1..11].windows(2) {
        let gap_ms = (w[1] - w[0]) as f64 / 1e6;
        assert!((gap_ms - 10.0).abs() < 4.0, "gap {gap_ms} ms");
    }
    let span_ms = (stamps[10] - stamps[1]) as f64 / 1e6;
    assert!(
        (span_ms - 90.0).abs() < 4.0,
        "absolute deadlines keep the 9 gaps at 90 ms: {span_ms}"
    );
    let u = serde_json::from_str::<Value>(&ev[ev.len() - 2]).unwrap()["usage"].clone();
    assert_eq!(u["completion_tokens"].as_u64(), Some(10));
    assert_eq!(sim.counters().generation_tokens_total, 10);
    assert_eq!(sim.counters().requests_finished, 1);
    sim.shutdown().await;
}
