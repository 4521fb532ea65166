//! The proxy forwards recorded vLLM answers byte for byte and logs exact measurements.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use tokenmeter::clock::TimeSource;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";

async fn one(
    fixture_name: &str,
    path: &str,
    body: &str,
) -> (Received, Vec<serde_json::Value>, Seen) {
    let fx = fixture(fixture_name);
    let mut up = FakeUpstream::start(vec![fx.script(Duration::from_millis(20))]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let got = raw_request(proxy.addr, &post(path, body, &[])).await;
    let lines = proxy.finish().await;
    for l in &lines {
        assert_schema("record.schema.json", l);
    }
    let seen = up.seen.recv().await.unwrap();
    (got, lines, seen)
}

#[tokio::test]
async fn non_streaming_passes_bytes_and_logs_usage() {
    let fx = fixture("01_chat_nonstream.http");
    let req = r#"{"model":"tiny-llama","messages":[{"role":"user","content":"def hello():"}],"max_tokens":16,"temperature":0}"#;
    let (got, lines, seen) = one("01_chat_nonstream.http", CHAT, req).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, fx.body);
    assert_eq!(
        seen.body,
        req.as_bytes(),
        "request body forwarded unchanged"
    );
    assert_eq!(lines.len(), 1);
    let l = &lines[0];
    assert_eq!(l["outcome"], "ok");
    assert_eq!(l["stream"], false);
    assert_eq!(l["prompt_tokens"], 12);
    assert_eq!(l["completion_tokens"], 16);
    assert_eq!(l["tokens_source"], "usage");
    assert_eq!(l["finish_reason"], "length");
    assert!(l["ttft_ms"].is_null());
    assert!(l["e2e_ms"].as_f64().unwrap() >= 20.0);
    assert_eq!(l["model"], "tiny-llama");
    assert_eq!(l["in_flight_at_start"], 1);
    assert_eq!(l["bytes_out"], fx.body.len());
}

#[tokio::test]
async fn stream_without_usage_is_injected_and_the_usage_event_hidden() {
    // The client did not ask for usage: the proxy asks upstream (which answers like fixture 03)
    // and removes the usage event, so the client receives what vLLM would have sent it.
    let upstream_answer = fixture("03_chat_stream_usage.http");
    let req = r#"{"model":"tiny-llama","messages":[{"role":"user","content":"def hello():"}],"max_tokens":5,"temperature":0,"stream":true}"#;
    let (got, lines, seen) = one("03_chat_stream_usage.http", CHAT, req).await;
    let events = upstream_answer.events();
    let expected: Vec<u8> = events
        .iter()
        .filter(|e| !String::from_utf8_lossy(e).contains("\"choices\":[]"))
        .flatten()
        .copied()
        .collect();
    assert_eq!(
        events.len() - 1,
        expected.iter().filter(|&&b| b == b'\n').count() / 2
    );
    assert_eq!(
        String::from_utf8_lossy(&got.body),
        String::from_utf8_lossy(&expected)
    );
    assert!(got.complete);
    let forwarded: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(forwarded["stream_options"]["include_usage"], true);
    assert!(
        seen.body.starts_with(&req.as_bytes()[..req.len() - 1]),
        "original bytes kept in order"
    );
    let l = &lines[0];
    assert_eq!(
        (l["completion_tokens"].as_u64(), l["prompt_tokens"].as_u64()),
        (Some(5), Some(12))
    );
    assert_eq!(l["tokens_source"], "usage");
    assert_eq!(l["stream"], true);
    // Headers immediately, the role+first token event after one 20 ms gap.
    let ttft = l["ttft_ms"].as_f64().unwrap();
    assert!(ttft >= 20.0, "ttft {ttft}");
    assert!(l["e2e_ms"].as_f64().unwrap() >= ttft + 5.0 * 20.0);
    assert!(l["tpot_ms"].as_f64().unwrap() >= 19.0);
    assert_eq!(l["bytes_out"], expected.len());
}

#[tokio::test]
async fn stream_that_asked_for_usage_passes_untouched() {
    for (name, completion) in [
        ("03_chat_stream_usage.http", 5),
        ("04_chat_stream_usage_continuous.http", 5),
        ("05_chat_stream_usage_n2.http", 6),
    ] {
        let fx = fixture(name);
        let req = r#"{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}"#;
        let (got, lines, seen) = one(name, CHAT, req).await;
        assert_eq!(got.body, fx.body, "{name}");
        assert_eq!(seen.body, req.as_bytes());
        assert_eq!(lines[0]["completion_tokens"], completion, "{name}");
        assert_eq!(lines[0]["tokens_source"], "usage");
        assert_eq!(lines[0]["finish_reason"], "length");
    }
}

#[tokio::test]
async fn stream_without_any_usage_counts_events() {
    // An upstream that ignores stream_options: the count of content events, marked as counted.
    let fx = fixture("02_chat_stream_plain.http");
    let req = r#"{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],"stream":true}"#;
    let (got, lines, _) = one("02_chat_stream_plain.http", CHAT, req).await;
    assert_eq!(got.body, fx.body);
    assert_eq!(lines[0]["completion_tokens"], 5);
    assert_eq!(lines[0]["tokens_source"], "counted");
    assert!(lines[0]["prompt_tokens"].is_null());
}

#[tokio::test]
async fn completions_endpoint_streaming_and_not() {
    let fx = fixture("09_completions_stream_usage.http");
    let req = r#"{"model":"tiny-llama","prompt":"def hello():","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}"#;
    let (got, lines, _) = one("09_completions_stream_usage.http", "/v1/completions", req).await;
    assert_eq!(got.body, fx.body);
    assert_eq!(
        (
            lines[0]["completion_tokens"].as_u64(),
            lines[0]["prompt_tokens"].as_u64()
        ),
        (Some(4), Some(5))
    );
    assert!(lines[0]["ttft_ms"].as_f64().is_some());
    let fx = fixture("10_completions_nonstream.http");
    let (got, lines, _) = one(
        "10_completions_nonstream.http",
        "/v1/completions",
        r#"{"model":"tiny-llama","prompt":"x"}"#,
    )
    .await;
    assert_eq!(got.body, fx.body);
    assert_eq!(lines[0]["completion_tokens"], 4);
}

#[tokio::test]
async fn upstream_errors_reach_the_client_unchanged() {
    for (name, status) in [
        ("e03_max_tokens_too_big.http", 400),
        ("e02_unknown_model.http", 404),
        ("e13_stream_max_tokens_too_big.http", 400),
    ] {
        let fx = fixture(name);
        let req = r#"{"model":"tiny-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":100000,"stream":true}"#;
        let (got, lines, _) = one(name, CHAT, req).await;
        assert_eq!(got.status, status);
        assert_eq!(got.body, fx.body, "{name}");
        assert_eq!(
            got.header("content-type").as_deref(),
            Some("application/json")
        );
        // vLLM refusing the request is the client's fault, not an error of the box.
        assert_eq!(lines[0]["outcome"], "client_error");
        assert_eq!(lines[0]["status"], status);
        assert_eq!(lines[0]["tokens_source"], "none");
    }
}

#[tokio::test]
async fn error_event_inside_a_200_stream_is_an_upstream_error() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n";
    let script = Script {
        steps: vec![
            Step::Raw(Duration::ZERO, head.as_bytes().to_vec()),
            Step::Chunk(Duration::ZERO, b"data: {\"error\":{\"message\":\"engine died\",\"type\":\"InternalServerError\",\"code\":500}}\n\n".to_vec()),
            Step::Chunk(Duration::ZERO, b"data: [DONE]\n\n".to_vec()),
            Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()),
        ],
    };
    let up = FakeUpstream::start(vec![script]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let got = raw_request(proxy.addr, &post(CHAT, r#"{"stream":true}"#, &[])).await;
    assert!(String::from_utf8_lossy(&got.body).contains("engine died"));
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["outcome"], "upstream_error");
    assert_eq!(lines[0]["status"], 200);
}

#[tokio::test]
async fn upstream_down_is_a_502_with_an_openai_error() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let proxy = TestProxy::start(&format!("http://127.0.0.1:{port}"), |_| {}).await;
    let t = std::time::Instant::now();
    let got = raw_request(
        proxy.addr,
        &post(CHAT, r#"{"model":"m","messages":[]}"#, &[]),
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(got.status, 502);
    let v = got.json();
    assert_eq!(v["error"]["code"], 502);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("connection refused"));
    assert!(
        !v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("127.0.0.1"),
        "no internal address"
    );
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["outcome"], "proxy_error");
    assert_eq!(lines[0]["status"], 502);
}

#[tokio::test]
async fn other_paths_pass_through_and_are_logged_unmetered() {
    let fx = fixture("00_models.http");
    let up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let got = raw_request(
        proxy.addr,
        b"GET /v1/models?x=1 HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(got.body, fx.body);
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["path"], "/v1/models");
    assert_eq!(lines[0]["in_flight_at_start"], 0);
}

#[test]
fn the_record_schema_rejects_incomplete_or_unknown_fields() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/schemas/record.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let v = jsonschema::validator_for(&schema).unwrap();
    assert!(!v.is_valid(&serde_json::json!({"type": "request", "schema": 1})));
    let mut full: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/access_log_line.json")).unwrap();
    assert!(v.is_valid(&full), "the sample line is valid");
    full["surprise"] = serde_json::json!(1);
    assert!(!v.is_valid(&full));
}

/// Reads from `c` until the bytes received so far contain `marker`.
async fn read_until(c: &mut TcpStream, got: &mut Vec<u8>, marker: &str) {
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(got).contains(marker) {
        let k = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("proxy answered")
            .unwrap();
        assert!(k > 0, "closed before {marker:?}");
        got.extend_from_slice(&buf[..k]);
    }
}

#[tokio::test]
async fn timings_are_exact_on_a_manual_clock() {
    // The test holds the proxy's clock: it advances it, then opens the upstream's gate for the
    // next event, and reads that event through the proxy before moving the clock again. Every
    // event is therefore read by the proxy at a known instant, whatever the machine's load.
    let time = TimeSource::manual();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n";
    let ev = |s: &str| Step::Chunk(Duration::ZERO, format!("data: {s}\n\n").into_bytes());
    let token = |i: usize| format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"t{i}"}}}}]}}"#);
    let mut steps = vec![Step::Raw(Duration::ZERO, head.as_bytes().to_vec())];
    for i in 0..4 {
        steps.push(Step::Gate(gate.clone()));
        steps.push(ev(&token(i)));
    }
    steps.push(Step::Gate(gate.clone()));
    steps.push(ev(
        r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#,
    ));
    steps.push(ev("[DONE]"));
    steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
    let mut up = FakeUpstream::start(vec![Script { steps }]).await;
    let proxy = TestProxy::start_with_time(&up.url(), time.clone(), |_| {}).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    let req = r#"{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}"#;
    c.write_all(&post(CHAT, req, &[])).await.unwrap();
    up.seen.recv().await.unwrap();
    let mut got = Vec::new();
    read_until(&mut c, &mut got, "\r\n\r\n").await;
    // First token 40 ms after the request, then gaps of 10, 30 and 20 ms; the end 5 ms later.
    for (i, ms) in [40u64, 10, 30, 20].into_iter().enumerate() {
        time.advance(Duration::from_millis(ms));
        gate.add_permits(1);
        read_until(&mut c, &mut got, &format!("\"t{i}\"")).await;
    }
    time.advance(Duration::from_millis(5));
    gate.add_permits(1);
    read_until(&mut c, &mut got, "[DONE]").await;
    let lines = proxy.finish().await;
    let l = &lines[0];
    eprintln!("{l}");
    assert_eq!(l["outcome"], "ok", "{l}");
    assert_eq!(l["completion_tokens"], 4);
    assert_eq!(
        l["first_byte_ms"].as_f64(),
        Some(40.0),
        "first body byte: {l}"
    );
    assert_eq!(l["ttft_ms"].as_f64(), Some(40.0), "{l}");
    assert_eq!(l["e2e_ms"].as_f64(), Some(105.0), "{l}");
    // TPOT = (e2e − TTFT) / (tokens − 1) = 65 / 3; the gaps 10, 30 and 20 ms.
    let tpot = l["tpot_ms"].as_f64().unwrap();
    assert!((tpot - 65.0 / 3.0).abs() < 1e-3, "{l}");
    assert_eq!(l["itl_max_ms"].as_f64(), Some(30.0), "{l}");
    assert_eq!(l["itl_mean_ms"].as_f64(), Some(20.0), "{l}");
    // The token curve: the gaps change at every event (10, 30, 20 ms), so no straight line
    // passes within 0.1 token of two of them and every event is a point: the first at 40 ms
    // since arrival, then 10, 30 and 20 ms after the previous one, a token each.
    assert_eq!(
        l["token_curve"],
        serde_json::json!([40, 1, 10, 1, 30, 1, 20, 1])
    );
}
