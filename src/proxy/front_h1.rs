//! The client's HTTP/1.1 connection, served by the proxy itself for the requests agents send: a
//! whole head in what has arrived, keep-alive, and a `Content-Length` body. Such a head is parsed
//! once, here, and handed to `forward::handle` with no server task, body channel or head
//! sniffer in between. The first request that is anything else (a head that arrived in pieces,
//! a chunked body, `Expect`, an upgrade, `Connection: close`, HTTP/1.0, `HEAD`, a head hyper would
//! refuse) hands the connection, with every byte read so far, to hyper's server behind the head
//! sniffer for the rest of its life, as every connection was served before: the refusals, the
//! smuggling checks and their answers stay where they were.
//!
//! Why: with agents' traffic the proxy runs cold, and hyper's server (its dispatcher, its body
//! channel and timer, the sniffer's second parse of each head) was about half of what tokenmeter
//! added over nginx on the way to the upstream (docs/performance.md, issue 37).
//!
//! What hyper's server did that this keeps: the head read timeout (also on an idle keep-alive
//! connection), a client's close seen while the upstream works or streams (the handler is
//! dropped, which cancels the upstream request), the response's framing as hyper writes it
//! (RFC 9112 §6: `content-length` when the body's length is known, else chunked; none for 204
//! and 304), a `date` header when the response has none, a close after a response that says
//! `connection: close`, and the graceful stop (an idle connection closes, one in flight closes
//! after its response). Unlike hyper's server, it writes the upstream's fields as the upstream
//! sent them, in its order and spelling (`upstream_fields.rs`), with no `HeaderMap` in between.

use std::future::{poll_fn, Future};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{oneshot, watch};

use super::client_body::ClientBody;
use super::headers::{list_tokens, write_field, write_length};
use super::pacemaker::Activity;
use super::upstream_fields::Forwarded;
use super::{forward, ProxyBody, ProxyState};

/// Headers parsed per head: hyper's limit (a head with more is hyper's to refuse).
const MAX_HEADERS: usize = 100;

/// Bytes asked of the socket per read.
const READ_BYTES: usize = 8192;

/// What one connection needs from its serving thread.
pub(super) struct Front {
    /// The proxy.
    pub state: Arc<ProxyState>,
    /// The client's address.
    pub remote: SocketAddr,
    /// Becomes true when the proxy stops: no new request is taken.
    pub stop: watch::Receiver<bool>,
    /// The serving thread's request count (its pacemaker's).
    pub activity: Arc<Activity>,
}

/// Serves `io` until the client closes, a timeout or the stop; or hands it to `hand_over`
/// (hyper's server) at the first request this module does not serve, with the bytes of that
/// request read so far and the connection's `Front` back.
pub(super) async fn serve<S, F, Fut>(mut io: S, mut front: Front, hand_over: F)
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(S, Bytes, Front) -> Fut,
    Fut: Future<Output = ()>,
{
    let cfg = &front.state.config;
    let head_timeout = Duration::from_millis(cfg.timeouts.head_read_ms);
    let (max_head, max_body) = (cfg.max_header_bytes, cfg.max_request_body_bytes);
    let mut buf = BytesMut::with_capacity(READ_BYTES);
    let mut out = Vec::with_capacity(1024);
    let mut spans = Vec::new();
    loop {
        if buf.is_empty() {
            // Between requests: the next head's first bytes, within the head read timeout.
            buf.reserve(READ_BYTES);
            let read = tokio::select! {
                biased;
                r = tokio::io::AsyncReadExt::read_buf(&mut io, &mut buf) => r,
                () = tokio::time::sleep(head_timeout) => return,
                _ = front.stop.wait_for(|stopped| *stopped) => return,
            };
            if !matches!(read, Ok(n) if n > 0) {
                return;
            }
        }
        let (head_len, body_len, method) = match parse(&buf, max_head, max_body, &mut spans) {
            Parsed::Simple {
                head_len,
                body_len,
                method,
            } => (head_len, body_len, method),
            Parsed::Partial | Parsed::Other => {
                return hand_over(io, buf.freeze(), front).await;
            }
        };
        let head = buf.split_to(head_len).freeze();
        let Some(request) = build(&head, method, &spans) else {
            let mut all = BytesMut::from(&head[..]);
            all.extend_from_slice(&buf);
            return hand_over(io, all.freeze(), front).await;
        };
        // The body: whole already (the usual case on loopback), else sent on when it is.
        let mut arriving = None;
        let body = if buf.len() >= body_len {
            ClientBody::Read(Some(buf.split_to(body_len).freeze()))
        } else {
            let (tx, rx) = oneshot::channel();
            buf.reserve(body_len - buf.len());
            arriving = Some(tx);
            ClientBody::Arriving(rx)
        };
        front.activity.request();
        let call = forward::handle(
            front.state.clone(),
            request.map(|()| body),
            front.remote,
            false,
        );
        let mut call = std::pin::pin!(call);
        // The handler runs while the rest of the body arrives and the client is watched.
        let mut body_cut = false;
        let answered = poll_fn(|cx| {
            let body_whole = arriving.is_none();
            if let Some(tx) = arriving.take() {
                match poll_read_to(&mut io, &mut buf, body_len, usize::MAX, cx) {
                    Poll::Ready(true) => {
                        let _ = tx.send(buf.split_to(body_len).freeze());
                    }
                    // The handler reads the cut body as an error and answers for it.
                    Poll::Ready(false) => body_cut = true,
                    Poll::Pending => arriving = Some(tx),
                }
            }
            if let Poll::Ready(response) = call.as_mut().poll(cx) {
                return Poll::Ready(Some(response));
            }
            // Watched after the handler's poll, which sends the request on: the watch's read
            // buffer (a new allocation while the request's bytes are in use) is not on the way.
            if body_whole && !body_cut && client_gone(&mut io, &mut buf, max_head, cx) {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await;
        // Gone while the upstream worked: dropping the handler cancels its upstream request.
        let Some(response) = answered else { return };
        let reusable = arriving.is_none() && !body_cut;
        let keep = respond(&mut io, &mut buf, &mut out, response, max_head).await;
        // A stop that came while this request ran closes the connection after its response.
        if !(keep && reusable) || *front.stop.borrow() {
            let _ = io.shutdown().await;
            return;
        }
    }
}

/// What the bytes at the front of the buffer are.
enum Parsed {
    /// The start of a head.
    Partial,
    /// A request for hyper's server.
    Other,
    /// A request served here; its headers' places are in the spans.
    Simple {
        head_len: usize,
        body_len: usize,
        method: Method,
    },
}

/// Where a header's name and value lie in the head: `(name start, name end, value start, value
/// end)`; the first span is the request target's (its name part empty).
type Span = (usize, usize, usize, usize);

/// Parses the head at the front of `buf`, deciding whether it is served here (RFC 9112 §2-6).
fn parse(buf: &[u8], max_head: usize, max_body: u64, spans: &mut Vec<Span>) -> Parsed {
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) if n <= max_head => n,
        Ok(httparse::Status::Partial) if buf.len() <= max_head => return Parsed::Partial,
        _ => return Parsed::Other,
    };
    if req.version != Some(1) {
        return Parsed::Other;
    }
    let method = match req.method.map(str::as_bytes) {
        None | Some(b"HEAD" | b"CONNECT") => return Parsed::Other,
        Some(m) => match Method::from_bytes(m) {
            Ok(m) => m,
            Err(_) => return Parsed::Other,
        },
    };
    let at = |s: &[u8]| s.as_ptr() as usize - buf.as_ptr() as usize;
    let Some(path) = req.path else {
        return Parsed::Other;
    };
    spans.clear();
    let p = at(path.as_bytes());
    spans.push((0, 0, p, p + path.len()));
    let mut body_len = None;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("content-length") {
            if body_len.is_some() {
                return Parsed::Other;
            }
            match content_length(h.value) {
                Some(n) if n <= max_body => body_len = Some(n),
                _ => return Parsed::Other,
            }
        } else if is("transfer-encoding")
            || is("expect")
            || is("upgrade")
            || (is("connection") && !h.value.eq_ignore_ascii_case(b"keep-alive"))
        {
            return Parsed::Other;
        }
        let (n, v) = (at(name), at(h.value));
        spans.push((n, n + name.len(), v, v + h.value.len()));
    }
    let Ok(body_len) = usize::try_from(body_len.unwrap_or(0)) else {
        return Parsed::Other;
    };
    Parsed::Simple {
        head_len,
        body_len,
        method,
    }
}

/// A `Content-Length` value: one to 19 decimal digits (RFC 9110 §8.6).
fn content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
}

/// The request of a parsed head; `None` when `http` refuses a part of it (hyper's server answers
/// such a head itself).
fn build(head: &Bytes, method: Method, spans: &[Span]) -> Option<Request<()>> {
    let (&(_, _, t0, t1), fields) = spans.split_first()?;
    let uri = http::Uri::from_maybe_shared(head.slice(t0..t1)).ok()?;
    let mut headers = HeaderMap::with_capacity(fields.len());
    for &(n0, n1, v0, v1) in fields {
        let name = HeaderName::from_bytes(&head[n0..n1]).ok()?;
        let value = HeaderValue::from_maybe_shared(head.slice(v0..v1)).ok()?;
        headers.append(name, value);
    }
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    Some(req)
}

/// Reads until `buf` holds `len` bytes, asking for at most `step` bytes of room at a time:
/// `Ready(true)` then, `Ready(false)` when the client closed or failed first.
fn poll_read_to<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    len: usize,
    step: usize,
    cx: &mut Context<'_>,
) -> Poll<bool> {
    while buf.len() < len {
        buf.reserve(step.min(len - buf.len()));
        match tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, buf) {
            Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(false),
            Poll::Ready(Ok(_)) => {}
            Poll::Pending => return Poll::Pending,
        }
    }
    Poll::Ready(true)
}

/// Whether the client closed its connection (or it failed), reading what it sent meanwhile (a
/// pipelined request) into `buf`, up to `cap` bytes; past that it is not watched.
fn client_gone<S: AsyncRead + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    cap: usize,
    cx: &mut Context<'_>,
) -> bool {
    poll_read_to(io, buf, cap, READ_BYTES, cx) == Poll::Ready(false)
}

/// What the response body gave, or that the client went away while it was awaited.
enum Next {
    /// Nothing ready (from a poll that does not wait).
    NotYet,
    /// The client closed its connection.
    Gone,
    /// The body's next frame, or its end.
    Frame(Option<Result<http_body::Frame<Bytes>, super::BoxError>>),
}

/// How the response body is framed on the wire.
enum Framing {
    /// No body is sent (204, 304), whatever the body holds.
    None,
    /// `content-length`: bytes still to send.
    Length(u64),
    /// `transfer-encoding: chunked`.
    Chunked,
}

/// Writes `response` to the client; whether the connection may carry another request.
async fn respond<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    buf: &mut BytesMut,
    out: &mut Vec<u8>,
    response: Response<ProxyBody>,
    cap: usize,
) -> bool {
    let (parts, mut body) = response.into_parts();
    out.clear();
    let (mut framing, last) = encode_head(out, parts.status, &parts.headers, &mut body);
    drop(parts);
    // As hyper's server does: the body is polled until it has nothing ready, what it gave goes
    // out in one write (the head with the first frames when they are there), then the body is
    // awaited. The metered body relies on that order: its first poll after a frame comes before
    // the frame is written (`body.rs`, `Deferred`).
    let mut wait = false;
    loop {
        let next = if matches!(framing, Framing::Length(0) | Framing::None) && body.is_end_stream()
        {
            Next::Frame(None)
        } else if !wait {
            match poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
                Poll::Ready(f) => Next::Frame(f),
                Poll::Pending => Next::NotYet,
            }
        } else {
            poll_fn(|cx| {
                if client_gone(io, buf, cap, cx) {
                    return Poll::Ready(Next::Gone);
                }
                Pin::new(&mut body).poll_frame(cx).map(Next::Frame)
            })
            .await
        };
        wait = false;
        match next {
            Next::NotYet => {
                if !write_out(io, out).await {
                    return false;
                }
                wait = true;
            }
            // Dropping the body cancels the upstream request.
            Next::Gone => return false,
            Next::Frame(None) => {
                if let Framing::Chunked = framing {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
                let complete = !matches!(framing, Framing::Length(n) if n > 0);
                return write_out(io, out).await && complete && !last;
            }
            Next::Frame(Some(Err(_))) => {
                // Cut short, as hyper's server does: what was sent stays, the rest never comes.
                let _ = write_out(io, out).await;
                return false;
            }
            Next::Frame(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers: hyper's server sends none unless asked
                };
                match &mut framing {
                    Framing::None => {}
                    Framing::Length(left) => {
                        if data.len() as u64 > *left {
                            let _ = write_out(io, out).await;
                            return false;
                        }
                        *left -= data.len() as u64;
                        out.extend_from_slice(&data);
                    }
                    Framing::Chunked if data.is_empty() => {}
                    Framing::Chunked => {
                        chunk_size_line(out, data.len());
                        out.extend_from_slice(&data);
                        out.extend_from_slice(b"\r\n");
                    }
                }
            }
        }
    }
}

/// Appends a chunk's size line (RFC 9112 §7.1): the size in hex, CRLF.
fn chunk_size_line(out: &mut Vec<u8>, n: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digits = (usize::BITS - n.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(HEX[(n >> (4 * i)) & 0xf]);
    }
    out.extend_from_slice(b"\r\n");
}

/// Writes and flushes `out`, then empties it; false when the client is gone.
async fn write_out<S: AsyncWrite + Unpin>(io: &mut S, out: &mut Vec<u8>) -> bool {
    let ok = io.write_all(out).await.is_ok() && io.flush().await.is_ok();
    out.clear();
    ok
}

/// Encodes a response head as hyper's server does, the upstream's fields first, as it sent them
/// (`UpstreamFields::forwarded`); returns the body's framing and whether the connection closes
/// after it (`connection: close`).
fn encode_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    body: &mut ProxyBody,
) -> (Framing, bool) {
    let sent = body.take_upstream_fields();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    match &sent {
        Some(f) => out.extend_from_slice(f.reason()),
        None => out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
    }
    out.extend_from_slice(b"\r\n");
    let (has_body, known) = body.sent_length(status);
    let mut framing = None;
    let (mut last, mut dated) = (false, false);
    if let Some(f) = &sent {
        f.forwarded(headers, known, has_body, |name, value| match value {
            Forwarded::Sent(v) => {
                dated |= name.eq_ignore_ascii_case("date");
                write_field(out, name.as_bytes(), v);
            }
            Forwarded::Length(n) => {
                framing = Some(Framing::Length(n));
                write_length(out, name.as_bytes(), n);
            }
        });
    }
    for (name, value) in headers {
        if *name == header::CONTENT_LENGTH {
            if framing.is_some() {
                continue;
            }
            let declared = std::str::from_utf8(value.as_bytes())
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok());
            framing = Some(Framing::Length(known.or(declared).unwrap_or(0)));
        } else if *name == header::TRANSFER_ENCODING {
            framing = Some(Framing::Chunked);
        } else if *name == header::CONNECTION {
            last |= list_tokens(value.as_bytes()).any(|t| t.eq_ignore_ascii_case(b"close"));
        } else if *name == header::DATE {
            dated = true;
        }
        write_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    let framing = match framing {
        _ if !has_body => Framing::None,
        Some(f) => f,
        None => match known {
            Some(n) => {
                write_length(out, b"content-length", n);
                Framing::Length(n)
            }
            None => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
        },
    };
    if !dated {
        out.extend_from_slice(b"date: ");
        http_date(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    (framing, last)
}

/// Appends the current time as an HTTP date (RFC 9110 §5.6.7), formatted once a second per
/// thread, as hyper's server caches it.
fn http_date(out: &mut Vec<u8>) {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let now = std::time::SystemTime::now();
    let second = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != second {
            *at = second;
            *text = httpdate::fmt_http_date(now);
        }
        out.extend_from_slice(text.as_bytes());
    });
}
