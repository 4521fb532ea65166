//! The upstream connection's reader against hyper's HTTP/1.1 client on generated responses:
//! interim (1xx) responses before the final one; HEAD, 204 and 304 answers; bodies framed by
//! length, by chunks (random sizes, extensions, trailers) and by the close; HTTP/1.0 and 1.1;
//! `connection: close` and `keep-alive`. Each response is written to a real loopback socket in
//! random pieces, once for each reader, and the two must read the same status, version, reason
//! phrase, header fields, body, trailers and reusability, or ours must be the stricter one. The
//! only stricter outcome allowed is a connection ours does not keep where hyper would, and only
//! where RFC 9112 says the framing is suspect (see [`ours_may_close`]); an error from ours where
//! hyper reads the response is a failure. Where ours once differed, the exact bytes are held by
//! tests of their own below.
//!
//! Hyper's reusability is whether its connection becomes ready for another request once the body
//! is over (`SendRequest::ready`), or closes.

use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, Version};
use http_body::Frame;
use http_body_util::{BodyExt, Empty};
use hyper::ext::ReasonPhrase;
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Framing, H1Conn};
use crate::proxy::upstream_head::encode_head;

#[path = "upstream_h1_diff_cases.rs"]
mod cases;
use cases::{case, ours_may_close};

/// What one reader read.
#[derive(Debug, Clone, PartialEq)]
struct Read {
    status: u16,
    version: Version,
    reason: Option<Bytes>,
    /// The header fields but `content-length`, in order.
    fields: Vec<(String, Bytes)>,
    /// The distinct values the `content-length` fields list. Ours passes on a list of equal
    /// lengths as one field (RFC 9110 §8.6 allows it), and drops the field beside a
    /// `transfer-encoding` (RFC 9112 §6.3 rule 3: an intermediary removes it), so the field
    /// itself is not compared; the length it says is.
    lengths: Vec<String>,
    body: Bytes,
    trailers: Option<Vec<(String, Bytes)>>,
    /// The connection may carry another request.
    reusable: bool,
}

impl Read {
    fn of<B>(response: &Response<B>) -> Read {
        Read {
            status: response.status().as_u16(),
            version: response.version(),
            reason: response
                .extensions()
                .get::<ReasonPhrase>()
                .map(|r| Bytes::copy_from_slice(r.as_bytes())),
            fields: fields(response.headers())
                .into_iter()
                .filter(|(n, _)| n != "content-length")
                .collect(),
            lengths: lengths(response.headers()),
            body: Bytes::new(),
            trailers: None,
            reusable: false,
        }
    }

    /// What ours read, as the proxy reads it: a length beside a transfer coding, which does not
    /// describe the body, is not forwarded (`UpstreamFields::forwarded`), and not read here.
    fn of_ours(head: &super::Head) -> Read {
        let mut map = head.fields.as_sent();
        if matches!(head.framing, Framing::Chunked(_) | Framing::UntilClose) {
            map.remove(http::header::CONTENT_LENGTH);
        }
        let reason = head.fields.reason();
        let mut response = Response::new(());
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = map;
        if head.status.canonical_reason().map(str::as_bytes) != Some(reason) {
            response
                .extensions_mut()
                .insert(ReasonPhrase::try_from(reason).unwrap());
        }
        Read::of(&response)
    }

    fn frame(&mut self, frame: Frame<Bytes>) {
        match frame.into_data() {
            Ok(data) => {
                let mut body = Vec::from(std::mem::take(&mut self.body));
                body.extend_from_slice(&data);
                self.body = Bytes::from(body);
            }
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    self.trailers = Some(fields(&t));
                }
            }
        }
    }
}

/// The distinct elements of the `content-length` fields.
fn lengths(map: &HeaderMap) -> Vec<String> {
    let mut all = Vec::new();
    for v in map.get_all(http::header::CONTENT_LENGTH) {
        let v = String::from_utf8_lossy(v.as_bytes());
        all.extend(v.split(',').map(|p| p.trim().to_owned()));
    }
    all.sort();
    all.dedup();
    all
}

fn fields(map: &HeaderMap) -> Vec<(String, Bytes)> {
    map.iter()
        .map(|(n, v)| (n.as_str().to_owned(), Bytes::copy_from_slice(v.as_bytes())))
        .collect()
}

/// A server for one connection: it reads the request head, writes `wire` in pieces of `cuts`
/// (each flushed, the task yielding between them), then closes or waits for the client's close.
async fn serve(wire: Arc<Vec<u8>>, cuts: Vec<usize>, close: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&b[..n]),
            }
        }
        let mut rest = &wire[..];
        let mut i = 0;
        while !rest.is_empty() {
            let n = cuts
                .get(i % cuts.len().max(1))
                .copied()
                .unwrap_or(rest.len());
            let (piece, tail) = rest.split_at(n.min(rest.len()));
            if s.write_all(piece).await.is_err() || s.flush().await.is_err() {
                return;
            }
            rest = tail;
            i += 1;
            tokio::task::yield_now().await;
        }
        if close {
            let _ = s.shutdown().await;
        } else {
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
        }
    });
    addr
}

/// The response as the proxy's reader reads it; reusable as the pool decides (the head allows
/// it, the body ended, nothing was read past it).
async fn ours(addr: SocketAddr, method: &Method) -> Result<Read, String> {
    let s = TcpStream::connect(addr).await.unwrap();
    let mut c = H1Conn::new(TokioIo::new(s));
    let req = Request::builder()
        .method(method.clone())
        .uri("/")
        .header("host", "up")
        .body(())
        .unwrap();
    let mut head = c
        .send(encode_head(&req, 0), Bytes::new(), method)
        .await
        .map_err(|e| format!("head: {}", e.error))?;
    let mut read = Read::of_ours(&head);
    while let Some(frame) = poll_fn(|cx| c.poll_body(&mut head.framing, cx)).await {
        read.frame(frame.map_err(|e| format!("body: {e}"))?);
    }
    read.reusable = head.reusable && c.is_clean();
    Ok(read)
}

/// The response as hyper's client reads it; reusable if its connection is ready for another
/// request once the body is over (rather than closed).
async fn hypers(addr: SocketAddr, method: &Method) -> Result<Read, String> {
    let io = TokioIo::new(TcpStream::connect(addr).await.unwrap());
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(io)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let driver = tokio::spawn(conn);
    let req = Request::builder()
        .method(method.clone())
        .uri("/")
        .header("host", "up")
        .body(Empty::new())
        .unwrap();
    let response = sender
        .send_request(req)
        .await
        .map_err(|e| format!("head: {e:?}"))?;
    let mut read = Read::of(&response);
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        read.frame(frame.map_err(|e| format!("body: {e:?}"))?);
    }
    // Either way this settles as soon as hyper's connection task has seen the end of the
    // body; the bound only turns a hang into a failure.
    read.reusable = tokio::time::timeout(Duration::from_secs(10), sender.ready())
        .await
        .expect("hyper's connection neither became ready nor closed")
        .is_ok();
    drop(sender);
    let _ = driver.await;
    Ok(read)
}

/// Where ours may differ from hyper and still be right.
#[derive(Debug, Clone, Copy, Default)]
struct Leeway {
    /// Ours may not keep a connection hyper keeps ([`ours_may_close`]).
    may_close: bool,
    /// Ours may drop the `content-length` (beside a `transfer-encoding`, see [`Read::lengths`]).
    may_drop_length: bool,
}

/// The two readings agree, or ours is the stricter in an allowed way (see the module's doc).
fn judge(
    leeway: Leeway,
    ours: Result<Read, String>,
    hyper: Result<Read, String>,
) -> Result<(), String> {
    match (ours, hyper) {
        (Ok(mut o), Ok(h)) => {
            if leeway.may_close && !o.reusable {
                o.reusable = h.reusable;
            }
            if leeway.may_drop_length && o.lengths.is_empty() {
                o.lengths.clone_from(&h.lengths);
            }
            if o == h {
                Ok(())
            } else {
                Err(format!(
                    "the readers disagree\n ours:  {o:?}\n hyper: {h:?}"
                ))
            }
        }
        (Err(_), Err(_)) => Ok(()),
        (Err(o), Ok(h)) => Err(format!("ours refused what hyper read: {o}\n hyper: {h:?}")),
        (Ok(o), Err(h)) => Err(format!("ours read what hyper refused: {h}\n ours: {o:?}")),
    }
}

/// Both readers on `wire`, written in pieces of `cuts` and followed by a close if `close`,
/// each over its own connection, in one runtime.
fn both(
    wire: Vec<u8>,
    cuts: &[usize],
    close: bool,
    method: &Method,
) -> (Result<Read, String>, Result<Read, String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let wire = Arc::new(wire);
        let a = serve(Arc::clone(&wire), cuts.to_vec(), close).await;
        let ours = ours(a, method).await;
        let b = serve(wire, cuts.to_vec(), close).await;
        (ours, hypers(b, method).await)
    })
}

proptest! {
    // Each case is two loopback connections in a fresh runtime: a few milliseconds.
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn ours_reads_what_hyper_reads(case in case()) {
        let wire = case.wire();
        let (o, h) = both(wire.clone(), &case.cuts, case.server_closes(), &case.method());
        let leeway = Leeway {
            may_close: ours_may_close(&case),
            may_drop_length: case.has_transfer_encoding(),
        };
        if let Err(e) = judge(leeway, o, h) {
            prop_assert!(false, "{e}\n wire: {:?}", Bytes::from(wire));
        }
    }
}

/// Where ours once differed from hyper, each now read as hyper reads it: six malformed framings
/// hyper refuses (the generator writes valid responses, so these are listed here), and two
/// differences the generated test found.
#[test]
fn ours_agrees_with_hyper_where_it_once_did_not() {
    // (what, the response, whether the server closes after it)
    let cases: &[(&str, &[u8], bool)] = &[
        (
            "HTTP/1.0 with transfer-encoding (RFC 9112 §6.1)",
            b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
            true,
        ),
        (
            "content-length with a sign (RFC 9110 §8.6: 1*DIGIT)",
            b"HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\nhello",
            true,
        ),
        (
            "a chunk-size line with junk after the size (RFC 9112 §7.1)",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5 junk\r\nhello\r\n0\r\n\r\n",
            true,
        ),
        (
            "a chunk-size line ended by a bare LF (RFC 9112 §7.1)",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
            true,
        ),
        (
            "a chunk extension ended by a bare LF (RFC 9112 §7.1.1)",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;a=b\nhello\r\n0\r\n\r\n",
            true,
        ),
        (
            "chunk data followed by a bare LF (RFC 9112 §7.1)",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n",
            true,
        ),
        (
            "HTTP/1.0 with connection: keep-alive, close (RFC 9112 §9.3: close wins)",
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 1\r\n\r\na",
            true,
        ),
        (
            "HTTP/1.0 with connection: keep-alive and connection: close (RFC 9112 §9.3)",
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\nconnection: close\r\ncontent-length: 1\r\n\r\na",
            true,
        ),
        (
            "a chunk size of 17 hex digits, leading zeros (RFC 9112 §7.1: 1*HEXDIG)",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n00000000000000001\r\na\r\n0\r\n\r\n",
            false,
        ),
    ];
    let mut failures = Vec::new();
    for (what, wire, close) in cases {
        let (o, h) = both(wire.to_vec(), &[], *close, &Method::GET);
        if let Err(e) = judge(Leeway::default(), o, h) {
            failures.push(format!("{what}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Answers without a body in HTTP/1.0 with a transfer-encoding: once refused by ours, read by
/// hyper as bodiless (RFC 9112 §6.3 rule 1 comes before the transfer-encoding rules).
#[test]
fn bodiless_http10_answers_with_transfer_encoding_are_read_as_hyper_reads_them() {
    // (what, the response, whether the server closes after it, the request's method)
    let cases: &[(&str, &[u8], bool, Method)] = &[
        (
            "a HEAD answered in HTTP/1.0 with transfer-encoding (RFC 9112 §6.3 rule 1, §6.1)",
            b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            true,
            Method::HEAD,
        ),
        (
            "a 204 in HTTP/1.0 with transfer-encoding (RFC 9112 §6.3 rule 1, §6.1)",
            b"HTTP/1.0 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n",
            true,
            Method::GET,
        ),
        (
            "a 304 in HTTP/1.0 with transfer-encoding (RFC 9112 §6.3 rule 1, §6.1)",
            b"HTTP/1.0 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
            true,
            Method::GET,
        ),
    ];
    let mut failures = Vec::new();
    for (what, wire, close, method) in cases {
        let (o, h) = both(wire.to_vec(), &[], *close, method);
        if let Err(e) = judge(Leeway::default(), o, h) {
            failures.push(format!("{what}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
