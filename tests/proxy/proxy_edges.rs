//! Aborts, limits, hop-by-hop headers, user identification and secrets, over real sockets.

use std::time::{Duration, Instant};

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";
const STREAM_REQ: &str = r#"{"model":"tiny-llama","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}"#;

/// Closes the client side (FIN, or RST with `rst`) and asserts the proxy closes its upstream
/// connection, so vLLM aborts the request. The callers' upstreams have nothing to send for the
/// next 30 s, so the proxy cannot learn of the client leaving from a failed write: it must watch
/// the client connection itself. The bound is that structure, not a wall-clock window (usually
/// well under a millisecond; printed), so a loaded machine cannot fail it and a proxy that
/// waits for the next write always does.
async fn leave_and_expect_upstream_closed(c: TcpStream, rst: bool, up: &mut FakeUpstream) {
    let left = Instant::now();
    if rst {
        reset(c);
    } else {
        drop(c);
    }
    let closed = tokio::time::timeout(UPSTREAM_SILENT / 3, up.closed.recv())
        .await
        .unwrap_or_else(|_| panic!("rst={rst}: upstream still open while it had nothing to send"))
        .unwrap();
    let delay = closed.saturating_duration_since(left);
    eprintln!("rst={rst}: upstream closed {delay:?} after the client left");
}

/// How long the upstreams of the abort tests stay silent.
const UPSTREAM_SILENT: Duration = Duration::from_secs(30);

fn slow_stream(first_gap: Duration, gap: Duration, events: usize) -> Script {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n";
    let mut steps = vec![Step::Raw(Duration::ZERO, head.as_bytes().to_vec())];
    steps.push(Step::Chunk(
        first_gap,
        br#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}

"#
        .to_vec(),
    ));
    for i in 0..events {
        let ev = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"
        );
        steps.push(Step::Chunk(
            if i == 0 { Duration::ZERO } else { gap },
            ev.into_bytes(),
        ));
    }
    steps.push(Step::Chunk(gap, b"data: [DONE]\n\n".to_vec()));
    steps.push(Step::Raw(Duration::ZERO, b"0\r\n\r\n".to_vec()));
    Script { steps }
}

#[tokio::test]
async fn client_abort_before_first_byte_closes_upstream_promptly() {
    abort_before_first_byte(false).await;
    abort_before_first_byte(true).await;
}

async fn abort_before_first_byte(rst: bool) {
    // Upstream sends headers only after 30 s (a long prefill or queue): the client leaves at once.
    let script = Script {
        steps: vec![
            Step::Stall(UPSTREAM_SILENT),
            Step::Raw(
                Duration::ZERO,
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
            ),
        ],
    };
    let mut up = FakeUpstream::start(vec![script]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(&post(CHAT, STREAM_REQ, &[])).await.unwrap();
    up.seen.recv().await.unwrap();
    leave_and_expect_upstream_closed(c, rst, &mut up).await;
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["outcome"], "client_aborted");
    assert!(lines[0]["status"].is_null());
    assert!(lines[0]["ttft_ms"].is_null());
}

#[tokio::test]
async fn client_abort_mid_stream_closes_upstream_and_keeps_tokens_seen() {
    abort_mid_stream(false).await;
    abort_mid_stream(true).await;
}

async fn abort_mid_stream(rst: bool) {
    // Three content events, then 30 s of silence (a slow step) before the rest.
    let mut script = slow_stream(Duration::from_millis(10), Duration::from_millis(10), 3);
    let end = script.steps.len() - 2;
    script.steps.insert(end, Step::Stall(UPSTREAM_SILENT));
    let mut up = FakeUpstream::start(vec![script]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(&post(CHAT, STREAM_REQ, &[])).await.unwrap();
    // Read until three content events arrived.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got
        .windows(4)
        .filter(|w| w == b"\"t2\"" || w == b"t2\"}")
        .count()
        == 0
    {
        let n = c.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    leave_and_expect_upstream_closed(c, rst, &mut up).await;
    let lines = proxy.finish().await;
    let l = &lines[0];
    assert_schema("record.schema.json", l);
    assert_eq!(l["outcome"], "client_aborted");
    assert_eq!(l["status"], 200);
    assert_eq!(
        l["completion_tokens"], 3,
        "the tokens that passed before the client left"
    );
    assert_eq!(l["tokens_source"], "counted");
    assert!(l["ttft_ms"].as_f64().is_some());
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_both_ways() {
    let body = "{}";
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: keep-alive, x-up-hop\r\nkeep-alive: timeout=5\r\nx-up-hop: 1\r\nproxy-authenticate: Basic\r\nx-up-end: kept\r\n\r\n{body}",
        body.len()
    );
    let mut up = FakeUpstream::start(vec![Script {
        steps: vec![Step::Raw(Duration::ZERO, resp.into_bytes())],
    }])
    .await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let req = format!(
        "POST /v1/models HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close, x-down-hop\r\nx-down-hop: 1\r\nkeep-alive: 300\r\nte: trailers\r\nupgrade: h2c\r\nproxy-authorization: Basic abc\r\nproxy-connection: keep-alive\r\nx-down-end: kept\r\n\r\n{body}"
    );
    let got = raw_request(proxy.addr, req.as_bytes()).await;
    let seen = up.seen.recv().await.unwrap();
    for h in [
        "x-down-hop",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
    ] {
        assert!(
            seen.header(h).is_none(),
            "{h} reached upstream: {}",
            seen.head
        );
    }
    assert_eq!(seen.header("x-down-end").as_deref(), Some("kept"));
    assert_eq!(
        seen.header("host").as_deref(),
        Some(up.addr.to_string().as_str())
    );
    for h in ["x-up-hop", "keep-alive", "proxy-authenticate"] {
        assert!(got.header(h).is_none(), "{h} reached client: {}", got.head);
    }
    assert_eq!(got.header("x-up-end").as_deref(), Some("kept"));
    proxy.stop().await;
}

#[tokio::test]
async fn oversized_body_is_413_and_oversized_head_is_431_without_reaching_upstream() {
    let mut up = FakeUpstream::start(vec![
        fixture("01_chat_nonstream.http").script(Duration::ZERO)
    ])
    .await;
    let proxy = TestProxy::start(&up.url(), |c| c.max_request_body_bytes = 1000).await;
    let big = format!("{{\"x\":\"{}\"}}", "a".repeat(2000));
    let got = raw_request(proxy.addr, &post(CHAT, &big, &[])).await;
    assert_eq!(got.status, 413);
    assert_eq!(got.json()["error"]["code"], 413);
    // Chunked, no declared length: the limit still holds.
    let chunked = format!("POST {CHAT} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n", big.len());
    let got = raw_request(proxy.addr, chunked.as_bytes()).await;
    assert_eq!(got.status, 413);
    let huge_header = format!(
        "GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "h".repeat(70 * 1024)
    );
    let got = raw_request(proxy.addr, huge_header.as_bytes()).await;
    assert_eq!(got.status, 431);
    // hyper refuses the head before a request exists; the proxy's answer stands in for its
    // empty one: a JSON body, the request id, and a record.
    let v = got.json();
    assert_eq!(v["error"]["code"], 431, "{v}");
    assert_eq!(v["error"]["type"], "RequestHeaderFieldsTooLargeError");
    assert!(got.header("x-request-id").is_some(), "{}", got.head);
    // More headers than hyper's 100 is the same refusal.
    let mut many = String::from("POST /u/ann/v1/chat/completions HTTP/1.1\r\nhost: x\r\n");
    for i in 0..120 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("content-length: 2\r\n\r\n{}");
    let got = raw_request(proxy.addr, many.as_bytes()).await;
    assert_eq!(got.status, 431);
    assert_eq!(got.json()["error"]["code"], 431);
    let lines = proxy.finish().await;
    assert_eq!(
        lines.len(),
        4,
        "every request has its record, the refused heads too"
    );
    for l in &lines {
        assert_schema("record.schema.json", l);
        assert_eq!(l["outcome"], "client_error", "{l}");
    }
    assert_eq!(
        (&lines[0]["status"], &lines[1]["status"]),
        (&413.into(), &413.into())
    );
    let head = &lines[2];
    assert_eq!(
        (&head["status"], &head["path"], &head["method"]),
        (&431.into(), &"/v1/models".into(), &"GET".into())
    );
    let many = &lines[3];
    assert_eq!(
        (&many["status"], &many["user"], &many["user_source"]),
        (&431.into(), &"ann".into(), &"path".into())
    );
    assert_eq!(many["api"], "chat");
    assert!(up.seen.try_recv().is_err(), "nothing reached the upstream");
}

#[tokio::test]
async fn each_user_source_is_recorded() {
    let fx = fixture("01_chat_nonstream.http");
    let up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |c| {
        c.users.api_keys.insert(
            "bob".into(),
            tokenmeter::config::Secret("sk-bob-key".into()),
        );
    })
    .await;
    let req = r#"{"model":"m","messages":[],"user":"dave"}"#;
    let no_user = r#"{"model":"m","messages":[]}"#;
    let cases: Vec<(String, Vec<u8>)> = vec![
        (
            "alice/path".into(),
            post("/u/alice/v1/chat/completions", req, &[]),
        ),
        (
            "carol/header".into(),
            post(CHAT, req, &[("x-tokenmeter-user", "carol")]),
        ),
        (
            "bob/key_map".into(),
            post(CHAT, req, &[("authorization", "Bearer sk-bob-key")]),
        ),
        (
            "dave/body".into(),
            post(CHAT, req, &[("authorization", "Bearer sk-unknown")]),
        ),
        (
            format!(
                "{}/key_hash",
                tokenmeter::proxy::identity::key_pseudonym("sk-unknown")
            ),
            post(CHAT, no_user, &[("authorization", "Bearer sk-unknown")]),
        ),
        ("127.0.0.1/ip".into(), post(CHAT, no_user, &[])),
        // Anthropic Messages: no key, the user in metadata.user_id (as load --api messages sends it).
        (
            "erin/body".into(),
            post(
                "/v1/messages",
                r#"{"model":"m","max_tokens":5,"messages":[],"metadata":{"user_id":"erin"}}"#,
                &[],
            ),
        ),
    ];
    for (_, r) in &cases {
        assert_eq!(raw_request(proxy.addr, r).await.status, 200);
    }
    let mut up = up;
    let first = up.seen.recv().await.unwrap();
    assert!(
        first
            .request_line()
            .starts_with("POST /v1/chat/completions "),
        "prefix stripped: {}",
        first.request_line()
    );
    let second = up.seen.recv().await.unwrap();
    assert!(
        second.header("x-tokenmeter-user").is_none(),
        "user header not forwarded"
    );
    let lines = proxy.finish().await;
    let got: Vec<String> = lines
        .iter()
        .map(|l| {
            format!(
                "{}/{}",
                l["user"].as_str().unwrap(),
                l["user_source"].as_str().unwrap()
            )
        })
        .collect();
    let want: Vec<String> = cases.into_iter().map(|(w, _)| w).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn required_keys_and_upstream_key_replacement() {
    let fx = fixture("01_chat_nonstream.http");
    let mut up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |c| {
        c.users.api_keys.insert(
            "bob".into(),
            tokenmeter::config::Secret("sk-bob-key".into()),
        );
        c.users.require_known_key = true;
        c.users.upstream_api_key = Some(tokenmeter::config::Secret("sk-upstream".into()));
    })
    .await;
    let got = raw_request(
        proxy.addr,
        &post(CHAT, "{}", &[("authorization", "Bearer sk-wrong")]),
    )
    .await;
    assert_eq!(got.status, 401);
    assert_eq!(got.json()["error"]["code"], 401);
    let got = raw_request(proxy.addr, &post(CHAT, "{}", &[])).await;
    assert_eq!(got.status, 401);
    let got = raw_request(
        proxy.addr,
        &post(CHAT, "{}", &[("authorization", "Bearer sk-bob-key")]),
    )
    .await;
    assert_eq!(got.status, 200);
    let seen = up.seen.recv().await.unwrap();
    assert_eq!(
        seen.header("authorization").as_deref(),
        Some("Bearer sk-upstream")
    );
    let lines = proxy.finish().await;
    assert_eq!(
        lines
            .iter()
            .map(|l| l["status"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![401, 401, 200]
    );
    assert_eq!(lines[2]["user"], "bob");
}

#[tokio::test]
async fn a_canary_key_never_reaches_the_log_or_any_answer() {
    const CANARY: &str = "sk-canary-7d1f0c2a9b";
    let up = FakeUpstream::start(vec![
        fixture("01_chat_nonstream.http").script(Duration::ZERO),
        fixture("e02_unknown_model.http").script(Duration::ZERO),
    ])
    .await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let mut answers = Vec::new();
    let bodies = [
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":"my key is {CANARY}"}}]}}"#),
        r#"{"model":"no"}"#.to_string(),
    ];
    for body in bodies {
        let path = format!("{CHAT}?api_key={CANARY}");
        let got = raw_request(
            proxy.addr,
            &post(
                &path,
                &body,
                &[("authorization", &format!("Bearer {CANARY}"))],
            ),
        )
        .await;
        answers.push(String::from_utf8_lossy(&got.body).to_string() + &got.head);
    }
    let down = TestProxy::start("http://127.0.0.1:9", |_| {}).await;
    let got = raw_request(
        down.addr,
        &post(
            CHAT,
            "{}",
            &[("authorization", &format!("Bearer {CANARY}"))],
        ),
    )
    .await;
    answers.push(String::from_utf8_lossy(&got.body).to_string());
    let down_lines = down.finish().await;
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 2);
    let all = format!(
        "{}{}{}",
        serde_json::to_string(&lines).unwrap(),
        serde_json::to_string(&down_lines).unwrap(),
        answers.join("")
    );
    assert_eq!(all.matches("canary").count(), 0, "{all}");
    assert_eq!(lines[0]["user_source"], "key_hash");
    assert_eq!(lines[0]["path"], CHAT, "query string is not logged");
}

/// Identification runs after the request is written upstream (`Tracker::identify`): a
/// request that ends before that, here a client that leaves in the middle of its body, is still
/// logged with its user, its user's source and its user agent, as is one that is forwarded.
#[tokio::test]
async fn the_user_is_recorded_whether_or_not_the_request_reached_the_upstream() {
    let fx = fixture("01_chat_nonstream.http");
    let up = FakeUpstream::start(vec![fx.script(Duration::ZERO)]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let headers = [
        ("authorization", "Bearer sk-some-key"),
        ("user-agent", "agent/1.0"),
    ];
    let whole = post(CHAT, r#"{"model":"m","messages":[]}"#, &headers);
    raw_request(proxy.addr, &whole).await;
    // The head promises 27 body bytes; 5 arrive before the client leaves.
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(&whole[..whole.len() - 22]).await.unwrap();
    c.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest).await;
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 2, "{lines:?}");
    let pseudonym = tokenmeter::proxy::identity::key_pseudonym("sk-some-key");
    for l in &lines {
        assert_eq!(l["user"], pseudonym.as_str(), "{l}");
        assert_eq!(l["user_source"], "key_hash", "{l}");
        assert_eq!(l["user_agent"], "agent/1.0", "{l}");
    }
    assert_eq!(lines[0]["status"], 200);
    assert_ne!(lines[1]["status"], 200, "{}", lines[1]);
}
