//! The proxy's own HTTP/1 front (`src/proxy/front_h1.rs`): the requests it serves itself, its
//! hand-over to hyper's server on the same connection, and its timeouts, over real sockets.

use std::time::{Duration, Instant};

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CHAT: &str = "/v1/chat/completions";

/// An upstream answer: a small JSON body of known length.
fn json_answer(n: usize) -> Script {
    let body = format!(r#"{{"id":"r{n}","object":"chat.completion","choices":[]}}"#);
    let raw = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    Script {
        steps: vec![Step::Raw(Duration::ZERO, raw.into_bytes())],
    }
}

fn post(body: &str, extra: &str) -> String {
    format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn late_bodies_pipelined_requests_and_a_hand_over_share_one_connection_in_order() {
    let mut up = FakeUpstream::start((0..4).map(json_answer).collect()).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    // 1: the head first, its body 50 ms later (the front has the head and awaits the body).
    let first = post(r#"{"model":"m","n":1}"#, "");
    let cut = first.find("\r\n\r\n").unwrap() + 4;
    c.write_all(&first.as_bytes()[..cut]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    c.write_all(&first.as_bytes()[cut..]).await.unwrap();
    // 2 and 3 pipelined in one write; 4 chunked, which the front hands to hyper's server, and
    // `connection: close` so that the answers end with the connection.
    let mut rest = post(r#"{"model":"m","n":2}"#, "");
    rest.push_str(&post(r#"{"model":"m","n":3}"#, ""));
    let last = r#"{"model":"m","n":4}"#;
    rest.push_str(&format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{last}\r\n0\r\n\r\n",
        last.len()
    ));
    c.write_all(rest.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut raw))
        .await
        .expect("the proxy closes after the last answer")
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let ids: Vec<&str> = text
        .match_indices(r#""id":"r"#)
        .map(|(i, _)| &text[i + 6..i + 8])
        .collect();
    assert_eq!(ids, ["r0", "r1", "r2", "r3"], "{text}");
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 4, "{text}");
    for n in 1..=4 {
        let seen = up.seen.recv().await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&seen.body).unwrap();
        assert_eq!(body["n"], n, "upstream request {n} in order");
    }
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 4);
    assert!(lines.iter().all(|l| l["status"] == 200), "{lines:?}");
}

#[tokio::test]
async fn a_response_from_the_front_is_framed_and_dated_as_hyper_frames_it() {
    let up = FakeUpstream::start(vec![json_answer(0)]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let raw = first_read(proxy.addr, "connection: keep-alive\r\n").await;
    let got = parse_response(&raw);
    assert_eq!(got.status, 200);
    let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(head.contains("\r\ncontent-length: "), "{head}");
    assert!(head.contains("\r\ndate: "), "{head}");
    assert!(head.contains("\r\nx-request-id: "), "{head}");
    proxy.stop().await;
}

/// Sends a chat request with the `extra` head fields on a new connection; what the first read
/// gives back.
async fn first_read(addr: std::net::SocketAddr, extra: &str) -> Vec<u8> {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(post(r#"{"model":"m"}"#, extra).as_bytes())
        .await
        .unwrap();
    let mut raw = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut raw))
        .await
        .unwrap()
        .unwrap();
    raw.truncate(n);
    raw
}

/// The fields of a response head, one per line, the status line first, the `date` value out.
fn head_lines(raw: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(raw);
    let head = &text[..text.find("\r\n\r\n").expect("a whole head")];
    head.split("\r\n")
        .map(|l| match l.split_once(": ") {
            Some((n, _)) if n.eq_ignore_ascii_case("date") || n == "x-request-id" => n.to_owned(),
            _ => l.to_owned(),
        })
        .collect()
}

#[tokio::test]
async fn the_upstreams_fields_reach_the_client_in_its_order_less_hop_by_hop_ones() {
    let body = r#"{"id":"r","object":"chat.completion","choices":[]}"#;
    let answer = format!(
        "HTTP/1.1 200 Fine\r\nServer: up\r\nConnection: keep-alive, X-Hop\r\nContent-Type: application/json\r\n\
X-Hop: 1\r\nX-Request-Id: upstream\r\nContent-Length: {n}, {n}\r\nKeep-Alive: timeout=5\r\nx-b: 2\r\n\
Proxy-Foo: 3\r\nX-A: 1\r\nDate: Sun, 06 Dec 2026 10:00:00 GMT\r\n\r\n{body}",
        n = body.len()
    );
    let script = || Script {
        steps: vec![Step::Raw(Duration::ZERO, answer.clone().into_bytes())],
    };
    let up = FakeUpstream::start(vec![script(), script()]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    // Served by the front; then, `connection: close`, by hyper's server.
    let mut heads = Vec::new();
    for extra in ["", "connection: close\r\n"] {
        let raw = first_read(proxy.addr, extra).await;
        assert!(
            raw.ends_with(body.as_bytes()),
            "{:?}",
            String::from_utf8_lossy(&raw)
        );
        heads.push(head_lines(&raw));
    }
    // As sent, the one length it means, the proxy's request id in place of the upstream's.
    assert_eq!(
        heads[0],
        [
            "HTTP/1.1 200 Fine",
            "Server: up",
            "Content-Type: application/json",
            &format!("Content-Length: {}", body.len()),
            "x-b: 2",
            "X-A: 1",
            "Date",
            "x-request-id",
        ]
    );
    // hyper's server writes names in lowercase, and `connection: close` for this client.
    let lower: Vec<String> = heads[0][1..]
        .iter()
        .map(|l| l.to_ascii_lowercase())
        .collect();
    assert_eq!(heads[1][0], "HTTP/1.1 200 Fine");
    assert_eq!(
        heads[1][1..]
            .iter()
            .filter(|l| *l != "connection: close")
            .cloned()
            .collect::<Vec<_>>(),
        lower
    );
    proxy.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_at_the_head_read_timeout() {
    let up = FakeUpstream::start(vec![json_answer(0)]).await;
    let proxy = TestProxy::start(&up.url(), |c| c.timeouts.head_read_ms = 200).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    c.write_all(post(r#"{"model":"m"}"#, "").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = c.read(&mut buf).await.unwrap();
    assert_eq!(parse_response(&buf[..n]).status, 200);
    let idle = Instant::now();
    let read = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("closed well before 5 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let after = idle.elapsed();
    assert!(
        after >= Duration::from_millis(150) && after < Duration::from_millis(1500),
        "{after:?}"
    );
    proxy.stop().await;
}

#[tokio::test]
async fn a_client_gone_mid_body_is_recorded_and_nothing_goes_upstream() {
    let mut up = FakeUpstream::start(vec![json_answer(0)]).await;
    let proxy = TestProxy::start(&up.url(), |_| {}).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    let whole = post(r#"{"model":"m","messages":[]}"#, "");
    c.write_all(&whole.as_bytes()[..whole.len() - 5])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(c);
    let lines = proxy.finish().await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["outcome"], "client_error", "{lines:?}");
    assert!(up.seen.try_recv().is_err());
}
