//! Faults a trusted proxy must survive, each proven over real sockets.

use std::time::{Duration, Instant};

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";
const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n";

fn content_event(i: usize) -> Vec<u8> {
    format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n")
        .into_bytes()
}

#[tokio::test]
async fn upstream_reset_mid_stream_is_visible_as_truncation() {
    let mut steps = vec![Step::Raw(Duration::ZERO, SSE_HEAD.as_bytes().to_vec())];
    for i in 0..3 {
        steps.push(Step::Chunk(Duration::from_millis(5), content_event(i)));
    }
    steps.push(Step::Reset(Duration::from_millis(5)));
    let up = FakeUpstream::start(vec![Script { steps }]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let got = raw_request(proxy.addr, &post(CHAT, r#"{"stream":true}"#, &[])).await;
    assert_eq!(got.status, 200);
    assert!(!got.complete, "the chunked body must not end cleanly");
    assert!(String::from_utf8_lossy(&got.body).contains("t2"));
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["outcome"], "upstream_aborted");
    assert_eq!(lines[0]["completion_tokens"], 3);
}

#[tokio::test]
async fn refused_upstream_is_a_fast_502_without_retries() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let proxy = TestProxy::start(&format!("http://127.0.0.1:{port}"), |_| {}).await;
    // Warm the path once, then time, interleaved with requests the proxy answers itself (its
    // readiness probe) on the same kind of fresh connection: the refusal may cost no more than
    // 10 ms over that baseline. Any retry with a backoff breaks it; a loaded machine slows both
    // alike, and the medians ignore a single descheduled request.
    raw_request(proxy.addr, &post(CHAT, "{}", &[])).await;
    let probe = b"GET /stats/readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let mut took = Vec::new();
    let mut local = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let got = raw_request(proxy.addr, &post(CHAT, "{}", &[])).await;
        took.push(t.elapsed());
        assert_eq!(got.status, 502);
        let t = Instant::now();
        raw_request(proxy.addr, probe).await;
        local.push(t.elapsed());
    }
    took.sort();
    local.sort();
    assert!(
        took[10] < local[10] + Duration::from_millis(10),
        "median 502 took {:?}, median local answer {:?} ({took:?})",
        took[10],
        local[10]
    );
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 21, "one record per request, no retry records");
}

#[tokio::test]
async fn upstream_that_never_answers_gets_a_504() {
    let mut up = FakeUpstream::start(vec![Script {
        steps: vec![Step::Stall(Duration::from_secs(30))],
    }])
    .await;
    let proxy = TestProxy::start(&up.url(), |c| c.timeouts.upstream_headers_ms = 200).await;
    let t = Instant::now();
    let got = raw_request(proxy.addr, &post(CHAT, "{}", &[])).await;
    let took = t.elapsed();
    assert_eq!(got.status, 504);
    assert_eq!(got.json()["error"]["code"], 504);
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(1000),
        "{took:?}"
    );
    let closed = tokio::time::timeout(Duration::from_secs(2), up.closed.recv())
        .await
        .expect("upstream connection dropped");
    assert!(closed.is_some());
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["outcome"], "timeout");
}

#[tokio::test]
async fn upstream_stalling_after_headers_or_between_events_is_cut() {
    for first in [true, false] {
        let mut steps = vec![Step::Raw(Duration::ZERO, SSE_HEAD.as_bytes().to_vec())];
        if !first {
            steps.push(Step::Chunk(Duration::ZERO, content_event(0)));
        }
        steps.push(Step::Stall(Duration::from_secs(30)));
        let mut up = FakeUpstream::start(vec![Script { steps }]).await;
        let proxy = TestProxy::start(&up.url(), |c| c.timeouts.body_idle_ms = 200).await;
        let t = Instant::now();
        let got = raw_request(proxy.addr, &post(CHAT, r#"{"stream":true}"#, &[])).await;
        let took = t.elapsed();
        assert_eq!(got.status, 200);
        assert!(!got.complete, "cut, not ended cleanly");
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_millis(1000),
            "{took:?}"
        );
        assert!(
            tokio::time::timeout(Duration::from_secs(2), up.closed.recv())
                .await
                .is_ok(),
            "upstream dropped"
        );
        let lines = proxy.finish().await;
        assert_eq!(lines[0]["outcome"], "timeout");
    }
}

#[tokio::test]
async fn slowloris_headers_are_dropped_at_the_head_read_timeout() {
    let up = FakeUpstream::start(vec![Script::default()]).await;
    let proxy = TestProxy::start(&up.url(), |c| c.timeouts.head_read_ms = 200).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    let t = Instant::now();
    c.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    // Trickle a header byte every 50 ms; the proxy must close the connection anyway.
    let closed_at = loop {
        tokio::select! {
            // Either an answer or the close: the proxy has given up on this head.
            _ = c.read(&mut buf) => break t.elapsed(),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                if c.write_all(b"x").await.is_err() { break t.elapsed(); }
                assert!(t.elapsed() < Duration::from_secs(3), "never dropped");
            }
        }
    };
    assert!(
        closed_at >= Duration::from_millis(150) && closed_at < Duration::from_millis(1500),
        "{closed_at:?}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn slow_body_sender_gets_408() {
    let mut up = FakeUpstream::start(vec![Script::default()]).await;
    let proxy = TestProxy::start(&up.url(), |c| c.timeouts.request_body_ms = 200).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(
        format!("POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{{\"a\":")
            .as_bytes(),
    )
    .await
    .unwrap();
    let t = Instant::now();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut raw)).await;
    let got = parse_response(&raw);
    assert_eq!(got.status, 408);
    assert!(t.elapsed() < Duration::from_millis(1000));
    assert!(up.seen.try_recv().is_err());
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["outcome"], "client_error");
    assert_eq!(lines[0]["status"], 408);
}

#[tokio::test]
async fn malformed_http_is_rejected_before_the_upstream() {
    let mut up = FakeUpstream::start(vec![
        fixture("01_chat_nonstream.http").script(Duration::ZERO)
    ])
    .await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let cases: [(&str, &[u8]); 5] = [
        ("two CLs", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}x"),
        ("CL +3", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: +3\r\n\r\n{}x"),
        ("space before colon", b"POST /v1/chat/completions HTTP/1.1\r\nhost : x\r\ncontent-length: 2\r\n\r\n{}"),
        ("TE chunked, identity", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked, identity\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
        ("chunk-size overflow", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffffffff\r\n{}\r\n0\r\n\r\n"),
    ];
    for (name, req) in cases {
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(req).await.unwrap();
        let mut raw = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut raw)).await;
        assert!(read.is_ok(), "{name}: the connection must be closed");
        let got = parse_response(&raw);
        assert_eq!(got.status, 400, "{name}: {}", String::from_utf8_lossy(&raw));
    }
    assert!(
        up.seen.try_recv().is_err(),
        "a malformed request reached the upstream"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_rejected_and_the_connection_closed() {
    // RFC 9112 §6.1 lets a server reject this; nginx and HAProxy do, and so does the proxy: 400,
    // the connection closed, nothing upstream. The head sniffer finds the pair that the HTTP
    // layer hides, at the right request on a pipelined connection.
    let mut up = FakeUpstream::start(vec![
        fixture("01_chat_nonstream.http").script(Duration::ZERO)
    ])
    .await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let smuggle: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 40\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n";
    let good: &[u8] =
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}";
    for (name, prefix, answers) in [("alone", &b""[..], 1), ("after a good request", good, 2)] {
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(&[prefix, smuggle].concat()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut raw))
            .await
            .expect("connection closed after the answer")
            .unwrap();
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(text.matches("HTTP/1.1 ").count(), answers, "{name}: {text}");
        let last = &raw[text.rfind("HTTP/1.1 ").unwrap()..];
        let got = parse_response(last);
        assert_eq!(got.status, 400, "{name}: {text}");
        assert!(
            got.head.to_ascii_lowercase().contains("connection: close"),
            "{name}"
        );
        let body = got.json();
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Transfer-Encoding"));
        if answers == 2 {
            assert_eq!(
                parse_response(&raw).status,
                200,
                "{name}: the good one is served"
            );
            assert_eq!(up.seen.recv().await.unwrap().body, b"{}");
        }
    }
    assert!(
        up.seen.try_recv().is_err(),
        "neither the ambiguous request nor the smuggled one reached the upstream"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn bad_request_bodies_are_forwarded_unchanged_and_measured_as_unknown() {
    let bodies: Vec<Vec<u8>> = vec![
        vec![0xff, 0xfe, b'{', 0x80],
        format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes(),
        br#"{"model":"m","max_tokens":1e999999,"n":123456789012345678901234567890}"#.to_vec(),
        br#"{"stream":"yes","stream_options":[1],"messages":{"a":1},"user":42}"#.to_vec(),
    ];
    let fx = fixture("e01_invalid_json.http");
    let mut up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    for b in &bodies {
        let mut req = format!("POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", b.len()).into_bytes();
        req.extend_from_slice(b);
        let got = raw_request(proxy.addr, &req).await;
        assert_eq!(got.status, 400);
        assert_eq!(got.body, fx.body);
        assert_eq!(
            &up.seen.recv().await.unwrap().body,
            b,
            "forwarded byte for byte"
        );
    }
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 4);
    for l in &lines {
        assert_schema("record.schema.json", l);
        assert!(l["model"].is_null() || l["model"] == "m");
        assert!(l["stream"].is_null() || l["stream"] == false);
        assert_eq!(l["outcome"], "client_error", "vLLM's 400 for bad JSON");
    }
}

#[tokio::test]
async fn an_unwritable_access_log_counts_failures_and_serving_goes_on() {
    let fx = fixture("01_chat_nonstream.http");
    let up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |c| c.access_log = Some("/dev/full".into())).await;
    for _ in 0..50 {
        assert_eq!(
            raw_request(proxy.addr, &post(CHAT, "{}", &[])).await.status,
            200
        );
    }
    let counters = proxy.handle.as_ref().unwrap().access_log_counters();
    proxy.stop().await;
    let (written, dropped, failed) = counters.get();
    assert_eq!(written, 0);
    assert_eq!(
        dropped + failed,
        50,
        "every lost record is counted: dropped {dropped}, failed {failed}"
    );
}
