//! Every agent call fully measured: the recorded streams whose only output is at most the start
//! of a tool call (`agents/toolonly/`, a real vLLM 0.32 generating 24 tokens in each) get a TTFT,
//! with `ttft_source` saying whether it is the first event that showed output or, when none did,
//! the event that ended the generation. On a manual clock, so every figure is exact.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use tokenmeter::clock::TimeSource;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads from `c` until the bytes received so far (the body de-chunked: the proxy may pass an
/// event in several frames) contain `marker`.
async fn read_until(c: &mut TcpStream, got: &mut Vec<u8>, marker: &[u8]) {
    let mut buf = [0u8; 4096];
    let seen = |got: &[u8]| match find(got, b"\r\n\r\n") {
        Some(end) if marker != b"\r\n\r\n" => find(&dechunk(&got[end + 4..]).0, marker).is_some(),
        Some(_) => true,
        None => false,
    };
    while !seen(got) {
        let k = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("proxy answered")
            .unwrap();
        assert!(k > 0, "closed before {:?}", String::from_utf8_lossy(marker));
        got.extend_from_slice(&buf[..k]);
    }
}

/// Replays `name` through the proxy, one event every 10 ms of the proxy's clock (the first 10 ms
/// after the request), and returns the request's log line.
async fn replay_gated(name: &str, path: &str, body: &str) -> serde_json::Value {
    let fx = fixture(&format!("agents/toolonly/{name}"));
    let time = TimeSource::manual();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let mut script = fx.script(Duration::ZERO);
    let events = fx.events();
    // Each event's chunk waits at the gate; the head and the last chunk do not.
    let mut steps = vec![script.steps.remove(0)];
    for e in &events {
        steps.push(Step::Gate(gate.clone()));
        steps.push(Step::Chunk(Duration::ZERO, e.clone()));
    }
    steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
    let mut up = FakeUpstream::start(vec![Script { steps }]).await;
    let proxy = TestProxy::start_with_time(&up.url(), time.clone(), |_| {}).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(&post(path, body, &[])).await.unwrap();
    up.seen.recv().await.unwrap();
    let mut got = Vec::new();
    read_until(&mut c, &mut got, b"\r\n\r\n").await;
    for e in &events {
        time.advance(Duration::from_millis(10));
        gate.add_permits(1);
        // An event's last 24 bytes are its own (ids and sequence numbers differ).
        let tail = e.trim_ascii_end();
        read_until(&mut c, &mut got, &tail[tail.len().saturating_sub(24)..]).await;
    }
    drop(c);
    let mut lines = proxy.finish().await;
    assert_eq!(lines.len(), 1, "{name}");
    lines.remove(0)
}

#[tokio::test]
async fn tool_only_streams_get_a_ttft_with_its_source() {
    let chat = r#"{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}"#;
    let other = r#"{"model":"tiny-llama","input":"x","messages":[{"role":"user","content":"x"}],"stream":true}"#;
    // (file, route, body, TTFT in ms, its source): the event that shows output is the n-th,
    // read at n × 10 ms.
    let cases = [
        // The role chunk, then the finish chunk (finish_reason "length"): no output at all.
        (
            "t01_chat_stream_named_tool_no_delta.http",
            "/v1/chat/completions",
            chat,
            20.0,
            "stream_end",
        ),
        // The function_call item's start (3rd event) is the output.
        (
            "t02_responses_stream_required_tool_empty_args.http",
            "/v1/responses",
            other,
            30.0,
            "stream",
        ),
        // message_start, then message_delta with the stop reason and 24 tokens: no block.
        (
            "t03_messages_stream_any_tool_no_block.http",
            "/v1/messages",
            other,
            20.0,
            "stream_end",
        ),
        // The tool_use block's start (2nd event) is the output.
        (
            "t04_messages_stream_any_tool_use_no_input_delta.http",
            "/v1/messages",
            other,
            20.0,
            "stream",
        ),
        // The tool_calls delta with the name (2nd event), as before.
        (
            "t05_chat_stream_named_tool_name_only.http",
            "/v1/chat/completions",
            chat,
            20.0,
            "stream",
        ),
    ];
    for (name, path, body, ttft, source) in cases {
        let l = replay_gated(name, path, body).await;
        assert_schema("record.schema.json", &l);
        assert_eq!(l["outcome"], "ok", "{name}: {l}");
        assert_eq!(l["completion_tokens"], 24, "{name}: {l}");
        assert_eq!(l["ttft_ms"].as_f64(), Some(ttft), "{name}: {l}");
        assert_eq!(l["ttft_source"], source, "{name}: {l}");
        if source == "stream_end" {
            // The pace of tokens that never showed is not observed.
            assert!(l["tpot_ms"].is_null(), "{name}: {l}");
        }
    }
}

#[tokio::test]
async fn a_stream_that_generated_nothing_has_no_ttft() {
    // The same ending as t01 with zero tokens: nothing was generated, so no TTFT.
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    let ev = |s: &str| Step::Chunk(Duration::ZERO, format!("data: {s}\n\n").into_bytes());
    let steps = vec![
        Step::Raw(Duration::ZERO, head.as_bytes().to_vec()),
        ev(
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        ),
        ev(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#),
        ev(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0,"total_tokens":3}}"#),
        ev("[DONE]"),
        Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()),
    ];
    let up = FakeUpstream::start(vec![Script { steps }]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let body =
        r#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#;
    let got = raw_request(proxy.addr, &post("/v1/chat/completions", body, &[])).await;
    assert_eq!(got.status, 200);
    let l = &proxy.finish().await[0];
    assert_eq!(l["completion_tokens"], 0, "{l}");
    assert!(l["ttft_ms"].is_null() && l["ttft_source"].is_null(), "{l}");
}
