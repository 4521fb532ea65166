//! The running simulator over real sockets: decode rates per concurrency level against the step
//! formula, exact token accounting, aborts, FIFO queueing, /metrics text and fixed-pace mode.

use std::time::{Duration, Instant};

use crate::sim_support::*;
use serde_json::Value;
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
        per_request_metrics: true,
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
    // A slot frees when the first of the two running requests finishes.
    let first_free = token_times(&rs[0])[19].min(token_times(&rs[1])[19]);
    assert!(
        token_times(&rs[2])[0] > first_free,
        "the third starts after a slot frees"
    );
    // The engine's own schedule: the third queued for at least 19 decode steps of 2 sequences.
    let queue_ms = |r: &Resp| {
        let ev = r.events();
        let v: serde_json::Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
        v["metrics"]["queue_time_ms"].as_f64().unwrap()
    };
    assert!(queue_ms(&rs[2]) >= 19.0 * 5.0, "queue {}", queue_ms(&rs[2]));
    assert!(queue_ms(&rs[0]) < 5.0 && queue_ms(&rs[1]) < 10.0);
    assert_eq!(sim.counters().requests_waiting, 0);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_shorter_than_the_timer_resolution_resync_instead_of_bursting() {
    // 0.2 ms steps cannot be slept precisely (tokio's timer has 1 ms resolution): the lag passes
    // resync_lag_ms, the schedule re-anchors and the slip is reported; tokens still all arrive.
    let sim = start(SimConfig {
        step_base_ms: 0.2,
        step_per_seq_ms: 0.0,
        resync_lag_ms: 0.5,
        ..cfg()
    })
    .await;
    let r = post(sim.addr(), "/v1/chat/completions", &stream_body("fast", 30)).await;
    assert_eq!(token_times(&r).len(), 30);
    let lag = sim.step_lag();
    assert_eq!(lag.steps, 30);
    assert!(lag.resyncs > 0 && lag.slip_ns > 0, "{lag:?}");
    assert!(lag.max_ns > 500_000, "{lag:?}");
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_arriving_mid_step_counts_as_waiting_until_the_boundary() {
    let sim = start(SimConfig {
        step_base_ms: 300.0,
        step_per_seq_ms: 0.0,
        ..cfg()
    })
    .await;
    let a = sim.addr();
    let first =
        tokio::spawn(async move { post(a, "/v1/chat/completions", &stream_body("w1", 2)).await });
    assert!(eventually(|| sim.counters().requests_running == 1).await);
    let t0 = Instant::now();
    let second =
        tokio::spawn(async move { post(a, "/v1/chat/completions", &stream_body("w2", 1)).await });
    assert!(eventually(|| sim.counters().requests_waiting == 1).await);
    assert!(
        t0.elapsed() < Duration::from_millis(250),
        "seen as waiting before the step boundary"
    );
    assert!(
        eventually(|| sim.counters().requests_running == 2).await,
        "admitted at the boundary"
    );
    first.await.unwrap();
    second.await.unwrap();
    let c = sim.counters();
    assert_eq!(
        (
            c.requests_waiting,
            c.requests_running,
            c.generation_tokens_total
        ),
        (0, 0, 3)
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_leaving_while_queued_is_aborted_before_admission() {
    let sim = start(SimConfig {
        max_num_seqs: 1,
        step_base_ms: 5.0,
        step_per_seq_ms: 0.0,
        ..cfg()
    })
    .await;
    let a = sim.addr();
    let first =
        tokio::spawn(
            async move { post(a, "/v1/chat/completions", &stream_body("busy", 40)).await },
        );
    assert!(eventually(|| sim.counters().requests_running == 1).await);
    let mut s = TcpStream::connect(a).await.unwrap();
    send(
        &mut s,
        "POST",
        "/v1/chat/completions",
        Some("application/json"),
        &stream_body("leaver", 40),
    )
    .await;
    assert!(eventually(|| sim.counters().requests_waiting == 1).await);
    drop(s);
    first.await.unwrap();
    assert!(eventually(|| sim.counters().requests_aborted == 1).await);
    let c = sim.counters();
    assert_eq!(
        c.generation_tokens_total, 40,
        "the queued request never generated: {c:?}"
    );
    assert_eq!((c.requests_waiting, c.requests_running), (0, 0));
    sim.shutdown().await;
}
