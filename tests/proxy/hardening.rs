//! Hostile clients and broken upstreams, over real sockets: a request target that is not a path
//! never chooses where the proxy connects; an upstream that dies mid-body still gets every byte it
//! sent to the client; framing the proxy cannot trust is refused or corrected, not forwarded as it
//! came; bodiless answers and trailers are logged as what they were; a kept connection the
//! upstream is closing never fails or duplicates a request.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CHAT: &str = "/v1/chat/completions";
const STREAM_REQ: &str = r#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true}}"#;
const JSON_REQ: &str = r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#;
/// A guard against a hang, far above the prompt answers the tests expect and far below the
/// proxy's timeouts that the old behaviour waited on (set to 600 s in those tests).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// How a raw upstream ends a connection after writing its answer.
#[derive(Clone, Copy, PartialEq, Debug)]
enum End {
    /// Keep it open (until the proxy closes it).
    Open,
    /// Close it (FIN).
    Fin,
    /// Reset it (RST, SO_LINGER 0).
    Rst,
}

/// An upstream that answers each request head with `writes` (each one write, in order), then
/// ends the connection as `end` says. It counts the request heads it read.
async fn raw_upstream(writes: Vec<Vec<u8>>, end: End) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(AtomicUsize::new(0));
    let count = heads.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            s.set_nodelay(true).unwrap();
            let writes = writes.clone();
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    if read_request(&mut s, &mut buf).await.is_none() {
                        return;
                    }
                    count.fetch_add(1, Ordering::SeqCst);
                    for w in &writes {
                        if s.write_all(w).await.is_err() {
                            return;
                        }
                    }
                    match end {
                        End::Open => {}
                        End::Fin => return,
                        End::Rst => {
                            drop(socket2_linger_zero(s.into_std().unwrap()));
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, heads)
}

/// `GET /v1/models` through the proxy at `addr`, answered within [`HANG_GUARD`].
async fn get_models(addr: SocketAddr) -> Received {
    let req = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    tokio::time::timeout(HANG_GUARD, raw_request(addr, req))
        .await
        .expect("the answer was held back")
}

fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

fn event(i: usize) -> String {
    format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}},\"finish_reason\":null}}]}}\n\n"
    )
}

const SSE_HEAD: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

async fn proxy_to(
    addr: SocketAddr,
    tweak: impl FnOnce(&mut tokenmeter::config::ServeConfig),
) -> TestProxy {
    TestProxy::start(&format!("http://{addr}"), tweak).await
}

/// Issue 32, defect 1: `*` and authority-form targets are refused with 400 before any
/// connection is made, and an absolute-form target's authority is ignored: the request goes to
/// the configured upstream, with its own `Host`, and the upstream key goes nowhere else.
#[tokio::test]
async fn a_request_target_never_chooses_where_the_proxy_connects() {
    let mut up = FakeUpstream::start(vec![Script {
        steps: vec![Step::Raw(
            Duration::ZERO,
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
                .to_vec(),
        )],
    }])
    .await;
    // A listener the client names in its targets: it must never see a connection.
    let decoy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let decoy_addr = decoy.local_addr().unwrap();
    let decoy_hits = Arc::new(AtomicUsize::new(0));
    let hits = decoy_hits.clone();
    tokio::spawn(async move {
        while decoy.accept().await.is_ok() {
            hits.fetch_add(1, Ordering::SeqCst);
        }
    });
    let proxy = TestProxy::start(&up.url(), |c| {
        c.users.upstream_api_key = Some(tokenmeter::config::Secret("SECRET".into()));
    })
    .await;
    let refused = [
        "OPTIONS * HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_string(),
        "POST * HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
            .to_string(),
        format!("CONNECT {decoy_addr} HTTP/1.1\r\nhost: {decoy_addr}\r\nconnection: close\r\n\r\n"),
    ];
    for req in &refused {
        let r = raw_request(proxy.addr, req.as_bytes()).await;
        assert_eq!(r.status, 400, "{req:?}: {}", r.head);
        let err = r.json();
        assert_eq!(err["error"]["type"], "BadRequestError", "{err}");
        assert!(!String::from_utf8_lossy(&r.body).contains("SECRET"));
    }
    // Absolute form: only the path is taken.
    let abs = format!(
        "GET http://{decoy_addr}/v1/models HTTP/1.1\r\nhost: {decoy_addr}\r\nconnection: close\r\n\r\n"
    );
    let r = raw_request(proxy.addr, abs.as_bytes()).await;
    assert_eq!(r.status, 200, "{}", r.head);
    let seen = up.seen.recv().await.unwrap();
    assert_eq!(seen.request_line(), "GET /v1/models HTTP/1.1");
    assert_eq!(seen.header("host").unwrap(), up.addr.to_string());
    assert_eq!(seen.header("authorization").unwrap(), "Bearer SECRET");
    assert!(
        up.seen.try_recv().is_err(),
        "the refused targets reached the upstream"
    );
    assert_eq!(decoy_hits.load(Ordering::SeqCst), 0);
    // Nothing failed upstream: the proxy stays ready.
    let ready = raw_request(
        proxy.addr,
        b"GET /stats/readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(
        ready.status,
        200,
        "{}",
        String::from_utf8_lossy(&ready.body)
    );
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 4);
    for l in &lines[..3] {
        assert_eq!(l["status"], 400, "{l}");
        assert_eq!(l["outcome"], "client_error", "{l}");
    }
}

/// Issue 32, defect 2: the upstream writes a head, five whole events and part of a sixth, then
/// closes or resets. The client gets all of it, then the cut (a chunked body without its end),
/// in every run, and the log says what the client got.
#[tokio::test]
async fn an_upstream_cut_mid_body_loses_nothing_it_sent() {
    let events: String = (0..5).map(|i| chunk(&event(i))).collect();
    let partial = "17\r\ndata: {\"partial\r\n";
    let whole = [SSE_HEAD, &events, partial].concat().into_bytes();
    let separate: Vec<Vec<u8>> = std::iter::once(SSE_HEAD.to_string())
        .chain((0..5).map(|i| chunk(&event(i))))
        .chain(std::iter::once(partial.to_string()))
        .map(String::into_bytes)
        .collect();
    let expected_body = [
        (0..5).map(event).collect::<String>(),
        "data: {\"partial\r\n".to_string(),
    ]
    .concat();
    for (name, writes, end) in [
        ("one write, FIN", vec![whole.clone()], End::Fin),
        ("one write, RST", vec![whole.clone()], End::Rst),
        ("separate writes, FIN", separate.clone(), End::Fin),
    ] {
        let (addr, _) = raw_upstream(writes, end).await;
        let proxy = proxy_to(addr, |_| {}).await;
        let runs = 20;
        for run in 0..runs {
            let r = raw_request(proxy.addr, &post(CHAT, STREAM_REQ, &[])).await;
            assert_eq!(r.status, 200, "{name}, run {run}");
            assert!(!r.complete, "{name}, run {run}: the cut must show");
            assert_eq!(
                String::from_utf8_lossy(&r.body),
                expected_body,
                "{name}, run {run}"
            );
        }
        let lines = proxy.finish().await;
        assert_eq!(lines.len(), runs, "{name}");
        for l in &lines {
            assert_eq!(l["outcome"], "upstream_aborted", "{name}: {l}");
            assert_eq!(l["bytes_out"], expected_body.len(), "{name}: {l}");
            assert_eq!(l["completion_tokens"], 5, "{name}: {l}");
        }
    }
}

/// Issue 32, defect 3: a `content-length` beside `transfer-encoding: chunked` does not describe
/// the body (RFC 9112 §6.3): it is removed, and the client gets the chunks' bytes whole.
#[tokio::test]
async fn a_length_beside_chunked_is_removed_before_forwarding() {
    for (length, data) in [(3, "hello world"), (50, "hello")] {
        let wire = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {length}\r\ntransfer-encoding: chunked\r\n\r\n{}0\r\n\r\n",
            chunk(data)
        );
        let (addr, _) = raw_upstream(vec![wire.into_bytes()], End::Open).await;
        let proxy = proxy_to(addr, |_| {}).await;
        let r = get_models(proxy.addr).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-length"), None, "{}", r.head);
        assert!(r.complete);
        assert_eq!(String::from_utf8_lossy(&r.body), data);
        let lines = proxy.finish().await;
        assert_eq!(lines[0]["outcome"], "ok", "{}", lines[0]);
        assert_eq!(lines[0]["bytes_out"], data.len());
    }
}

/// Issue 32, defect 4: answers without a body (to HEAD, 204, 304, a zero length: vLLM's
/// `/health`) and a JSON answer with trailers are logged as what they were, not as aborts.
#[tokio::test]
async fn bodiless_answers_and_trailers_are_logged_ok() {
    let cases: [(&str, &str, &str); 4] = [
        (
            "HEAD",
            "/v1/models",
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 27\r\n\r\n",
        ),
        ("GET", "/v1/models", "HTTP/1.1 204 No Content\r\n\r\n"),
        (
            "GET",
            "/v1/models",
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 27\r\n\r\n",
        ),
        (
            "GET",
            "/health",
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        ),
    ];
    for (method, path, wire) in cases {
        let (addr, _) = raw_upstream(vec![wire.as_bytes().to_vec()], End::Open).await;
        let proxy = proxy_to(addr, |_| {}).await;
        let req = format!("{method} {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        // The connection stays open (a bodiless answer has no end to read to): read the head.
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        while find(&got, b"\r\n\r\n").is_none() {
            let mut b = [0u8; 1024];
            let n = s.read(&mut b).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&b[..n]);
        }
        let head = String::from_utf8_lossy(&got).to_string();
        assert!(head.starts_with(&wire[..12]), "{wire:?} -> {head:?}");
        if wire.contains("content-length: 27") {
            assert!(head.contains("content-length: 27"), "{head}");
        }
        let lines = proxy.log_lines(1).await;
        assert_eq!(lines[0]["outcome"], "ok", "{method} {wire:?}: {}", lines[0]);
        drop(s);
        proxy.stop().await;
    }
    // A chat answer with a trailer section.
    let body = r#"{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a b c"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}"#;
    let wire = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\ntrailer: x-checksum\r\n\r\n{}0\r\nx-checksum: abc\r\n\r\n",
        chunk(body)
    );
    let (addr, _) = raw_upstream(vec![wire.into_bytes()], End::Open).await;
    let proxy = proxy_to(addr, |_| {}).await;
    let r = raw_request(proxy.addr, &post(CHAT, JSON_REQ, &[("te", "trailers")])).await;
    assert_eq!(r.status, 200);
    assert_eq!(String::from_utf8_lossy(&r.body), body);
    let lines = proxy.finish().await;
    assert_eq!(lines[0]["outcome"], "ok", "{}", lines[0]);
    assert_eq!(lines[0]["completion_tokens"], 3, "{}", lines[0]);
}

/// As strict as hyper's client where request smuggling research looks: each malformed answer is
/// refused (502 before the head, a cut body after it) promptly, and a list of equal lengths
/// reaches the client as the one length it means.
#[tokio::test]
async fn framing_the_proxy_cannot_trust_is_refused_promptly() {
    let slow = |c: &mut tokenmeter::config::ServeConfig| {
        c.timeouts.upstream_headers_ms = 600_000;
        c.timeouts.body_idle_ms = 600_000;
    };
    // Refused before the head: 502.
    for wire in [
        "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\nhello",
        "HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    ] {
        let (addr, _) = raw_upstream(vec![wire.as_bytes().to_vec()], End::Open).await;
        let proxy = proxy_to(addr, slow).await;
        let r = get_models(proxy.addr).await;
        assert_eq!(r.status, 502, "{wire:?}: {}", r.head);
        proxy.stop().await;
    }
    // Cut after the head: a chunk-size line with junk after the digits, a bare CR, a bare LF,
    // data longer than its size, and extensions past the budget.
    let long_ext = format!("1;{}\r\na\r\n", "x".repeat(4000));
    let many_ext = format!("{}0\r\n\r\n", long_ext.repeat(5));
    for tail in [
        "5 garbage\r\nhello\r\n0\r\n\r\n".to_string(),
        "5\rhello\r\n0\r\n\r\n".to_string(),
        "5\nhello\r\n0\r\n\r\n".to_string(),
        "5\r\nhello!\r\n0\r\n\r\n".to_string(),
        many_ext,
    ] {
        let wire = format!("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n{tail}");
        let (addr, _) = raw_upstream(vec![wire.into_bytes()], End::Open).await;
        let proxy = proxy_to(addr, slow).await;
        let r = get_models(proxy.addr).await;
        assert_eq!(r.status, 200);
        assert!(!r.complete, "{tail:?} was read as a whole body");
        let lines = proxy.finish().await;
        assert_eq!(
            lines[0]["outcome"], "upstream_aborted",
            "{tail:?}: {}",
            lines[0]
        );
    }
    // A list of equal lengths goes on as one.
    let (addr, _) = raw_upstream(
        vec![b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\nhello".to_vec()],
        End::Open,
    )
    .await;
    let proxy = proxy_to(addr, slow).await;
    let r = get_models(proxy.addr).await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-length").as_deref(),
        Some("5"),
        "{}",
        r.head
    );
    assert_eq!(r.body, b"hello");
    proxy.stop().await;
}

/// Interim answers without end get a 502 once past their bound, not a core held until the
/// header timeout.
#[tokio::test]
async fn endless_interim_answers_are_bounded() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        read_request(&mut s, &mut buf).await.unwrap();
        // Until the proxy closes the connection, or past the client's guard if it never does.
        let until = tokio::time::Instant::now() + 2 * HANG_GUARD;
        while tokio::time::Instant::now() < until {
            if s.write_all(b"HTTP/1.1 102 Processing\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    let proxy = proxy_to(addr, |c| c.timeouts.upstream_headers_ms = 600_000).await;
    let r = get_models(proxy.addr).await;
    assert_eq!(r.status, 502, "{}", r.head);
    proxy.stop().await;
}

/// An upstream that answers after reading only the head (an early 413) gets its answer to the
/// client at once, while the proxy still has most of the body to write.
#[tokio::test]
async fn an_early_answer_reaches_the_client_before_the_body_is_written() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 4096];
        while find(&got, b"\r\n\r\n").is_none() {
            let n = s.read(&mut b).await.unwrap();
            got.extend_from_slice(&b[..n]);
        }
        let body = r#"{"error":{"message":"too large","type":"invalid_request_error"}}"#;
        let answer = format!(
            "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(answer.as_bytes()).await.unwrap();
        // Reads nothing more; holds the connection until the test ends.
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let proxy = proxy_to(addr, |c| {
        c.timeouts.upstream_headers_ms = 600_000;
        c.max_request_body_bytes = 64 << 20;
    })
    .await;
    // Larger than what loopback's socket buffers hold, so the proxy's write cannot finish.
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(48 << 20)
    );
    let r = tokio::time::timeout(HANG_GUARD, raw_request(proxy.addr, &post(CHAT, &big, &[])))
        .await
        .expect("the early answer was held back");
    assert_eq!(r.status, 413, "{}", r.head);
    assert!(String::from_utf8_lossy(&r.body).contains("too large"));
    proxy.stop().await;
}

/// A request is never sent twice once any of it was written: an upstream that reads the head of
/// a large POST on a kept connection and then resets it gets one copy, and the client a 502.
#[tokio::test]
async fn a_partly_written_request_is_never_resent() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let marked = Arc::new(AtomicUsize::new(0));
    let count = marked.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut b = vec![0u8; 64 * 1024];
                loop {
                    while find(&buf, b"\r\n\r\n").is_none() {
                        let Ok(n) = s.read(&mut b).await else { return };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&b[..n]);
                    }
                    let end = find(&buf, b"\r\n\r\n").unwrap();
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    if head.contains("x-mark: big") {
                        // Took the head: reset with the body still arriving.
                        count.fetch_add(1, Ordering::SeqCst);
                        drop(socket2_linger_zero(s.into_std().unwrap()));
                        return;
                    }
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buf.len() < end + 4 + len {
                        let n = s.read(&mut b).await.unwrap();
                        buf.extend_from_slice(&b[..n]);
                    }
                    buf.drain(..end + 4 + len);
                    s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                        .await
                        .unwrap();
                }
            });
        }
    });
    let proxy = proxy_to(addr, |c| c.max_request_body_bytes = 64 << 20).await;
    // One request leaves a kept connection in the pool.
    let r = raw_request(proxy.addr, &post(CHAT, JSON_REQ, &[])).await;
    assert_eq!(r.status, 200);
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(48 << 20)
    );
    let r = tokio::time::timeout(
        HANG_GUARD,
        raw_request(proxy.addr, &post(CHAT, &big, &[("x-mark", "big")])),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 502, "{}", r.head);
    assert_eq!(
        marked.load(Ordering::SeqCst),
        1,
        "the request was sent again"
    );
    proxy.stop().await;
}

/// The keep-alive race: the upstream closes connections idle for 200 ms (as vLLM's server does
/// after 5 s) while requests arrive at gaps around that. With `pool_idle_ms` below the
/// upstream's keep-alive (at the default's ratio to vLLM's 5 s), no request of 1,000 fails and
/// none reaches the upstream twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keep_alive_race_fails_and_duplicates_nothing() {
    const KEEP_ALIVE: Duration = Duration::from_millis(200);
    const CLIENTS: usize = 20;
    const PER_CLIENT: usize = 50;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let ids = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let ids = ids.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // Closes the connection once it has been idle for KEEP_ALIVE.
                    let Ok(Some(seen)) =
                        tokio::time::timeout(KEEP_ALIVE, read_request(&mut s, &mut buf)).await
                    else {
                        return;
                    };
                    let id = seen.header("x-id").unwrap();
                    *ids.lock().unwrap().entry(id).or_default() += 1;
                    if s
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    let default_ms = tokenmeter::config::ServeConfig::default()
        .timeouts
        .pool_idle_ms;
    // vLLM's keep-alive is 5 s: the same ratio here.
    let pool_idle_ms = KEEP_ALIVE.as_millis() as u64 * default_ms / 5_000;
    assert!(pool_idle_ms < KEEP_ALIVE.as_millis() as u64);
    let proxy = proxy_to(addr, |c| c.timeouts.pool_idle_ms = pool_idle_ms).await;
    let target = proxy.addr;
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            // Gaps from 100 to 300 ms, spread so that many fall near the keep-alive.
            for i in 0..PER_CLIENT {
                let gap = 100 + (client * 37 + i * 53) % 201;
                tokio::time::sleep(Duration::from_millis(gap as u64)).await;
                let id = format!("{client}-{i}");
                let r = raw_request(target, &post(CHAT, JSON_REQ, &[("x-id", &id)])).await;
                statuses.push(r.status);
            }
            statuses
        }));
    }
    let mut failed = 0;
    for t in tasks {
        failed += t.await.unwrap().iter().filter(|&&s| s != 200).count();
    }
    let seen = seen.lock().unwrap().clone();
    let duplicated = seen.values().filter(|&&n| n > 1).count();
    println!(
        "{} requests: {failed} failed, {duplicated} duplicated, {} distinct seen",
        CLIENTS * PER_CLIENT,
        seen.len()
    );
    assert_eq!(failed, 0);
    assert_eq!(duplicated, 0);
    assert_eq!(seen.len(), CLIENTS * PER_CLIENT);
    proxy.stop().await;
}

/// The default keeps idle connections for less time than vLLM's server keeps them (5 s).
#[test]
fn the_default_pool_idle_time_is_below_vllms_keep_alive() {
    let d = tokenmeter::config::ServeConfig::default();
    assert!(
        d.timeouts.pool_idle_ms < 5_000,
        "{}",
        d.timeouts.pool_idle_ms
    );
}
