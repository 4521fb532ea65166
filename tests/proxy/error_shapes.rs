//! The proxy's own errors in the shape of the API the path belongs to, over real sockets: on
//! Anthropic's `/v1/messages` the envelope vLLM 0.32 answers its own Messages errors in
//! (`{"type":"error","error":{"type","message"}}`, recorded in
//! `agents/m07_messages_unknown_model.http` and `agents/m08_messages_stream_too_long.http`), on
//! the OpenAI paths vLLM's OpenAI shape (`e02_unknown_model.http`): member for member, so a client
//! cannot tell the proxy's error from vLLM's. Each of the proxy's own answers is checked: 400, 401,
//! 408, 413, 431, 502, 504.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

const MESSAGES: &str = "/v1/messages";
const CHAT: &str = "/v1/chat/completions";

/// A JSON value's layout: every leaf replaced by its type's name, member order kept.
fn layout(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), layout(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(layout).collect()),
        Value::String(_) => "string".into(),
        Value::Number(_) => "number".into(),
        Value::Bool(_) => "bool".into(),
        Value::Null => "null".into(),
    }
}

fn recorded_body(name: &str) -> Value {
    serde_json::from_slice(&fixture(name).body).unwrap()
}

/// `got` is the proxy's error `status` with vLLM's `kind`, laid out as vLLM lays out the path's
/// errors (`param` may be null or a string in OpenAI's shape).
fn assert_shaped(path: &str, got: &Received, status: u16, kind: &str) {
    assert_eq!(got.status, status, "{path}: {}", got.head);
    assert_eq!(
        got.header("content-type").as_deref(),
        Some("application/json"),
        "{}",
        got.head
    );
    let v = got.json();
    if path == MESSAGES {
        for recorded in [
            "agents/m07_messages_unknown_model.http",
            "agents/m08_messages_stream_too_long.http",
        ] {
            assert_eq!(
                layout(&v),
                layout(&recorded_body(recorded)),
                "{path} {status}: {v}"
            );
        }
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{v}");
    } else {
        let mut recorded = layout(&recorded_body("e02_unknown_model.http"));
        recorded["error"]["param"] = "null".into();
        assert_eq!(layout(&v), recorded, "{path} {status}: {v}");
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert_eq!(v["error"]["code"], status, "{v}");
    }
}

#[tokio::test]
async fn the_proxys_own_client_errors_are_in_the_shape_of_the_paths_api() {
    let mut up = FakeUpstream::start(vec![Script::default()]).await;
    let proxy = TestProxy::start(&up.url(), |c| {
        c.max_request_body_bytes = 1000;
        c.timeouts.request_body_ms = 200;
        c.users.require_known_key = true;
        c.users
            .api_keys
            .insert("ann".into(), tokenmeter::config::Secret("sk-ann".into()));
    })
    .await;
    let key = [("x-api-key", "sk-ann")];
    for path in [MESSAGES, CHAT] {
        // 400: a length and a chunked framing together.
        let ambiguous = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nx-api-key: sk-ann\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
        );
        let got = raw_request(proxy.addr, ambiguous.as_bytes()).await;
        assert_shaped(path, &got, 400, "BadRequestError");
        // 401: no key where one is required.
        let got = raw_request(proxy.addr, &post(path, "{}", &[])).await;
        assert_shaped(path, &got, 401, "AuthenticationError");
        // 413: a body over max_request_body_bytes.
        let big = format!("{{\"x\":\"{}\"}}", "a".repeat(2000));
        let got = raw_request(proxy.addr, &post(path, &big, &key)).await;
        assert_shaped(path, &got, 413, "RequestTooLargeError");
        // 431: a head over max_header_bytes (hyper refuses it; the proxy's answer replaces its own).
        let huge = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nx-big: {}\r\ncontent-length: 2\r\n\r\n{{}}",
            "h".repeat(70 * 1024)
        );
        let got = raw_request(proxy.addr, huge.as_bytes()).await;
        assert_shaped(path, &got, 431, "RequestHeaderFieldsTooLargeError");
        // 408: a body that does not arrive in time.
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        c.write_all(
            format!("POST {path} HTTP/1.1\r\nhost: x\r\nx-api-key: sk-ann\r\ncontent-length: 100\r\n\r\n{{\"a\":")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut raw = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut raw)).await;
        assert_shaped(path, &parse_response(&raw), 408, "RequestTimeoutError");
    }
    assert!(up.seen.try_recv().is_err(), "nothing reached the upstream");
    let lines = proxy.finish().await;
    // Every refusal has its record, the ambiguous framing's too (answered unread, with the
    // connection closed: nothing after it on the connection can be trusted).
    let mut statuses: Vec<u64> = lines
        .iter()
        .map(|l| l["status"].as_u64().unwrap())
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [400, 400, 401, 401, 408, 408, 413, 413, 431, 431]);
    for l in &lines {
        assert_eq!(l["outcome"], "client_error", "{l}");
    }
}

#[tokio::test]
async fn the_proxys_own_upstream_errors_are_in_the_shape_of_the_paths_api() {
    // 504: an upstream that never sends its headers.
    let stalled = FakeUpstream::start(vec![Script {
        steps: vec![Step::Stall(Duration::from_secs(60))],
    }])
    .await;
    let proxy = TestProxy::start(&stalled.url(), |c| c.timeouts.upstream_headers_ms = 200).await;
    let body = r#"{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#;
    for path in [MESSAGES, CHAT] {
        let got = raw_request(proxy.addr, &post(path, body, &[])).await;
        assert_shaped(path, &got, 504, "GatewayTimeoutError");
    }
    proxy.stop().await;
    // 502: an upstream that refuses connections.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let proxy = TestProxy::start(&down, |_| {}).await;
    for path in [MESSAGES, "/v1/messages/count_tokens", CHAT, "/v1/models"] {
        let got = raw_request(proxy.addr, &post(path, body, &[])).await;
        let shape_of = if path.starts_with(MESSAGES) {
            MESSAGES
        } else {
            CHAT
        };
        assert_shaped(shape_of, &got, 502, "BadGatewayError");
    }
    proxy.stop().await;
}
