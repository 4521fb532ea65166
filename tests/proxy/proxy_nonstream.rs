//! `ttft_for_non_streamed` over real sockets: a scripted upstream replays each recorded vLLM
//! stream; the client, which asked non-streamed, must receive the recorded non-streamed JSON
//! (ids and times aside) with vLLM's non-streamed headers, and its log line must carry a TTFT
//! measured on the stream. What the rule refuses passes through untouched.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::fold_support::{expected_body, pair, FORCED_TOOL, PAIRS};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const ANTHROPIC: &[(&str, &str)] = &[
    ("anthropic-version", "2023-06-01"),
    ("x-api-key", "sk-ant-dummy"),
];

fn all_on(c: &mut tokenmeter::config::ServeConfig) {
    c.ttft_for_non_streamed = tokenmeter::config::UpgradeConfig {
        chat: true,
        completions: true,
        messages: true,
        responses: true,
    };
}

fn headers_for(path: &str) -> &'static [(&'static str, &'static str)] {
    if path == "/v1/messages" {
        ANTHROPIC
    } else {
        &[]
    }
}

#[tokio::test]
async fn every_recorded_pair_reaches_the_client_as_vllm_answers_it_non_streamed() {
    for (name, path, request) in PAIRS {
        let (stream, nonstream) = pair(name);
        let tool = FORCED_TOOL.contains(name);
        // A refused request goes upstream unchanged, so vLLM answers it non-streamed.
        let script = if tool {
            nonstream.script(Duration::from_millis(5))
        } else {
            stream.script(Duration::from_millis(2))
        };
        let mut up = FakeUpstream::start(vec![script]).await;
        let proxy = TestProxy::start(&up.url(), all_on).await;
        let r = raw_request(proxy.addr, &post(path, request, headers_for(path))).await;
        let seen = up.seen.recv().await.unwrap();
        let sent: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
        let recorded = String::from_utf8(nonstream.body.clone()).unwrap();
        let body = String::from_utf8(r.body.clone()).unwrap();
        assert_eq!(r.status, 200, "{name}: {body}");
        assert!(r.complete, "{name}");
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/json"),
            "{name}"
        );
        assert_eq!(
            r.header("content-length"),
            Some(r.body.len().to_string()),
            "{name}"
        );
        assert!(r.header("transfer-encoding").is_none(), "{name}");
        let line = &proxy.finish().await[0];
        assert_schema("record.schema.json", line);
        assert_eq!(line["stream"], false, "{name}");
        assert_eq!(line["outcome"], "ok", "{name}");
        if tool {
            assert_eq!(
                seen.body,
                request.as_bytes(),
                "{name}: passed through as sent"
            );
            assert_eq!(body, recorded, "{name}: vLLM's own answer");
            assert!(line["ttft_ms"].is_null(), "{name}");
            assert!(line["ttft_source"].is_null(), "{name}");
            assert_eq!(line["ttft_fallback"], "request has tools", "{name}");
            continue;
        }
        assert_eq!(sent["stream"], true, "{name}");
        assert_eq!(body, expected_body(&recorded, &body), "{name}");
        let ttft = line["ttft_ms"]
            .as_f64()
            .unwrap_or_else(|| panic!("{name}: {line}"));
        let e2e = line["e2e_ms"].as_f64().unwrap();
        assert!(0.0 < ttft && ttft < e2e, "{name}: ttft {ttft} e2e {e2e}");
        assert_eq!(line["ttft_source"], "upstream_stream", "{name}");
        assert!(line["ttft_fallback"].is_null(), "{name}");
        assert_eq!(line["tokens_source"], "usage", "{name}");
        assert!(line["completion_tokens"].as_u64().unwrap() > 0, "{name}");
        assert_eq!(line["bytes_out"], r.body.len() as u64, "{name}");
    }
}

#[tokio::test]
async fn off_by_default_and_streamed_requests_are_untouched() {
    let (_, nonstream) = pair("p01_chat");
    let mut up = FakeUpstream::start(vec![nonstream.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let req = PAIRS[0].2;
    let r = raw_request(proxy.addr, &post(PAIRS[0].1, req, &[])).await;
    assert_eq!(up.seen.recv().await.unwrap().body, req.as_bytes());
    assert_eq!(r.body, nonstream.body);
    let line = &proxy.finish().await[0];
    assert!(line["ttft_ms"].is_null() && line["ttft_fallback"].is_null());

    let (stream, _) = pair("p01_chat");
    let mut up = FakeUpstream::start(vec![stream.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), all_on).await;
    let streamed = r#"{"model":"tiny-llama","messages":[],"stream":true,"stream_options":{"include_usage":true}}"#;
    let r = raw_request(proxy.addr, &post("/v1/chat/completions", streamed, &[])).await;
    assert_eq!(up.seen.recv().await.unwrap().body, streamed.as_bytes());
    assert_eq!(r.body, stream.body);
    assert_eq!(proxy.finish().await[0]["ttft_source"], "stream");
}

#[tokio::test]
async fn vllm_errors_before_the_stream_pass_through_unchanged() {
    let err = fixture("e13_stream_max_tokens_too_big.http");
    let mut up = FakeUpstream::start(vec![err.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), all_on).await;
    let r = raw_request(
        proxy.addr,
        &post(
            "/v1/chat/completions",
            r#"{"messages":[],"max_tokens":100000}"#,
            &[],
        ),
    )
    .await;
    let seen = up.seen.recv().await.unwrap();
    assert!(find(&seen.body, br#""stream":true"#).is_some());
    assert_eq!((r.status, &r.body), (400, &err.body));
    let line = &proxy.finish().await[0];
    assert_eq!(line["outcome"], "client_error");
    assert!(line["ttft_source"].is_null());
}

fn sse(events: &[&str]) -> Script {
    let mut steps = vec![Step::Raw(
        Duration::ZERO,
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(),
    )];
    for e in events {
        steps.push(Step::Chunk(
            Duration::from_millis(1),
            format!("data: {e}\n\n").into_bytes(),
        ));
    }
    steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
    Script { steps }
}

const ROLE: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;

#[tokio::test]
async fn an_error_event_in_the_stream_becomes_vllms_non_streamed_error() {
    let err = r#"{"error": {"message": "engine dead", "type": "InternalServerError", "param": null, "code": 500}}"#;
    let up = FakeUpstream::start(vec![sse(&[ROLE, err, "[DONE]"])]).await;
    let proxy = TestProxy::start(&up.url(), all_on).await;
    let r = raw_request(
        proxy.addr,
        &post("/v1/chat/completions", r#"{"messages":[]}"#, &[]),
    )
    .await;
    assert_eq!(r.status, 500);
    assert_eq!(
        r.header("content-type").as_deref(),
        Some("application/json")
    );
    assert_eq!(
        String::from_utf8(r.body).unwrap(),
        r#"{"error":{"message":"engine dead","type":"InternalServerError","param":null,"code":500}}"#
    );
    let line = &proxy.finish().await[0];
    assert_eq!(
        (line["status"].as_u64(), &line["outcome"]),
        (Some(500), &serde_json::json!("upstream_error"))
    );
}

#[tokio::test]
async fn a_stream_the_fold_cannot_prove_is_dropped_and_the_request_sent_again_as_written() {
    let reasoning = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"reasoning":"hm"},"logprobs":null,"finish_reason":null}]}"#;
    let mut stalled = sse(&[ROLE, reasoning]);
    stalled
        .steps
        .insert(3, Step::Stall(Duration::from_secs(30)));
    let (_, nonstream) = pair("p01_chat");
    let mut up = FakeUpstream::start(vec![stalled, nonstream.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), all_on).await;
    let req = PAIRS[0].2;
    let t = Instant::now();
    let r = raw_request(proxy.addr, &post("/v1/chat/completions", req, &[])).await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "the stalled stream was dropped at once"
    );
    let first = up.seen.recv().await.unwrap();
    assert!(find(&first.body, br#""stream":true"#).is_some());
    let closed = tokio::time::timeout(Duration::from_secs(2), up.closed.recv()).await;
    assert!(
        closed.is_ok(),
        "the abandoned stream's connection was closed"
    );
    assert_eq!(up.seen.recv().await.unwrap().body, req.as_bytes());
    assert_eq!((r.status, &r.body), (200, &nonstream.body));
    let line = &proxy.finish().await[0];
    assert_eq!(line["ttft_fallback"], "stream carries reasoning");
    assert!(line["ttft_ms"].is_null() && line["ttft_source"].is_null());
    assert_eq!(line["outcome"], "ok");
    assert_eq!(line["completion_tokens"], 16);
}

#[tokio::test]
async fn an_answer_over_max_response_scan_bytes_is_delivered_whole_by_vllm_and_marked() {
    let (stream, nonstream) = pair("p02_chat_ignore_eos_seed");
    let mut up = FakeUpstream::start(vec![
        stream.script(Duration::ZERO),
        nonstream.script(Duration::ZERO),
    ])
    .await;
    let proxy = TestProxy::start(&up.url(), |c| {
        all_on(c);
        c.max_response_scan_bytes = 20;
    })
    .await;
    let req = PAIRS[1].2;
    let r = raw_request(proxy.addr, &post("/v1/chat/completions", req, &[])).await;
    up.seen.recv().await.unwrap();
    assert_eq!(up.seen.recv().await.unwrap().body, req.as_bytes());
    assert_eq!(r.body, nonstream.body);
    let line = &proxy.finish().await[0];
    assert_eq!(line["ttft_fallback"], "answer over max_response_scan_bytes");
}

#[tokio::test]
async fn a_client_that_leaves_while_the_stream_is_folded_aborts_the_upstream_at_once() {
    let mut slow = sse(&[ROLE]);
    slow.steps.insert(2, Step::Stall(Duration::from_secs(30)));
    let mut up = FakeUpstream::start(vec![slow]).await;
    let proxy = TestProxy::start(&up.url(), all_on).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(&post("/v1/chat/completions", r#"{"messages":[]}"#, &[]))
        .await
        .unwrap();
    up.seen.recv().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let left = Instant::now();
    drop(c);
    let closed = tokio::time::timeout(Duration::from_secs(2), up.closed.recv())
        .await
        .expect("upstream closed")
        .unwrap();
    let delay = closed.saturating_duration_since(left);
    assert!(
        delay < Duration::from_millis(50),
        "upstream closed {delay:?} after the client left"
    );
    let line = &proxy.finish().await[0];
    assert_eq!(line["outcome"], "client_aborted");
    assert_eq!(line["stream"], false);
}

async fn sim() -> tokenmeter::sim::SimHandle {
    let cfg = tokenmeter::sim::SimConfig {
        stop_probability_per_token: 0.0,
        log_stats_interval_s: 0.0,
        ..Default::default()
    };
    crate::common::start_sim(cfg).await
}

#[tokio::test]
async fn the_simulators_streams_fold_into_its_own_non_streamed_answers() {
    let sim = sim().await;
    let direct = format!("{}", sim.addr());
    let proxy = TestProxy::start(&format!("http://{direct}"), all_on).await;
    let reqs = [
        (
            "/v1/chat/completions",
            r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":20,"seed":4}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"n":3}"#,
        ),
        (
            "/v1/completions",
            r#"{"model":"sim-model","prompt":"hi","max_tokens":20}"#,
        ),
    ];
    for (path, req) in reqs {
        let own = raw_request(sim.addr(), &post(path, req, &[])).await;
        let r = raw_request(proxy.addr, &post(path, req, &[])).await;
        let (own, got) = (
            String::from_utf8(own.body).unwrap(),
            String::from_utf8(r.body).unwrap(),
        );
        assert_eq!(got, expected_body(&own, &got), "{path} {req}");
    }
    let lines = proxy.finish().await;
    for l in &lines {
        assert_eq!(l["ttft_source"], "upstream_stream", "{l}");
    }
}
