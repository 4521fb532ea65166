//! The simulator speaks vLLM 0.32's wire format: every response type is compared with the
//! recorded fixtures (shapes, key order, event order, usage placement; error bodies byte for byte).

use crate::sim_support::*;
use serde_json::Value;
use tokenmeter::sim::SimConfig;

/// Same served name and context length as the recorded server, fast steps, no stop rule.
fn wire_cfg() -> SimConfig {
    SimConfig {
        served_model_name: "tiny-llama".into(),
        max_model_len: 2048,
        step_base_ms: 1.0,
        step_per_seq_ms: 0.1,
        ..cfg()
    }
}

fn parse_events(body: &str) -> Vec<String> {
    sse_events(body)
}

fn event_shapes(events: &[String]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            if e == "[DONE]" {
                e.clone()
            } else {
                shape(&serde_json::from_str::<Value>(e).unwrap())
            }
        })
        .collect()
}

/// Streams `req` and checks it against fixture `name`: same event shapes in the same order, one
/// event per HTTP chunk, vLLM's headers.
async fn check_stream(
    addr: std::net::SocketAddr,
    path: &str,
    req: &str,
    name: &str,
    sort: bool,
) -> Vec<String> {
    let r = post(addr, path, req).await;
    let (status, headers, body) = fixture(name);
    assert_eq!(r.status, status);
    let want_ct = headers
        .iter()
        .find(|(k, _)| k == "content-type")
        .unwrap()
        .1
        .clone();
    assert_eq!(r.header("content-type"), Some(want_ct.as_str()));
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    let got = r.events();
    assert_eq!(r.chunks.len(), got.len(), "one event per chunk");
    for (_, c) in &r.chunks {
        assert!(
            c.starts_with("data: ") && c.ends_with("\n\n") && c.matches("data: ").count() == 1,
            "{c:?}"
        );
    }
    let mut a = event_shapes(&got);
    let mut b = event_shapes(&parse_events(&body));
    if sort {
        a.sort();
        b.sort();
    }
    assert_eq!(a, b, "{name}: event shapes differ");
    got
}

async fn check_full(addr: std::net::SocketAddr, path: &str, req: &str, name: &str) -> Value {
    let r = post(addr, path, req).await;
    let (status, _, body) = fixture(name);
    assert_eq!(r.status, status);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("content-length")
            .map(|v| v.parse::<usize>().unwrap()),
        Some(r.body.len())
    );
    let got = r.json();
    let want: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(shape(&got), shape(&want), "{name}: shape differs");
    got
}

fn usage_of(events: &[String]) -> Value {
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    last["usage"].clone()
}

#[tokio::test]
async fn chat_streams_match_fixtures() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();
    let base = r#""model":"tiny-llama","messages":[{"role":"user","content":"def hello():"}],"temperature":0"#;
    let ev = check_stream(
        a,
        "/v1/chat/completions",
        &format!("{{{base},\"max_tokens\":5,\"stream\":true}}"),
        "02_chat_stream_plain",
        false,
    )
    .await;
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let ev = check_stream(a, "/v1/chat/completions", &format!("{{{base},\"max_tokens\":5,\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}"), "03_chat_stream_usage", false).await;
    let u = usage_of(&ev);
    assert_eq!(
        (
            u["prompt_tokens"].as_u64(),
            u["completion_tokens"].as_u64(),
            u["total_tokens"].as_u64()
        ),
        (Some(10), Some(5), Some(15))
    );
    let ev = check_stream(a, "/v1/chat/completions", &format!("{{{base},\"max_tokens\":5,\"stream\":true,\"stream_options\":{{\"include_usage\":true,\"continuous_usage_stats\":true}}}}"), "04_chat_stream_usage_continuous", false).await;
    let cum: Vec<u64> = ev[..ev.len() - 2]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["usage"]["completion_tokens"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(cum, vec![0, 1, 2, 3, 4, 5]);
    let ev = check_stream(a, "/v1/chat/completions", &format!("{{{base},\"max_tokens\":3,\"n\":2,\"seed\":1,\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}"), "05_chat_stream_usage_n2", true).await;
    let idx = |e: &str| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["index"].as_u64();
    assert_eq!(
        (idx(&ev[0]), idx(&ev[1])),
        (Some(0), Some(1)),
        "role events of both choices come first"
    );
    assert!(ev[0].contains("\"role\":\"assistant\"") && ev[1].contains("\"role\":\"assistant\""));
    assert_eq!(usage_of(&ev)["completion_tokens"].as_u64(), Some(6));
    let x = r#""model":"tiny-llama","messages":[{"role":"user","content":"x"}],"temperature":0"#;
    check_stream(a, "/v1/chat/completions", &format!("{{{x},\"max_tokens\":1,\"stream\":true,\"stream_options\":{{\"include_usage\":true}}}}"), "11_chat_stream_max_tokens_1", false).await;
    check_stream(a, "/v1/chat/completions", &format!("{{{x},\"max_tokens\":2,\"stream\":true,\"stream_options\":{{\"include_usage\":false}}}}"), "12_chat_stream_usage_false", false).await;
    sim.shutdown().await;
}

#[tokio::test]
async fn completions_and_non_streaming_match_fixtures() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();
    let ev = check_stream(a, "/v1/completions", r#"{"model":"tiny-llama","prompt":"def hello():","max_tokens":4,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}"#, "09_completions_stream_usage", false).await;
    assert_eq!(usage_of(&ev)["prompt_tokens"].as_u64(), Some(4));
    let v = check_full(
        a,
        "/v1/completions",
        r#"{"model":"tiny-llama","prompt":"def hello():","max_tokens":4,"temperature":0}"#,
        "10_completions_nonstream",
    )
    .await;
    assert_eq!(
        keys(&v),
        keys(&serde_json::from_str(&fixture("10_completions_nonstream").2).unwrap())
    );
    let v = check_full(a, "/v1/chat/completions", r#"{"model":"tiny-llama","messages":[{"role":"user","content":"def hello():"}],"max_tokens":16,"temperature":0}"#, "01_chat_nonstream").await;
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(16));
    assert_eq!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        16,
        "one word per token"
    );
    assert!(
        v["id"].as_str().unwrap().starts_with("chatcmpl-")
            && v["id"].as_str().unwrap().len() == 9 + 16
    );
    let v = check_full(a, "/v1/chat/completions", r#"{"model":"tiny-llama","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"import os"}],"max_tokens":40,"ignore_eos":true,"seed":7}"#, "08_chat_nonstream_ignore_eos").await;
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64(),
        Some((4 + 4) + (3 + 4) + 3)
    );
    let v = check_full(a, "/v1/chat/completions", r#"{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],"max_completion_tokens":3,"temperature":0}"#, "13_chat_max_completion_tokens").await;
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(3));
    let v = check_full(
        a,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"temperature":0}"#,
        "14_chat_no_model_field",
    )
    .await;
    assert_eq!(v["model"].as_str(), Some("tiny-llama"));
    check_full(
        a,
        "/v1/chat/completions",
        r#"{"model":"tiny-llama","messages":[{"role":"wizard","content":"hi"}],"max_tokens":2}"#,
        "e16_bad_role",
    )
    .await;
    sim.shutdown().await;
}

#[tokio::test]
async fn error_bodies_match_fixtures_exactly() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();
    let long: Vec<String> = (0..2500).map(|i| format!("zq{i}")).collect();
    let long_req = format!(
        r#"{{"model":"tiny-llama","messages":[{{"role":"user","content":"{}"}}],"max_tokens":2}}"#,
        long.join(" ")
    );
    let cases: Vec<(&str, &str, Option<&str>, String)> = vec![
        ("e01_invalid_json", "POST", Some("application/json"), r#"{"model": "x", "messages": [ "#.into()),
        ("e02_unknown_model", "POST", Some("application/json"), r#"{"model":"no-such-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#.into()),
        ("e03_max_tokens_too_big", "POST", Some("application/json"), r#"{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":100000}"#.into()),
        ("e04_missing_messages", "POST", Some("application/json"), r#"{"model":"tiny-llama","max_tokens":2}"#.into()),
        ("e05_empty_messages", "POST", Some("application/json"), r#"{"model":"tiny-llama","messages":[],"max_tokens":2}"#.into()),
        ("e06_prompt_too_long", "POST", Some("application/json"), long_req),
        ("e07_wrong_content_type", "POST", Some("text/plain"), r#"{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#.into()),
        ("e08_get_on_post_route", "GET", None, String::new()),
        ("e10_negative_max_tokens", "POST", Some("application/json"), r#"{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":-1}"#.into()),
        ("e11_bad_temperature", "POST", Some("application/json"), r#"{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"temperature":-3}"#.into()),
        ("e12_messages_wrong_type", "POST", Some("application/json"), r#"{"model":"tiny-llama","messages":"hi","max_tokens":2}"#.into()),
        ("e13_stream_max_tokens_too_big", "POST", Some("application/json"), r#"{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":100000,"stream":true,"stream_options":{"include_usage":true}}"#.into()),
        ("e14_stream_options_without_stream", "POST", Some("application/json"), r#"{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream_options":{"include_usage":true}}"#.into()),
        ("e15_empty_body", "POST", Some("application/json"), " ".into()),
    ];
    for (name, method, ct, body) in cases {
        let r = request(a, method, "/v1/chat/completions", ct, &body).await;
        let (status, headers, want) = fixture(name);
        assert_eq!(r.status, status, "{name}");
        assert_eq!(r.body, want, "{name}");
        assert_eq!(r.header("content-type"), Some("application/json"), "{name}");
        if let Some((_, allow)) = headers.iter().find(|(k, _)| k == "allow") {
            assert_eq!(r.header("allow"), Some(allow.as_str()), "{name}");
        }
    }
    let r = post(a, "/v1/nope", "{}").await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (404, fixture("e09_unknown_path").2.as_str())
    );
    // Not in the fixtures: prompt + max_tokens over the context, n over the batch, missing prompt.
    let r = post(
        a,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2045}"#,
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "max_tokens");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2045 > 2048 - 8"),
        "{}",
        r.body
    );
    let r = post(
        a,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"n":300}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("n"))
    );
    let r = post(a, "/v1/completions", r#"{"max_tokens":2}"#).await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("body.prompt"))
    );
    assert_eq!(
        sim.counters().generation_tokens_total,
        0,
        "rejected requests generate nothing"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn info_routes_match_fixtures() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();
    let r = request(a, "GET", "/health", None, "").await;
    assert_eq!(
        (r.status, r.body.as_str(), r.header("content-length")),
        (200, "", Some("0"))
    );
    let r = request(a, "GET", "/v1/models", None, "").await;
    let want: Value = serde_json::from_str(&fixture("00_models").2).unwrap();
    assert_eq!(shape(&r.json()), shape(&want));
    assert_eq!(r.json()["data"][0]["id"].as_str(), Some("tiny-llama"));
    assert_eq!(r.json()["data"][0]["max_model_len"].as_u64(), Some(2048));
    let r = request(a, "GET", "/version", None, "").await;
    assert_eq!(
        shape(&r.json()),
        shape(&serde_json::from_str(&fixture("00_version").2).unwrap())
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn per_request_metrics_fill_the_metrics_field() {
    let sim = start(SimConfig {
        per_request_metrics: true,
        ..wire_cfg()
    })
    .await;
    let r = post(
        sim.addr(),
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":3}"#,
    )
    .await;
    let m = &r.json()["metrics"];
    for k in [
        "queue_time_ms",
        "time_to_first_token_ms",
        "mean_itl_ms",
        "e2e_ms",
    ] {
        assert!(m[k].as_f64().is_some(), "{k} in {m}");
    }
    // Three tokens with one running sequence: each gap is one step of 1.0 + 0.1 ms, on the
    // engine's own schedule. A step that woke late (a loaded machine) re-anchors that schedule
    // and reports the lost time as slip, so the gaps may grow by exactly that much and no more.
    let slip_ms = sim.step_lag().slip_ns as f64 / 1e6;
    let itl = m["mean_itl_ms"].as_f64().unwrap();
    assert!(
        itl >= 1.1 - 1e-6 && itl <= 1.1 + slip_ms / 2.0 + 1e-6,
        "{m}, slip {slip_ms} ms"
    );
    let e2e = m["e2e_ms"].as_f64().unwrap();
    let ttft = m["time_to_first_token_ms"].as_f64().unwrap();
    assert!(
        (e2e - ttft - 2.0 * itl).abs() < 1e-5,
        "e2e {e2e} ttft {ttft} itl {itl}"
    );
    if slip_ms == 0.0 {
        assert!((itl - 1.1).abs() < 1e-9, "{m}");
    }
    let r = post(sim.addr(), "/v1/chat/completions", r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}"#).await;
    let ev = r.events();
    let last: Value = serde_json::from_str(&ev[ev.len() - 2]).unwrap();
    assert!(last["metrics"]["e2e_ms"].as_f64().is_some());
    sim.shutdown().await;
}

#[tokio::test]
async fn stream_headers_are_sent_before_the_first_token() {
    // A 1,600-character prompt (407 tokens) at 2,000 tok/s: about 200 ms of prefill.
    let sim = start(SimConfig {
        prefill_tok_s: 2000.0,
        ..wire_cfg()
    })
    .await;
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"{}"}}],"max_tokens":2,"stream":true}}"#,
        "abcd".repeat(400)
    );
    let r = post(sim.addr(), "/v1/chat/completions", &body).await;
    let to_head = r.head_at.duration_since(r.sent_at).as_secs_f64() * 1e3;
    let to_first = r.chunks[0].0.duration_since(r.sent_at).as_secs_f64() * 1e3;
    assert!(to_head < 100.0, "headers after {to_head} ms");
    assert!(to_first > 190.0, "first event after {to_first} ms");
    assert!(r.chunks[0].1.contains("\"role\":\"assistant\""));
    sim.shutdown().await;
}
