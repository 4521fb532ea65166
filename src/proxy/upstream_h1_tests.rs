//! The upstream HTTP/1.1 connection against raw responses written to a real socket: framing by
//! length, chunks (with extensions and trailers) and close; the keep-alive rules; interim
//! responses; reason phrases; and a clear error for each malformed or cut-short response.

use std::future::poll_fn;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, Version};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Chunk, Framing, H1Conn, H1Error, Head, READ_STEP};
use crate::proxy::upstream_head::encode_head;

type Conn = H1Conn<hyper_util::rt::TokioIo<TcpStream>>;

/// A connection to a server that writes `wire` after it reads a request head, then closes if
/// `close` (else it keeps the socket open until the client closes it).
async fn conn_to(wire: &'static [u8], close: bool) -> Conn {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        read_request_head(&mut s).await;
        s.write_all(wire).await.unwrap();
        if !close {
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
        }
    });
    let s = TcpStream::connect(addr).await.unwrap();
    let mut c = H1Conn::new(hyper_util::rt::TokioIo::new(s));
    let req = Request::get("/v1/models")
        .header("host", "up")
        .body(())
        .unwrap();
    c.write_request(encode_head(&req, 0), Bytes::new())
        .await
        .unwrap();
    c
}

async fn read_request_head(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut b = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut b).await.unwrap();
        assert!(n > 0, "client closed before its head");
        got.extend_from_slice(&b[..n]);
    }
    got
}

/// The body's frames to its end: the data joined, and the trailers if any.
async fn read_body(
    c: &mut Conn,
    framing: &mut Framing,
) -> Result<(Vec<u8>, Option<HeaderMap>), H1Error> {
    let mut data = Vec::new();
    let mut trailers = None;
    while let Some(frame) = poll_fn(|cx| c.poll_body(framing, cx)).await {
        match frame?.into_data() {
            Ok(d) => data.extend_from_slice(&d),
            Err(f) => trailers = f.into_trailers().ok(),
        }
    }
    Ok((data, trailers))
}

async fn head_and_body(wire: &'static [u8], close: bool) -> (Head, Result<Vec<u8>, H1Error>, Conn) {
    let mut c = conn_to(wire, close).await;
    let mut head = c.read_head(&Method::GET).await.unwrap();
    let body = read_body(&mut c, &mut head.framing).await.map(|(d, _)| d);
    (head, body, c)
}

#[tokio::test]
async fn a_length_framed_body_is_read_whole_and_leaves_the_connection_reusable() {
    let (head, body, c) = head_and_body(
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\nx-a: 2\r\n\r\nhello",
        false,
    )
    .await;
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(head.fields.as_sent().get_all("x-a").iter().count(), 2);
    assert_eq!(body.unwrap(), b"hello");
    assert!(head.reusable);
    assert!(c.is_clean());
}

#[tokio::test]
async fn a_chunked_body_with_extensions_and_trailers_is_read_in_order() {
    let mut c = conn_to(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: t\r\n\r\n",
        false,
    )
    .await;
    let mut head = c.read_head(&Method::GET).await.unwrap();
    assert_eq!(head.framing, Framing::Chunked(Chunk::Size));
    let (data, trailers) = read_body(&mut c, &mut head.framing).await.unwrap();
    assert_eq!(data, b"hello world");
    assert_eq!(trailers.unwrap().get("x-trailer").unwrap(), "t");
    assert_eq!(head.framing, Framing::Done);
    assert!(head.reusable && c.is_clean());
}

#[tokio::test]
async fn a_chunked_body_read_one_byte_at_a_time_is_the_same() {
    // A one-byte pipe: every read returns one byte, so every state boundary is crossed mid-read.
    let (client, mut server) = tokio::io::duplex(1);
    tokio::spawn(async move {
        server
            .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\na\r\n0123456789\r\n3\r\nabc\r\n0\r\n\r\n")
            .await
            .unwrap();
        let mut rest = Vec::new();
        let _ = server.read_to_end(&mut rest).await;
    });
    let mut c = H1Conn::new(hyper_util::rt::TokioIo::new(client));
    let mut head = c.read_head(&Method::GET).await.unwrap();
    let mut frames = 0;
    let mut data = Vec::new();
    while let Some(f) = poll_fn(|cx| c.poll_body(&mut head.framing, cx)).await {
        data.extend_from_slice(&f.unwrap().into_data().unwrap());
        frames += 1;
    }
    assert_eq!(data, b"0123456789abc");
    assert_eq!(frames, 13, "one frame per byte read");
    assert!(c.is_clean());
}

#[tokio::test]
async fn a_large_body_is_read_whole_in_growing_reads() {
    const LEN: usize = 1 << 20;
    let mut wire = format!("HTTP/1.1 200 OK\r\ncontent-length: {LEN}\r\n\r\n").into_bytes();
    wire.extend((0..LEN).map(|i| (i % 251) as u8));
    let mut c = conn_to(wire.leak(), false).await;
    assert_eq!(c.read_step(), READ_STEP);
    let mut head = c.read_head(&Method::GET).await.unwrap();
    let (data, _) = read_body(&mut c, &mut head.framing).await.unwrap();
    assert_eq!(data.len(), LEN);
    assert!(data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    // The sender outpaces single reads: some read filled its room, and the step grew.
    assert!(
        c.read_step() > READ_STEP,
        "read step stayed at {}",
        c.read_step()
    );
    assert!(head.reusable && c.is_clean());
}

#[tokio::test]
async fn keep_alive_follows_the_version_and_the_connection_header() {
    for (wire, reusable) in [
        (
            &b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"[..],
            false,
        ),
        (
            b"HTTP/1.1 200 OK\r\nconnection: Keep-Alive, Close\r\ncontent-length: 0\r\n\r\n",
            false,
        ),
        (b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", false),
        (
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n",
            true,
        ),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", true),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            true,
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n",
            false,
        ),
    ] {
        let (head, body, _) = head_and_body(wire, false).await;
        assert_eq!(head.reusable, reusable, "{}", String::from_utf8_lossy(wire));
        assert!(body.unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_body_without_length_ends_at_the_close_and_its_connection_is_not_kept() {
    let (head, body, _) = head_and_body(b"HTTP/1.1 200 OK\r\n\r\nto the end", true).await;
    assert!(!head.reusable);
    assert_eq!(body.unwrap(), b"to the end");
    let (head, body, _) = head_and_body(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\nzz",
        true,
    )
    .await;
    assert_eq!((head.framing, head.reusable), (Framing::Done, false));
    assert_eq!(body.unwrap(), b"zz");
}

#[tokio::test]
async fn bodiless_answers_have_no_body_whatever_their_length_says() {
    let mut c = conn_to(b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n", false).await;
    let head = c.read_head(&Method::HEAD).await.unwrap();
    assert_eq!((head.framing, head.reusable), (Framing::Done, true));
    for wire in [
        &b"HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n"[..],
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 7\r\n\r\n",
    ] {
        let (head, body, c) = head_and_body(wire, false).await;
        assert_eq!(head.framing, Framing::Done);
        assert!(body.unwrap().is_empty() && c.is_clean());
    }
}

#[tokio::test]
async fn interim_responses_are_read_past_and_reason_phrases_kept() {
    let (head, body, _) = head_and_body(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 429 Slow Down\r\ncontent-length: 2\r\n\r\nno",
        false,
    )
    .await;
    assert_eq!(head.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(head.fields.as_sent().get("link").is_none());
    assert_eq!(head.fields.reason(), b"Slow Down");
    assert_eq!(body.unwrap(), b"no");
    let (head, _, _) = head_and_body(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", false).await;
    assert_eq!(head.version, Version::HTTP_10);
    assert_eq!(head.fields.reason(), b"OK");
}

#[tokio::test]
async fn a_body_cut_short_is_an_error_not_an_end() {
    let (_, body, _) =
        head_and_body(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", true).await;
    assert!(matches!(body, Err(H1Error::Incomplete)), "{body:?}");
    let (_, body, _) = head_and_body(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
        true,
    )
    .await;
    assert!(matches!(body, Err(H1Error::Incomplete)), "{body:?}");
    let mut c = conn_to(b"HTTP/1.1 200 OK\r\ncontent-le", true).await;
    assert!(matches!(
        c.read_head(&Method::GET).await,
        Err(H1Error::Incomplete)
    ));
}

#[tokio::test]
async fn malformed_responses_are_refused_with_a_reason() {
    for (wire, why) in [
        (&b"HTTP/1.1 2x0 OK\r\n\r\n"[..], "malformed response head"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\nabc",
            "invalid content-length",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "invalid content-length",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello",
            "invalid content-length",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 5,\r\n\r\nhello",
            "invalid content-length",
        ),
        (
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            "HTTP/1.0 response with transfer-encoding",
        ),
    ] {
        let mut c = conn_to(wire, true).await;
        match c.read_head(&Method::GET).await {
            Err(H1Error::Invalid(w)) => assert_eq!(w, why),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(wire)),
        }
    }
    for (wire, why) in [
        (
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n"[..],
            "invalid chunk size",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n",
            "chunk data longer than its size",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\n0\r\n\r\n",
            "chunk data longer than its size",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5 x\r\nhello\r\n",
            "invalid chunk size",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\rhello\r\n",
            "bare CR or LF in a chunk-size line",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\r\n",
            "bare CR or LF in a chunk-size line",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\nx-a: 1\n\r\n",
            "malformed trailers",
        ),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\n",
            "malformed trailers",
        ),
    ] {
        let (_, body, _) = head_and_body(wire, true).await;
        match body {
            Err(H1Error::Invalid(w)) => assert_eq!(w, why),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(wire)),
        }
    }
}

#[tokio::test]
async fn a_head_past_the_limits_is_refused() {
    let mut long = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
    long.resize(70 * 1024, b'a');
    let mut c = conn_to(long.leak(), false).await;
    match c.read_head(&Method::GET).await {
        Err(H1Error::Invalid(w)) => assert_eq!(w, "response head too large"),
        other => panic!("{other:?}"),
    }
    let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
    for i in 0..200 {
        many.extend_from_slice(format!("x-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    let mut c = conn_to(many.leak(), false).await;
    match c.read_head(&Method::GET).await {
        Err(H1Error::Invalid(w)) => assert_eq!(w, "too many response header fields"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_idle_connection_is_open_until_the_upstream_closes_or_speaks() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (go, wait) = tokio::sync::oneshot::channel::<&'static [u8]>();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let say = wait.await.unwrap();
        s.write_all(say).await.unwrap();
    });
    let mut c = H1Conn::new(hyper_util::rt::TokioIo::new(
        TcpStream::connect(addr).await.unwrap(),
    ));
    let noop = std::task::Waker::noop();
    assert!(c.poll_idle(&mut std::task::Context::from_waker(noop)));
    go.send(b"unasked").unwrap();
    // Polled with the task's waker, the read completes once the bytes (then the close) arrive.
    let open = poll_fn(|cx| {
        if c.poll_idle(cx) {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(false)
        }
    })
    .await;
    assert!(!open);
}

#[test]
fn request_heads_carry_the_exact_length_of_the_whole_body() {
    let req = Request::post("/v1/chat/completions?x=1")
        .header("host", "up:8000")
        .header("content-length", "3")
        .header("transfer-encoding", "chunked")
        .header("x-m", "a")
        .header("x-m", "b")
        .body(())
        .unwrap();
    let head = encode_head(&req, 11);
    assert_eq!(
        &head[..],
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: up:8000\r\nx-m: a\r\nx-m: b\r\ncontent-length: 11\r\n\r\n"
    );
    let get = Request::get("/v1/models")
        .header("host", "up")
        .body(())
        .unwrap();
    assert_eq!(
        &encode_head(&get, 0)[..],
        b"GET /v1/models HTTP/1.1\r\nhost: up\r\n\r\n"
    );
    let empty_post = Request::post("http://up/x")
        .header("content-length", "0")
        .body(())
        .unwrap();
    assert_eq!(
        &encode_head(&empty_post, 0)[..],
        b"POST /x HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
    );
}
