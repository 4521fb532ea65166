//! The upstream connection pool, over real sockets: kept connections are reused (also after a
//! response with no body), one the upstream closed while it was idle is not (the request goes on
//! a new connection and succeeds) and is closed by the proxy as soon as the upstream closes it,
//! and one idle past `pool_idle_ms` is closed by the proxy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A keep-alive upstream that answers every request with a small JSON body, and a POST to
/// `/v1/reverse` with its body reversed. It counts the connections it accepted; with
/// `close_after` it closes each connection that long after its first answer (as a server's
/// keep-alive timeout does); it reports when a connection was closed by the other side.
struct CountingUpstream {
    addr: std::net::SocketAddr,
    accepted: Arc<AtomicUsize>,
    peer_closed: tokio::sync::mpsc::UnboundedReceiver<Instant>,
}

async fn counting_upstream(close_after: Option<Duration>) -> CountingUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (closed_tx, peer_closed) = tokio::sync::mpsc::unbounded_channel();
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                loop {
                    let n = match s.read(&mut tmp).await {
                        Ok(0) | Err(_) => {
                            let _ = closed_tx.send(Instant::now());
                            return;
                        }
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&tmp[..n]);
                    // Bodiless requests or a short body: the head's end is the request's end here
                    // once the declared length has arrived.
                    let Some(end) = find(&buf, b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    if buf.len() < end + 4 + len {
                        continue;
                    }
                    let request_body: Vec<u8> = buf.drain(..end + 4 + len).skip(end + 4).collect();
                    // `/v1/reverse` answers with its request's body reversed.
                    if head.starts_with("post /v1/reverse ") {
                        let reversed: Vec<u8> = request_body.into_iter().rev().collect();
                        let head = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {len}\r\n\r\n"
                        );
                        s.write_all(head.as_bytes()).await.unwrap();
                        s.write_all(&reversed).await.unwrap();
                        continue;
                    }
                    // `/health` answers with an empty body, as vLLM's does.
                    let body = if head.contains(" /health ") {
                        ""
                    } else {
                        r#"{"object":"list","data":[]}"#
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    // A HEAD answer has the head only (its length is the GET's).
                    let resp = if head.starts_with("head ") {
                        resp.trim_end_matches(body).to_string()
                    } else {
                        resp
                    };
                    s.write_all(resp.as_bytes()).await.unwrap();
                    if let Some(after) = close_after {
                        tokio::time::sleep(after).await;
                        let _ = s.shutdown().await;
                        // Half closed: the proxy's own close is seen, and reported.
                        while let Ok(n) = s.read(&mut tmp).await {
                            if n == 0 {
                                break;
                            }
                        }
                        let _ = closed_tx.send(Instant::now());
                        return;
                    }
                }
            });
        }
    });
    CountingUpstream {
        addr,
        accepted,
        peer_closed,
    }
}

/// A proxy in front of `up` with one serving thread (so one pool sees every request).
async fn one_thread_proxy(up: &CountingUpstream, pool_idle_ms: u64) -> TestProxy {
    TestProxy::start(&format!("http://{}", up.addr), |c| {
        c.serving_threads = 1;
        c.timeouts.pool_idle_ms = pool_idle_ms;
    })
    .await
}

fn get_models() -> Vec<u8> {
    b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".to_vec()
}

#[tokio::test]
async fn kept_connections_are_reused() {
    let up = counting_upstream(None).await;
    let proxy = one_thread_proxy(&up, 90_000).await;
    for _ in 0..5 {
        let got = raw_request(proxy.addr, &get_models()).await;
        assert_eq!(got.status, 200);
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1, "one kept connection");
    proxy.stop().await;
}

#[tokio::test]
async fn a_connection_whose_answer_has_no_body_is_reused() {
    let up = counting_upstream(None).await;
    let proxy = one_thread_proxy(&up, 90_000).await;
    for _ in 0..3 {
        let got = raw_request(
            proxy.addr,
            b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(got.status, 200);
        assert!(got.body.is_empty());
        // HEAD: hyper never polls the body of its answer.
        let got = raw_request(
            proxy.addr,
            b"HEAD /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(got.status, 200);
        assert_eq!(got.header("content-length").as_deref(), Some("27"));
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1, "one kept connection");
    proxy.stop().await;
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_not_used_again() {
    let mut up = counting_upstream(Some(Duration::from_millis(20))).await;
    let proxy = one_thread_proxy(&up, 90_000).await;
    for i in 1..=4 {
        let got = raw_request(proxy.addr, &get_models()).await;
        assert_eq!(
            got.status,
            200,
            "request {i}: {}",
            String::from_utf8_lossy(&got.body)
        );
        // The upstream closes the connection it just answered on; wait until that close has
        // gone through (the proxy's side seen closed), not for a guessed time.
        tokio::time::timeout(Duration::from_secs(10), up.peer_closed.recv())
            .await
            .expect("the upstream's close went through")
            .unwrap();
    }
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        4,
        "a new connection each time"
    );
    let lines = proxy.finish().await;
    assert!(lines.iter().all(|l| l["status"] == 200), "{lines:?}");
}

/// An idle kept connection has no task of its own; the upstream's close must still be noticed
/// while nothing is sent, and the proxy's side closed at once, not at the next request or sweep.
#[tokio::test]
async fn a_connection_the_upstream_closes_while_idle_is_closed_by_the_proxy_at_once() {
    let mut up = counting_upstream(Some(Duration::from_millis(20))).await;
    let proxy = one_thread_proxy(&up, 90_000).await;
    for _ in 0..2 {
        let got = raw_request(proxy.addr, &get_models()).await;
        assert_eq!(got.status, 200);
        // The sweep runs every 45 s here: only the stirred socket can close it sooner.
        tokio::time::timeout(Duration::from_secs(5), up.peer_closed.recv())
            .await
            .expect("the proxy kept a connection the upstream had closed")
            .unwrap();
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
    proxy.stop().await;
}

#[tokio::test]
async fn a_connection_idle_past_pool_idle_ms_is_closed() {
    let mut up = counting_upstream(None).await;
    let proxy = one_thread_proxy(&up, 300).await;
    let got = raw_request(proxy.addr, &get_models()).await;
    assert_eq!(got.status, 200);
    let idle_from = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(5), up.peer_closed.recv())
        .await
        .expect("the idle connection was never closed")
        .unwrap();
    let idle = closed - idle_from;
    assert!(
        idle >= Duration::from_millis(250),
        "closed after {idle:?}, before its idle time"
    );
    proxy.stop().await;
}

/// Bodies far larger than the sockets' buffers, both ways. No task of the connection's own
/// writes the request or reads the answer: the request's wait and then the body drive it, and
/// its socket's write and read readiness must wake them. The connection is kept after.
#[tokio::test]
async fn bodies_larger_than_the_socket_buffers_pass_whole_both_ways() {
    let up = counting_upstream(None).await;
    let proxy = one_thread_proxy(&up, 90_000).await;
    let body: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    for _ in 0..2 {
        let mut req = format!(
            "POST /v1/reverse HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(&body);
        let got = raw_request(proxy.addr, &req).await;
        assert_eq!(got.status, 200);
        assert_eq!(got.body.len(), body.len());
        assert!(
            got.body.iter().eq(body.iter().rev()),
            "the answer came back whole and in order"
        );
    }
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1, "one kept connection");
    proxy.stop().await;
}
