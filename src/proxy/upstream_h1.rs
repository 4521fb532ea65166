//! One HTTP/1.1 client connection to an upstream replica, read and written directly by the task
//! that serves the client: the request is written from that task, and the response head and body
//! are read from the socket into one buffer, each body frame a slice of it.
//!
//! Why not hyper's client connection: hyper reads the socket in its connection future and hands
//! each body frame to the response body through a channel. Driving that future from the client's
//! own task (the previous design) still cost a channel hand-off per frame and kept a dispatch
//! channel and two 8 KiB buffers per connection (`benches/RESULTS.md`, "Round 3, eighth
//! session"). Parsing is not ours: heads and trailers are parsed by `httparse`, hyper's own
//! parser. What is ours is the framing of RFC 9112 §6.3 and §7.1 (content length, chunked, read
//! until close) and the keep-alive rules, which the tests in `upstream_h1_tests.rs` hold to.

use std::future::poll_fn;
use std::io::{self, Write as _};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::Frame;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use super::headers::list_elements;

/// Most header fields a response head (or a trailer section) may have, as hyper allows.
const MAX_HEADERS: usize = 128;
/// Longest response head (or chunk-size line plus trailers) read before it is refused.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Longest chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 4096;
/// A read is made with at least this much room; below it the buffer grows by the read step.
const MIN_READ: usize = 1024;
/// What the buffer first grows by. One SSE event of vLLM's is a few hundred bytes: 2 KiB holds
/// several, and is what an open stream keeps (4 KiB cost 3.6 KiB more RSS per stream at 9,950
/// streams, `benches/RESULTS.md`, for no measurable CPU).
const READ_STEP: usize = 2048;
/// The largest read step. A read that fills a whole step doubles the step up to this, so a
/// large body (embeddings, a long non-streamed answer) is read in a few system calls, as hyper's
/// adaptive reads do; small reads halve it again.
const MAX_READ_STEP: usize = 64 * 1024;

/// Why a response could not be read.
#[derive(Debug, thiserror::Error)]
pub enum H1Error {
    /// The socket failed.
    #[error("upstream connection failed")]
    Io(#[from] io::Error),
    /// The upstream closed the connection before the message was complete.
    #[error("upstream closed the connection mid-message")]
    Incomplete,
    /// The upstream sent what is not HTTP/1.1.
    #[error("invalid response from the upstream: {0}")]
    Invalid(&'static str),
}

/// How the rest of a response body is delimited, and how far it has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `content-length`: this many bytes are left.
    Length(u64),
    /// `transfer-encoding: chunked`, at this step.
    Chunked(Chunk),
    /// Neither: the body ends when the upstream closes the connection.
    UntilClose,
    /// The body is over.
    Done,
}

/// Where a chunked body's reading stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, with this many bytes left.
    Data(u64),
    /// After a chunk's data, before its CRLF.
    DataEnd,
    /// After the last chunk, before the trailer section and its empty line.
    Trailers,
}

/// A response head as read: the response, how its body is framed, and whether the connection
/// may carry another request once the body is over.
#[derive(Debug)]
pub struct Head {
    /// Status, version, headers (as sent, framing headers included) and, for a reason phrase
    /// that is not the status's canonical one, a [`hyper::ext::ReasonPhrase`] extension.
    pub response: Response<()>,
    /// How the body is delimited.
    pub framing: Framing,
    /// The connection may be kept once the body has been read to its end.
    pub reusable: bool,
}

/// One client connection: the transport and what has been read from it but not used yet.
pub struct H1Conn<T> {
    io: TokioIo<T>,
    buf: BytesMut,
    /// What the buffer grows by when it has less than [`MIN_READ`] free.
    read_step: usize,
}

impl<T> H1Conn<T>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin,
{
    /// A connection over `io`, nothing read yet.
    pub fn new(io: T) -> H1Conn<T> {
        H1Conn {
            io: TokioIo::new(io),
            buf: BytesMut::new(),
            read_step: READ_STEP,
        }
    }

    /// Writes the head and body of a request and flushes them.
    pub async fn write_request(&mut self, head: Bytes, body: Bytes) -> io::Result<()> {
        let mut both = head.chain(body);
        self.io.write_all_buf(&mut both).await?;
        self.io.flush().await
    }

    /// Reads the head of the response to a `method` request. Interim (1xx) responses are read
    /// past, as hyper's client does, except `101 Switching Protocols`.
    pub async fn read_head(&mut self, method: &Method) -> Result<Head, H1Error> {
        loop {
            let response = poll_fn(|cx| self.poll_parse_head(cx)).await?;
            let status = response.status();
            if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
                continue;
            }
            return frame_head(response, method);
        }
    }

    fn poll_parse_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Response<()>, H1Error>> {
        loop {
            if !self.buf.is_empty() {
                if let Some(response) = parse_head(&mut self.buf)? {
                    return Poll::Ready(Ok(response));
                }
                if self.buf.len() >= MAX_HEAD_BYTES {
                    return Poll::Ready(Err(H1Error::Invalid("response head too large")));
                }
            }
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(Err(H1Error::Incomplete));
            }
        }
    }

    /// The next frame of a body framed by `framing`, which it advances: a data frame, the
    /// trailers, or `None` at the end.
    pub fn poll_body(
        &mut self,
        framing: &mut Framing,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, H1Error>>> {
        loop {
            match *framing {
                Framing::Done => return Poll::Ready(None),
                Framing::Length(left) => {
                    let (data, left) = ready!(self.poll_data(left, cx))?;
                    *framing = if left == 0 {
                        Framing::Done
                    } else {
                        Framing::Length(left)
                    };
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::UntilClose => {
                    if self.buf.is_empty() && ready!(self.poll_fill(cx))? == 0 {
                        *framing = Framing::Done;
                        return Poll::Ready(None);
                    }
                    let data = self.buf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Framing::Chunked(step) => {
                    if let Some(frame) = ready!(self.poll_chunked(step, framing, cx))? {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                }
            }
        }
    }

    /// Advances a chunked body by one step; a frame if the step gave one.
    fn poll_chunked(
        &mut self,
        step: Chunk,
        framing: &mut Framing,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Frame<Bytes>>, H1Error>> {
        match step {
            Chunk::Size => {
                let (end, used) = ready!(self.poll_line(MAX_CHUNK_LINE, cx))?;
                let size = chunk_size(&self.buf[..end])?;
                self.buf.advance(used);
                *framing = Framing::Chunked(if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                });
                Poll::Ready(Ok(None))
            }
            Chunk::Data(left) => {
                let (data, left) = ready!(self.poll_data(left, cx))?;
                *framing = Framing::Chunked(if left == 0 {
                    Chunk::DataEnd
                } else {
                    Chunk::Data(left)
                });
                Poll::Ready(Ok(Some(Frame::data(data))))
            }
            Chunk::DataEnd => {
                // Most often the CRLF came with the data: no line search.
                if self.buf.starts_with(b"\r\n") {
                    self.buf.advance(2);
                } else {
                    let (end, used) = ready!(self.poll_line(2, cx))?;
                    if end != 0 {
                        return Poll::Ready(Err(H1Error::Invalid(
                            "chunk data longer than its size",
                        )));
                    }
                    self.buf.advance(used);
                }
                *framing = Framing::Chunked(Chunk::Size);
                Poll::Ready(Ok(None))
            }
            Chunk::Trailers => {
                let trailers = ready!(self.poll_trailers(cx))?;
                *framing = Framing::Done;
                Poll::Ready(Ok(trailers.map(Frame::trailers)))
            }
        }
    }

    /// The trailer section after the last chunk, up to its empty line; `None` when it is empty.
    fn poll_trailers(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<HeaderMap>, H1Error>> {
        loop {
            if self.buf.starts_with(b"\r\n") || self.buf.starts_with(b"\n") {
                let n = if self.buf[0] == b'\r' { 2 } else { 1 };
                self.buf.advance(n);
                return Poll::Ready(Ok(None));
            }
            if !self.buf.is_empty() {
                let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
                match httparse::parse_headers(&self.buf, &mut fields) {
                    Ok(httparse::Status::Complete((n, fields))) => {
                        let map = header_map(fields)?;
                        self.buf.advance(n);
                        return Poll::Ready(Ok(Some(map)));
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() < MAX_HEAD_BYTES => {}
                    Ok(httparse::Status::Partial) => {
                        return Poll::Ready(Err(H1Error::Invalid("trailer section too large")));
                    }
                    Err(_) => return Poll::Ready(Err(H1Error::Invalid("malformed trailers"))),
                }
            }
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(Err(H1Error::Incomplete));
            }
        }
    }

    /// Waits for a whole line at the start of the buffer; its length without the line ending,
    /// and with it. Refused past `max` bytes. The caller reads the line in place and advances
    /// past it: no slice of the buffer is made for it. Inlined: it runs once or twice per chunk,
    /// and a call costs about as much as the search.
    #[inline]
    fn poll_line(
        &mut self,
        max: usize,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(usize, usize), H1Error>> {
        loop {
            // A chunk-size line is a few bytes: a plain search beats memchr's set-up.
            let window = &self.buf[..self.buf.len().min(max + 1)];
            if let Some(lf) = window.iter().position(|&b| b == b'\n') {
                let end = if lf > 0 && self.buf[lf - 1] == b'\r' {
                    lf - 1
                } else {
                    lf
                };
                return Poll::Ready(Ok((end, lf + 1)));
            }
            if self.buf.len() > max {
                return Poll::Ready(Err(H1Error::Invalid("chunk-size line too long")));
            }
            if ready!(self.poll_fill(cx))? == 0 {
                return Poll::Ready(Err(H1Error::Incomplete));
            }
        }
    }

    /// Up to `left` bytes of a body whose end is that far, as one frame that shares the buffer
    /// (read first if the buffer is empty), and how many are left after it.
    fn poll_data(
        &mut self,
        left: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Bytes, u64), H1Error>> {
        if self.buf.is_empty() && ready!(self.poll_fill(cx))? == 0 {
            return Poll::Ready(Err(H1Error::Incomplete));
        }
        let n = usize::try_from(left).map_or(self.buf.len(), |l| l.min(self.buf.len()));
        let data = self.buf.split_to(n).freeze();
        Poll::Ready(Ok((data, left - n as u64)))
    }

    /// Reads what the socket has into the buffer; how many bytes (0 at the end of the stream).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < MIN_READ {
            self.buf.reserve(self.read_step);
        }
        let room = self.buf.capacity() - self.buf.len();
        let n = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.buf
        ))?;
        // A full read of a whole step: the upstream sends faster than a step reads. A read of
        // under a quarter step (a stream's events): back towards the first step, so a burst
        // does not leave a stream's later reads large.
        if n == room && room >= self.read_step && self.read_step < MAX_READ_STEP {
            self.read_step *= 2;
        } else if n < self.read_step / 4 && self.read_step > READ_STEP {
            self.read_step /= 2;
        }
        Poll::Ready(Ok(n))
    }

    /// What the buffer grows by now (for the tests).
    #[cfg(test)]
    fn read_step(&self) -> usize {
        self.read_step
    }

    /// For a connection between requests: whether it is still open. Reading registers `cx` to be
    /// woken when the socket stirs. Anything the upstream sends unasked, or its close, or an
    /// error, makes the connection unusable.
    pub fn poll_idle(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        matches!(self.poll_fill(cx), Poll::Pending)
    }

    /// Nothing was read past the end of the last response.
    pub fn is_clean(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Parses a complete head at the start of `buf` and takes it off; `None` while it is partial.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Response<()>>, H1Error> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut fields);
    let n = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(H1Error::Invalid("too many response header fields"))
        }
        Err(_) => return Err(H1Error::Invalid("malformed response head")),
    };
    let status = parsed
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(H1Error::Invalid("invalid status code"))?;
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.version_mut() = version;
    *response.headers_mut() = header_map(parsed.headers)?;
    let reason = parsed.reason.unwrap_or("");
    if status.canonical_reason() != Some(reason) {
        if let Ok(r) = hyper::ext::ReasonPhrase::try_from(reason.as_bytes()) {
            response.extensions_mut().insert(r);
        }
    }
    buf.advance(n);
    Ok(Some(response))
}

/// The header fields of a head or trailer section as a map, in order.
fn header_map(fields: &[httparse::Header<'_>]) -> Result<HeaderMap, H1Error> {
    let mut map = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name = HeaderName::from_bytes(f.name.as_bytes())
            .map_err(|_| H1Error::Invalid("invalid header name"))?;
        let value = HeaderValue::from_bytes(f.value)
            .map_err(|_| H1Error::Invalid("invalid header value"))?;
        map.append(name, value);
    }
    Ok(map)
}

/// How the body of `response` to a `method` request is framed (RFC 9112 §6.3), and whether its
/// connection may be kept. An invalid `content-length` leaves the body's end unknown: the
/// response is refused, as §6.3 tells a user agent to.
fn frame_head(response: Response<()>, method: &Method) -> Result<Head, H1Error> {
    let headers = response.headers();
    let status = response.status();
    let keep_alive = if response.version() == Version::HTTP_10 {
        has_token(headers, &header::CONNECTION, "keep-alive")
    } else {
        !has_token(headers, &header::CONNECTION, "close")
    };
    let (framing, reusable) = if status == StatusCode::SWITCHING_PROTOCOLS {
        (Framing::Done, false)
    } else if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        (Framing::Done, keep_alive)
    } else if headers.contains_key(header::TRANSFER_ENCODING) {
        if last_coding_is_chunked(headers) {
            // With a length beside it, or in HTTP/1.0, the framing is suspect (§6.1): the
            // chunks are read, the connection is not kept.
            let suspect = headers.contains_key(header::CONTENT_LENGTH)
                || response.version() == Version::HTTP_10;
            (Framing::Chunked(Chunk::Size), keep_alive && !suspect)
        } else {
            (Framing::UntilClose, false)
        }
    } else {
        match content_length(headers) {
            Ok(Some(0)) => (Framing::Done, keep_alive),
            Ok(Some(n)) => (Framing::Length(n), keep_alive),
            Ok(None) => (Framing::UntilClose, false),
            Err(()) => return Err(H1Error::Invalid("invalid content-length")),
        }
    };
    Ok(Head {
        response,
        framing,
        reusable,
    })
}

/// The `content-length`, if any; `Err` if its values are invalid or disagree.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, ()> {
    let mut length = None;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        for part in v.to_str().map_err(|_| ())?.split(',') {
            let n: u64 = part.trim().parse().map_err(|_| ())?;
            if length.is_some_and(|l| l != n) {
                return Err(());
            }
            length = Some(n);
        }
    }
    Ok(length)
}

/// Whether the last transfer coding named is `chunked`.
fn last_coding_is_chunked(headers: &HeaderMap) -> bool {
    list_elements(headers, &header::TRANSFER_ENCODING)
        .next_back()
        .is_some_and(|c| c.eq_ignore_ascii_case("chunked"))
}

/// Whether a comma-separated header lists `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    list_elements(headers, name).any(|t| t.eq_ignore_ascii_case(token))
}

/// The size of a chunk from its size line (`hex[;extensions]`).
fn chunk_size(line: &[u8]) -> Result<u64, H1Error> {
    let digits = line
        .iter()
        .position(|&b| b == b';' || b == b' ' || b == b'\t')
        .map_or(line, |end| &line[..end]);
    if digits.is_empty() || digits.len() > 16 {
        return Err(H1Error::Invalid("invalid chunk size"));
    }
    let mut size = 0u64;
    for &b in digits {
        let d = char::from(b)
            .to_digit(16)
            .ok_or(H1Error::Invalid("invalid chunk size"))?;
        size = size << 4 | u64::from(d);
    }
    Ok(size)
}

/// The head of `req` as HTTP/1.1 bytes, for a body of `body_len` bytes. The request's own
/// framing headers are replaced: the body is whole, so it is sent with its exact length, as
/// hyper's client sends a whole body. An empty body gets `content-length: 0` only when the
/// client sent a length.
pub fn encode_head<B>(req: &Request<B>, body_len: usize) -> Bytes {
    let path = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let headers = req.headers();
    let mut size = req.method().as_str().len() + path.len() + 40;
    for (name, value) in headers {
        size += name.as_str().len() + value.len() + 4;
    }
    let mut head = Vec::with_capacity(size);
    head.extend_from_slice(req.method().as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(path.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    let mut had_length = false;
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            had_length |= name == header::CONTENT_LENGTH;
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || had_length {
        // Writing to a Vec cannot fail.
        let _ = write!(head, "content-length: {body_len}\r\n");
    }
    head.extend_from_slice(b"\r\n");
    Bytes::from(head)
}

#[cfg(test)]
#[path = "upstream_h1_tests.rs"]
mod tests;
