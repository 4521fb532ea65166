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

use super::{encode_head, H1Conn};

/// How a generated body is delimited on the wire.
#[derive(Debug, Clone)]
enum Body {
    /// By `content-length`, written in one of five ways (see [`Case::wire`]).
    Length { data: Vec<u8>, form: u8 },
    /// By `transfer-encoding` with `chunked` last, named in one of four ways (see
    /// [`Case::wire`]); with `stray_length`, a `content-length` beside it.
    Chunked {
        chunks: Vec<Chunk>,
        trailers: Vec<(String, String)>,
        te: u8,
        stray_length: bool,
    },
    /// By the close of the connection; with `gzip`, under `transfer-encoding: gzip` (a coding
    /// other than chunked last: read until the close, RFC 9112 §6.3 rule 4).
    Close { data: Vec<u8>, gzip: bool },
}

/// One chunk: its data, an extension (or whitespace) after its size, and how the size is
/// written (leading zeros, upper-case hex digits).
#[derive(Debug, Clone)]
struct Chunk {
    data: Vec<u8>,
    ext: &'static str,
    zeros: usize,
    upper: bool,
}

/// A generated response and how it is sent.
#[derive(Debug, Clone)]
struct Case {
    /// The request is a HEAD (else a GET).
    head: bool,
    http10: bool,
    /// Interim responses before the final one (HTTP/1.1 only: 1xx is not HTTP/1.0's).
    interim: Vec<u16>,
    status: u16,
    /// A reason phrase other than the canonical one.
    reason: Option<&'static str>,
    fields: Vec<(String, String)>,
    connection: Option<&'static str>,
    body: Body,
    /// The sizes of the writes, in turn (none: one write).
    cuts: Vec<usize>,
}

impl Case {
    fn method(&self) -> Method {
        if self.head {
            Method::HEAD
        } else {
            Method::GET
        }
    }

    /// The response has no body whatever its framing fields say (RFC 9112 §6.3 rules 1-2).
    fn bodiless(&self) -> bool {
        self.head || self.status == 204 || self.status == 304
    }

    /// The bytes on the wire.
    fn wire(&self) -> Vec<u8> {
        let mut w = Vec::new();
        for code in &self.interim {
            w.extend_from_slice(format!("HTTP/1.1 {code} Interim\r\n").as_bytes());
            if *code == 103 {
                w.extend_from_slice(b"link: </style.css>; rel=preload\r\n");
            }
            w.extend_from_slice(b"\r\n");
        }
        let canonical = http::StatusCode::from_u16(self.status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        let version = if self.http10 { "1.0" } else { "1.1" };
        let reason = self.reason.unwrap_or(canonical);
        w.extend_from_slice(format!("HTTP/{version} {} {reason}\r\n", self.status).as_bytes());
        for (name, value) in &self.fields {
            w.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
        }
        if let Some(c) = self.connection {
            w.extend_from_slice(format!("Connection: {c}\r\n").as_bytes());
        }
        let body = match &self.body {
            Body::Length { data, form } => {
                let n = data.len();
                let field = match form % 5 {
                    0 => format!("content-length: {n}\r\n"),
                    1 => format!("Content-Length: {n}, {n}\r\n"),
                    2 => format!("content-length: {n}\r\ncontent-length: {n}\r\n"),
                    3 => format!("content-length:   {n}  \r\n"),
                    _ => format!("content-length: 00{n}\r\n"),
                };
                w.extend_from_slice(field.as_bytes());
                data.clone()
            }
            Body::Chunked {
                chunks,
                trailers,
                te,
                stray_length,
            } => {
                w.extend_from_slice(match te % 4 {
                    0 => &b"Transfer-Encoding: chunked\r\n"[..],
                    1 => b"transfer-encoding: Chunked\r\n",
                    2 => b"Transfer-Encoding: gzip, chunked\r\n",
                    _ => b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
                });
                if *stray_length {
                    w.extend_from_slice(b"content-length: 3\r\n");
                }
                let mut b = Vec::new();
                for c in chunks {
                    let size = if c.upper {
                        format!("{:X}", c.data.len())
                    } else {
                        format!("{:x}", c.data.len())
                    };
                    b.extend_from_slice(
                        format!("{}{size}{}\r\n", "0".repeat(c.zeros), c.ext).as_bytes(),
                    );
                    b.extend_from_slice(&c.data);
                    b.extend_from_slice(b"\r\n");
                }
                b.extend_from_slice(b"0\r\n");
                for (name, value) in trailers {
                    b.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
                b.extend_from_slice(b"\r\n");
                b
            }
            Body::Close { data, gzip } => {
                if *gzip {
                    w.extend_from_slice(b"Transfer-Encoding: gzip\r\n");
                }
                data.clone()
            }
        };
        w.extend_from_slice(b"\r\n");
        if !self.bodiless() {
            w.extend_from_slice(&body);
        }
        w
    }

    /// The server closes after the response when the response does not keep the connection
    /// (RFC 9112 §9.3), or its body runs to the close. Otherwise it keeps the socket open until
    /// the client closes it: a close right after a kept-alive response would race hyper's check
    /// of its connection.
    fn server_closes(&self) -> bool {
        let tokens: Vec<String> = self
            .connection
            .unwrap_or("")
            .split(',')
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        let close = tokens.iter().any(|t| t == "close");
        let keep = tokens.iter().any(|t| t == "keep-alive");
        let persistent = !close && (!self.http10 || keep);
        let to_close = matches!(self.body, Body::Close { .. }) && !self.bodiless();
        !persistent || to_close || (self.http10 && self.transfer_coded())
    }

    /// The response has a `transfer-encoding` field.
    fn has_transfer_encoding(&self) -> bool {
        matches!(
            self.body,
            Body::Chunked { .. } | Body::Close { gzip: true, .. }
        )
    }

    /// The response has a `transfer-encoding` field and a body it would frame.
    fn transfer_coded(&self) -> bool {
        !self.bodiless() && self.has_transfer_encoding()
    }
}

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
    let mut read = Read::of(&head.response);
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

/// Where ours may keep fewer connections than hyper: a chunked response with a
/// `content-length` beside it, which RFC 9112 §6.3 (rule 3) says "ought to be handled as an
/// error" (ours reads it by its chunks but does not keep the connection, hyper keeps it); and an
/// HTTP/1.0 response with `transfer-encoding`, after which §6.1 says to "close the connection
/// after processing the message" (hyper keeps a bodiless one that asks for keep-alive).
fn ours_may_close(case: &Case) -> bool {
    let stray_length = matches!(
        case.body,
        Body::Chunked {
            stray_length: true,
            ..
        }
    );
    (stray_length && !case.bodiless()) || (case.http10 && case.has_transfer_encoding())
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

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Field names and values as servers send them: visible ASCII, inner spaces, mixed case.
fn field() -> impl Strategy<Value = (String, String)> {
    (
        prop_oneof![
            "x-[a-z0-9-]{1,8}",
            Just("Content-Type".to_owned()),
            Just("server".to_owned()),
            Just("Vary".to_owned()),
        ],
        "[!-~]([ -~]{0,16}[!-~])?",
    )
}

fn chunk() -> impl Strategy<Value = Chunk> {
    (
        proptest::collection::vec(any::<u8>(), 1..48),
        prop_oneof![
            4 => Just(""),
            1 => Just(";a=b"),
            1 => Just(";flag"),
            1 => Just(";q=\"x; y\""),
            1 => Just(" ;sp=1"),
            1 => Just("\t;tab"),
            1 => Just(" "),
        ],
        prop_oneof![8 => 0usize..3, 1 => 14usize..17],
        any::<bool>(),
    )
        .prop_map(|(data, ext, zeros, upper)| Chunk {
            data,
            ext,
            zeros,
            upper,
        })
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        (bytes(200), any::<u8>()).prop_map(|(data, form)| Body::Length { data, form }),
        (
            proptest::collection::vec(chunk(), 0..5),
            proptest::collection::vec(("x-t[a-z]{0,4}", "[!-~]{1,12}"), 0..3),
            any::<u8>(),
            prop::bool::weighted(0.15),
        )
            .prop_map(|(chunks, trailers, te, stray_length)| Body::Chunked {
                chunks,
                trailers,
                te,
                stray_length,
            }),
        (bytes(200), prop::bool::weighted(0.2)).prop_map(|(data, gzip)| Body::Close { data, gzip }),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.25),
        proptest::collection::vec(prop_oneof![Just(100u16), Just(102), Just(103)], 0..3),
        prop_oneof![
            6 => Just(200u16),
            1 => Just(201),
            2 => Just(204),
            1 => Just(206),
            2 => Just(304),
            1 => Just(404),
            1 => Just(429),
            1 => Just(503),
        ],
        prop_oneof![
            4 => Just(None),
            1 => Just(Some("")),
            1 => Just(Some("Fine Thanks")),
        ],
        proptest::collection::vec(field(), 0..4),
        prop_oneof![
            3 => Just(None),
            1 => Just(Some("close")),
            1 => Just(Some("keep-alive")),
            1 => Just(Some("Keep-Alive")),
            1 => Just(Some("keep-alive, close")),
            1 => Just(Some("x-option, Close")),
        ],
        body(),
        proptest::collection::vec(1usize..40, 0..6),
    )
        .prop_map(
            |(head, http10, interim, status, reason, fields, connection, body, cuts)| Case {
                head,
                http10,
                interim: if http10 { Vec::new() } else { interim },
                status,
                reason,
                fields,
                connection,
                body,
                cuts,
            },
        )
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
