//! Every API coding agents speak, through the proxy over real sockets: OpenAI Responses and
//! Anthropic Messages pass byte for byte (recorded vLLM 0.32 samples) and are measured from their
//! own usage; the stream's end is the API's terminal event; `x-api-key` is a key like a bearer
//! key.

use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const RESPONSES: &str = "/v1/responses";
const MESSAGES: &str = "/v1/messages";
const CHAT: &str = "/v1/chat/completions";

fn agents(name: &str) -> Fixture {
    fixture(&format!("agents/{name}"))
}

/// The data of every event of a recorded stream, parsed.
fn event_json(fx: &Fixture) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&fx.body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// (input, output) tokens a recorded answer reports, read straight from its JSON.
fn recorded_usage(fx: &Fixture, api: &str) -> (u64, u64) {
    let u64_at = |v: &serde_json::Value, p: &str| v.pointer(p).and_then(serde_json::Value::as_u64);
    if !fx.is_stream() {
        let v: serde_json::Value = serde_json::from_slice(&fx.body).unwrap();
        return (
            u64_at(&v, "/usage/input_tokens").unwrap(),
            u64_at(&v, "/usage/output_tokens").unwrap(),
        );
    }
    let evs = event_json(fx);
    if api == "responses" {
        let done = evs
            .iter()
            .find(|e| e["type"] == "response.completed")
            .unwrap();
        (
            u64_at(done, "/response/usage/input_tokens").unwrap(),
            u64_at(done, "/response/usage/output_tokens").unwrap(),
        )
    } else {
        let start = evs.iter().find(|e| e["type"] == "message_start").unwrap();
        let last = evs.iter().rfind(|e| e["type"] == "message_delta").unwrap();
        (
            u64_at(start, "/message/usage/input_tokens").unwrap(),
            u64_at(last, "/usage/output_tokens").unwrap(),
        )
    }
}

#[tokio::test]
async fn responses_and_messages_pass_byte_for_byte_and_are_measured_from_their_usage() {
    let cases = [
        ("r01_responses_nonstream.http", RESPONSES, "responses"),
        ("r02_responses_stream.http", RESPONSES, "responses"),
        (
            "r03_responses_stream_instructions_items.http",
            RESPONSES,
            "responses",
        ),
        (
            "r04_responses_stream_tool_required.http",
            RESPONSES,
            "responses",
        ),
        (
            "r05_responses_nonstream_tool_required.http",
            RESPONSES,
            "responses",
        ),
        ("r06_responses_stream_max_1.http", RESPONSES, "responses"),
        ("m01_messages_nonstream.http", MESSAGES, "messages"),
        ("m02_messages_stream.http", MESSAGES, "messages"),
        (
            "m03_messages_stream_system_blocks.http",
            MESSAGES,
            "messages",
        ),
        ("m04_messages_stream_tool_any.http", MESSAGES, "messages"),
        ("m05_messages_nonstream_tool_any.http", MESSAGES, "messages"),
        ("m06_messages_stream_max_1.http", MESSAGES, "messages"),
        (
            "m10_messages_stream_stop_sequence.http",
            MESSAGES,
            "messages",
        ),
    ];
    for (name, path, api) in cases {
        let fx = agents(name);
        let mut up = FakeUpstream::start(vec![fx.script(Duration::from_millis(3))]).await;
        let proxy = TestProxy::start(&up.url(), |_| {}).await;
        let stream = fx.is_stream();
        let req = format!(r#"{{"model":"tiny-llama","max_tokens":8,"stream":{stream}}}"#);
        let got = raw_request(
            proxy.addr,
            &post(path, &req, &[("x-api-key", "sk-ant-dummy")]),
        )
        .await;
        let lines = proxy.finish().await;
        let seen = up.seen.recv().await.unwrap();
        assert_eq!(got.status, 200, "{name}");
        assert_eq!(got.body, fx.body, "{name}: the client gets vLLM's bytes");
        assert!(got.complete, "{name}");
        assert_eq!(seen.body, req.as_bytes(), "{name}: nothing injected");
        assert_eq!(lines.len(), 1, "{name}");
        let l = &lines[0];
        assert_schema("record.schema.json", l);
        let (input, output) = recorded_usage(&fx, api);
        assert_eq!(l["api"], api, "{name}");
        assert_eq!(l["outcome"], "ok", "{name}");
        assert_eq!(l["prompt_tokens"], input, "{name}");
        assert_eq!(l["completion_tokens"], output, "{name}");
        assert_eq!(l["tokens_source"], "usage", "{name}");
        assert_eq!(l["bytes_out"], fx.body.len(), "{name}");
        assert!(l["bench_ttft_ms"].is_null(), "{name}");
        if stream {
            let ttft = l["ttft_ms"].as_f64().unwrap();
            assert!(ttft > 0.0 && ttft < l["e2e_ms"].as_f64().unwrap(), "{name}");
            assert!(l["first_byte_ms"].as_f64().unwrap() < ttft, "{name}");
            // The token curve holds the tokens the meter was told of as they passed, from the
            // first token event on (whole ms since arrival); the final usage settles the rest
            // (Responses streams count output pieces, not tokens).
            let curve: Vec<u32> = serde_json::from_value(l["token_curve"].clone()).unwrap();
            assert!(tokenmeter::token_curve::valid(&curve), "{name}: {curve:?}");
            let held = tokenmeter::token_curve::total(&curve);
            assert!(held > 0 && held <= output, "{name}: {curve:?}");
            assert!(f64::from(curve[0]) <= ttft + 0.5, "{name}: {curve:?}");
        } else {
            assert!(l["ttft_ms"].is_null(), "{name}");
            assert!(l["token_curve"].is_null(), "{name}");
        }
        if api == "responses" {
            assert_eq!(l["cached_prompt_tokens"], 0, "{name}");
            assert_eq!(l["reasoning_tokens"], 0, "{name}");
        } else {
            assert!(l["cached_prompt_tokens"].is_null(), "{name}");
        }
    }
}

#[tokio::test]
async fn errors_keep_their_shape_and_count_tokens_is_not_generation() {
    let up = FakeUpstream::start(vec![
        agents("r07_responses_unknown_model.http").script(Duration::ZERO),
        agents("m07_messages_unknown_model.http").script(Duration::ZERO),
        agents("m09_messages_count_tokens.http").script(Duration::ZERO),
    ])
    .await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let r = raw_request(proxy.addr, &post(RESPONSES, r#"{"model":"no"}"#, &[])).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.body, agents("r07_responses_unknown_model.http").body);
    let m = raw_request(proxy.addr, &post(MESSAGES, r#"{"model":"no"}"#, &[])).await;
    assert_eq!(m.status, 404);
    assert_eq!(m.json()["type"], "error");
    let c = raw_request(
        proxy.addr,
        &post(
            "/v1/messages/count_tokens",
            r#"{"model":"tiny-llama"}"#,
            &[],
        ),
    )
    .await;
    assert_eq!(c.json()["input_tokens"], 12);
    let stats = raw_request(
        proxy.addr,
        b"GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await
    .json();
    assert_eq!(
        stats["totals"]["requests"], 2,
        "count_tokens is not a generation"
    );
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 3);
    for l in &lines {
        assert_schema("record.schema.json", l);
    }
    assert_eq!(
        (&lines[0]["api"], &lines[0]["status"], &lines[0]["outcome"]),
        (&"responses".into(), &404.into(), &"client_error".into())
    );
    assert_eq!(
        (&lines[1]["api"], &lines[1]["status"], &lines[1]["outcome"]),
        (&"messages".into(), &404.into(), &"client_error".into())
    );
    let ct = &lines[2];
    assert!(ct["api"].is_null());
    assert_eq!(ct["path"], "/v1/messages/count_tokens");
    assert!(ct["prompt_tokens"].is_null() && ct["completion_tokens"].is_null());
    assert_eq!(ct["tokens_source"], "none");
}

/// A 200 stream of `events` (data lines), one chunk each after its wait; `hold` keeps the body
/// open (no terminating chunk) for that long after the last event.
fn sse_script(events: &[(u64, &str)], hold: Duration) -> Script {
    let mut steps = vec![Step::Raw(
        Duration::ZERO,
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
    )];
    for (wait_ms, ev) in events {
        steps.push(Step::Chunk(
            Duration::from_millis(*wait_ms),
            ev.as_bytes().to_vec(),
        ));
    }
    steps.push(Step::Stall(hold));
    steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
    Script { steps }
}

/// Sends `req`, reads until the de-chunked body contains `until`, then closes the connection.
async fn read_until_then_close(addr: std::net::SocketAddr, req: &[u8], until: &str) -> Vec<u8> {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req).await.unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the marker arrives")
            .unwrap();
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
        if let Some(end) = find(&raw, b"\r\n\r\n") {
            let (body, _) = dechunk(&raw[end + 4..]);
            if find(&body, until.as_bytes()).is_some() {
                return body;
            }
        }
    }
}

#[tokio::test]
async fn a_client_that_closes_after_the_terminal_event_is_ok_and_before_it_aborted() {
    let responses: Vec<String> = agents("r02_responses_stream.http")
        .events()
        .into_iter()
        .map(|e| String::from_utf8(e).unwrap())
        .collect();
    let messages: Vec<String> = agents("m02_messages_stream.http")
        .events()
        .into_iter()
        .map(|e| String::from_utf8(e).unwrap())
        .collect();
    let chat: Vec<String> = fixture("03_chat_stream_usage.http")
        .events()
        .into_iter()
        .map(|e| String::from_utf8(e).unwrap())
        .collect();
    /// (path, events, marker the client waits for, expected outcome, completion tokens)
    type Case<'a> = (&'a str, &'a [String], &'a str, &'a str, Option<u64>);
    let cases: Vec<Case<'_>> = vec![
        (
            RESPONSES,
            &responses,
            "\"type\":\"response.completed\"}\n\n",
            "ok",
            Some(8),
        ),
        (
            MESSAGES,
            &messages,
            "{\"type\":\"message_stop\"}\n\n",
            "ok",
            Some(8),
        ),
        (CHAT, &chat, "data: [DONE]\n\n", "ok", Some(5)),
        (
            RESPONSES,
            &responses,
            "\"sequence_number\":5,",
            "client_aborted",
            None,
        ),
        (
            MESSAGES,
            &messages,
            "\"stop_reason\":\"max_tokens\"",
            "client_aborted",
            None,
        ),
    ];
    for (path, events, marker, outcome, tokens) in cases {
        let evs: Vec<(u64, &str)> = events.iter().map(|e| (2, e.as_str())).collect();
        // The upstream keeps the body open after the last event, as a slow close would.
        let up = FakeUpstream::start(vec![sse_script(&evs, Duration::from_secs(30))]).await;
        let proxy = TestProxy::start(&up.url(), |_| {}).await;
        let req = post(
            path,
            r#"{"model":"tiny-llama","stream":true,"stream_options":{"include_usage":true}}"#,
            &[],
        );
        let body = read_until_then_close(proxy.addr, &req, marker).await;
        let lines = proxy.log_lines(1).await;
        let l = &lines[0];
        assert_eq!(l["outcome"], outcome, "{path} {marker}: {l}");
        if outcome == "ok" {
            assert!(l["error"].is_null());
            assert_eq!(l["completion_tokens"], tokens.unwrap(), "{path}");
            assert_eq!(l["tokens_source"], "usage");
            assert!(
                l["e2e_ms"].as_f64().unwrap() < 5_000.0,
                "ended at the terminal event"
            );
            assert_eq!(l["bytes_out"], body.len(), "{path}");
        }
        proxy.stop().await;
    }
}

#[tokio::test]
async fn ttft_is_the_first_generated_output_and_each_excluded_event_is_excluded() {
    // Each event that is not output comes GAP after the one before, on the proxy's clock; the
    // first output GAP after the last of them. Had any excluded event counted, TTFT would be at
    // least GAP short.
    const GAP: u64 = 40;
    let responses = [
        r#"event: response.created
data: {"type":"response.created","response":{"status":"in_progress","usage":null}}

"#,
        "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"response\":{\"status\":\"in_progress\"}}\n\n",
        // A message item starts empty (a tool call's start is output: `agent_calls`).
        "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n",
        "event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\",\"part\":{\"type\":\"output_text\",\"text\":\"\"}}\n\n",
        ": keep-alive\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"\"}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a\"}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}}\n\n",
    ];
    let messages = [
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n",
        // A text block starts empty (a tool_use block's start is output: `agent_calls`).
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        ": keep-alive\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"p\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"ath\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":2}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ];
    let chat = [
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        ": keep-alive\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":null},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\",\"index\":0,\"function\":{\"name\":\"read_file\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":null,\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":null,\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3}}\n\n",
        "data: [DONE]\n\n",
    ];
    // (path, events, how many lead the first output)
    let cases: [(&str, &[&str], usize); 3] = [
        (RESPONSES, &responses, 6),
        (MESSAGES, &messages, 5),
        (CHAT, &chat, 3),
    ];
    for (path, events, excluded) in cases {
        // The test holds the proxy's clock: before each event after the first it advances the
        // clock by GAP, opens the upstream's gate for that event and reads it through the proxy,
        // so every event is read at a known instant and the figures are exact.
        let time = tokenmeter::clock::TimeSource::manual();
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let mut steps = vec![Step::Raw(
            Duration::ZERO,
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
        )];
        for e in events {
            steps.push(Step::Gate(gate.clone()));
            steps.push(Step::Chunk(Duration::ZERO, e.as_bytes().to_vec()));
        }
        steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
        let up = FakeUpstream::start(vec![Script { steps }]).await;
        let proxy = TestProxy::start_with_time(&up.url(), time.clone(), |_| {}).await;
        let mut c = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(&post(
            path,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}}"#,
            &[],
        ))
        .await
        .unwrap();
        let mut got = Vec::new();
        let mut from = 0;
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                time.advance(Duration::from_millis(GAP));
            }
            gate.add_permits(1);
            from = read_past(&mut c, &mut got, from, e.as_bytes()).await;
        }
        read_past(&mut c, &mut got, from, b"0\r\n\r\n").await;
        drop(c);
        let l = proxy.finish().await.remove(0);
        let gap = GAP as f64;
        assert_eq!(l["first_byte_ms"].as_f64(), Some(0.0), "{path}: {l}");
        assert_eq!(
            l["ttft_ms"].as_f64(),
            Some(excluded as f64 * gap),
            "{path}: {l}"
        );
        // Two more outputs, GAP apart: two ITL samples of GAP.
        assert_eq!(l["itl_mean_ms"].as_f64(), Some(gap), "{path}: {l}");
        assert_eq!(l["itl_max_ms"].as_f64(), Some(gap), "{path}: {l}");
        for k in ["itl_p50_ms", "itl_p99_ms"] {
            // Percentiles come from log bins: within a bin's width of the exact value.
            let v = l[k].as_f64().unwrap();
            assert!((v - gap).abs() <= 0.05 * gap, "{k}: {l}");
        }
        if path == CHAT {
            // `vllm bench serve` would have taken the role-only event.
            assert_eq!(l["bench_ttft_ms"].as_f64(), Some(0.0), "{l}");
        } else {
            assert!(l["bench_ttft_ms"].is_null());
        }
        assert_eq!(l["outcome"], "ok", "{l}");
    }
}

/// Reads from `c` until `got` holds `marker` at or after `from`; returns where it ends.
async fn read_past(
    c: &mut tokio::net::TcpStream,
    got: &mut Vec<u8>,
    from: usize,
    marker: &[u8],
) -> usize {
    let mut buf = [0u8; 4096];
    loop {
        if let Some(at) = find(&got[from..], marker) {
            return from + at + marker.len();
        }
        let k = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
            .await
            .expect("the proxy passed the event on")
            .unwrap();
        assert!(k > 0, "closed before {:?}", String::from_utf8_lossy(marker));
        got.extend_from_slice(&buf[..k]);
    }
}

#[tokio::test]
async fn an_error_event_inside_a_200_stream_is_an_upstream_error() {
    let evs = [
        (0, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":0}}}\n\n"),
        (2, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n"),
        (2, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"),
    ];
    let failed = [
        (0, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{}}\n\n"),
        (2, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"x\"}}}\n\n"),
    ];
    for (path, evs) in [(MESSAGES, &evs[..]), (RESPONSES, &failed[..])] {
        let up = FakeUpstream::start(vec![sse_script(evs, Duration::ZERO)]).await;
        let proxy = TestProxy::start(&up.url(), |_| {}).await;
        let got = raw_request(proxy.addr, &post(path, r#"{"stream":true}"#, &[])).await;
        assert_eq!(got.status, 200);
        let l = proxy.finish().await.remove(0);
        assert_eq!(l["outcome"], "upstream_error", "{path}: {l}");
    }
}

#[tokio::test]
async fn forced_usage_upstream_is_neither_asked_nor_stripped() {
    let fx = fixture("03_chat_stream_usage.http");
    let mut up = FakeUpstream::start(vec![fx.script(Duration::from_millis(1))]).await;
    let proxy = TestProxy::start(&up.url(), |c| c.upstream_force_include_usage = true).await;
    let req = r#"{"model":"tiny-llama","messages":[],"stream":true}"#;
    let got = raw_request(proxy.addr, &post(CHAT, req, &[])).await;
    assert_eq!(
        got.body, fx.body,
        "the usage event vLLM sends anyway reaches the client"
    );
    assert_eq!(up.seen.recv().await.unwrap().body, req.as_bytes());
    let l = proxy.finish().await.remove(0);
    assert_eq!(l["completion_tokens"], 5);
    assert_eq!(l["tokens_source"], "usage");
}

#[tokio::test]
async fn chat_cached_and_reasoning_tokens_are_logged() {
    let evs = [
        (0, "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"},\"finish_reason\":null}]}\n\n"),
        (1, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n\n"),
        (1, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":16},\"completion_tokens_details\":{\"reasoning_tokens\":1}}}\n\n"),
        (1, "data: [DONE]\n\n"),
    ];
    let up = FakeUpstream::start(vec![sse_script(&evs, Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let got = raw_request(proxy.addr, &post(CHAT, r#"{"stream":true}"#, &[])).await;
    assert!(
        !String::from_utf8_lossy(&got.body).contains("usage"),
        "stripped"
    );
    let l = proxy.finish().await.remove(0);
    assert_schema("record.schema.json", &l);
    assert_eq!(
        (
            &l["prompt_tokens"],
            &l["completion_tokens"],
            &l["cached_prompt_tokens"],
            &l["reasoning_tokens"],
            &l["api"]
        ),
        (&30.into(), &2.into(), &16.into(), &1.into(), &"chat".into())
    );
}

#[tokio::test]
async fn x_api_key_is_attributed_required_replaced_and_never_logged() {
    const CANARY: &str = "sk-ant-canary-41c9e07d";
    let fx = agents("m01_messages_nonstream.http");
    let mut up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |c| {
        c.users
            .api_keys
            .insert("ann".into(), tokenmeter::config::Secret(CANARY.into()));
        c.users.require_known_key = true;
        c.users.upstream_api_key = Some(tokenmeter::config::Secret("sk-upstream".into()));
    })
    .await;
    let wrong = format!("{CANARY}-wrong");
    let mut answers = String::new();
    for key in [wrong.as_str(), CANARY] {
        let got = raw_request(
            proxy.addr,
            &post(
                MESSAGES,
                r#"{"model":"tiny-llama","max_tokens":16}"#,
                &[("x-api-key", key), ("anthropic-version", "2023-06-01")],
            ),
        )
        .await;
        answers.push_str(&got.head);
        answers.push_str(&String::from_utf8_lossy(&got.body));
        assert_eq!(got.status, if key == CANARY { 200 } else { 401 });
    }
    let seen = up.seen.recv().await.unwrap();
    assert_eq!(seen.header("x-api-key").as_deref(), Some("sk-upstream"));
    assert_eq!(
        seen.header("authorization").as_deref(),
        Some("Bearer sk-upstream")
    );
    assert!(!seen.head.contains("canary"), "the client's key stays here");
    let stats = raw_request(
        proxy.addr,
        b"GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    answers.push_str(&String::from_utf8_lossy(&stats.body));
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["status"], 401);
    assert_eq!(lines[1]["user"], "ann");
    assert_eq!(lines[1]["user_source"], "key_map");
    assert_eq!(lines[1]["completion_tokens"], 16);
    let all = serde_json::to_string(&lines).unwrap() + &answers;
    assert_eq!(all.matches("canary").count(), 0, "{all}");

    // Without a key map, an x-api-key gets the same pseudonym a bearer key would.
    let up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    for h in [
        ("x-api-key", CANARY.to_string()),
        ("authorization", format!("Bearer {CANARY}")),
    ] {
        raw_request(proxy.addr, &post(MESSAGES, "{}", &[(h.0, h.1.as_str())])).await;
    }
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["user_source"], "key_hash");
    assert_eq!(lines[0]["user"], lines[1]["user"]);
    assert_eq!(
        serde_json::to_string(&lines)
            .unwrap()
            .matches("canary")
            .count(),
        0
    );
}

#[tokio::test]
async fn responses_and_messages_reach_stats_users_and_metrics() {
    let up = FakeUpstream::start(vec![
        agents("r02_responses_stream.http").script(Duration::from_millis(2)),
        agents("m02_messages_stream.http").script(Duration::from_millis(2)),
        agents("m01_messages_nonstream.http").script(Duration::ZERO),
    ])
    .await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    for (path, user, stream) in [
        (RESPONSES, "codex", true),
        (MESSAGES, "claude", true),
        (MESSAGES, "claude", false),
    ] {
        let body = format!(r#"{{"model":"tiny-llama","stream":{stream}}}"#);
        let r = raw_request(
            proxy.addr,
            &post(path, &body, &[("x-tokenmeter-user", user)]),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let v = raw_request(
        proxy.addr,
        b"GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await
    .json();
    assert_schema("stats.schema.json", &v);
    assert_eq!(v["totals"]["requests"], 3);
    assert_eq!(v["totals"]["completion_tokens"], 8 + 8 + 16);
    assert_eq!(v["totals"]["prompt_tokens"], 12 + 12 + 12);
    assert_eq!(v["users"]["codex"]["totals"]["completion_tokens"], 8);
    assert_eq!(v["users"]["claude"]["totals"]["requests"], 2);
    let metrics = raw_request(
        proxy.addr,
        b"GET /stats/metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8(metrics.body).unwrap();
    for needle in [
        "tokenmeter_completion_tokens_total{model=\"tiny-llama\",api=\"responses\"} 8\n",
        "tokenmeter_completion_tokens_total{model=\"tiny-llama\",api=\"messages\"} 24\n",
        // One gap in the Responses stream (2 deltas), seven in the Messages stream (8 deltas).
        "tokenmeter_inter_token_latency_seconds_count{model=\"tiny-llama\"} 8\n",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in {text}");
    }
    proxy.stop().await;
}
