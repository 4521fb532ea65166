//! One HTTP/1.1 client connection to an upstream replica, read and written directly by the task
//! that serves the client: the request is written from that task, and the response head and body
//! are read from the socket into one buffer, each body frame a slice of it.
//!
//! Why not hyper's client connection: hyper reads the socket in its connection future and hands
//! each body frame to the response body through a channel. Driving that future from the client's
//! own task (the previous design) still cost a channel hand-off per frame and kept a dispatch
//! channel and two fixed-size buffers per connection (`benches/overhead.rs` and
//! `benches/stream_memory.rs` measure CPU per event and memory per stream). Parsing is not ours: heads and trailers are parsed by `httparse`, hyper's own
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
use tokio::io::AsyncWrite;
#[cfg(test)]
use tokio::io::AsyncWriteExt;

use super::headers::list_elements;

/// Most header fields a response head (or a trailer section) may have, as hyper allows.
const MAX_HEADERS: usize = 128;
/// Longest response head (or chunk-size line plus trailers) read before it is refused.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Longest chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 4096;
/// Most bytes of chunk extensions over one body, as hyper allows: extensions carry nothing the
/// proxy reads, and an upstream that sends them without end must not hold a core.
const MAX_CHUNK_EXTENSION_BYTES: u64 = 16 * 1024;
/// Longest trailer section, as hyper allows.
const MAX_TRAILER_BYTES: usize = 16 * 1024;
/// Most interim (1xx) responses read before the final one. RFC 9110 §15.2 allows several, but an
/// upstream that sends them without end would hold a core until the header timeout.
const MAX_INTERIM_RESPONSES: usize = 16;
/// A read is made with at least this much room; below it the buffer grows by the read step.
const MIN_READ: usize = 1024;
/// What the buffer first grows by. One SSE event of vLLM's is a few hundred bytes: this holds
/// several, and is what an open stream keeps, so it is kept small (the overhead benchmark's ramp
/// measures memory per stream against it).
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

/// Why a request could not be sent and its response head read, and how much of the request had
/// reached the socket by then: a request none of which was written may be sent again elsewhere.
#[derive(Debug)]
pub struct SendError {
    /// Bytes of the request (head and body) written before the failure.
    pub written: usize,
    /// What failed.
    pub error: H1Error,
}

/// One client connection: the transport and what has been read from it but not used yet.
pub struct H1Conn<T> {
    io: TokioIo<T>,
    buf: BytesMut,
    /// What the buffer grows by when it has less than [`MIN_READ`] free.
    read_step: usize,
    /// Chunk-extension bytes read in the current body (bounded by [`MAX_CHUNK_EXTENSION_BYTES`]).
    extension_bytes: u64,
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
            extension_bytes: 0,
        }
    }

    /// Writes a request (its head and whole body) and reads the response head. The head is read
    /// while the request is still being written, so an upstream that answers before it has
    /// read the body (an early 413, say, RFC 9112 §9.5) gets that answer to the client at once
    /// instead of both sides waiting on full buffers; such a connection is not kept.
    pub async fn send(
        &mut self,
        head: Bytes,
        body: Bytes,
        method: &Method,
    ) -> Result<Head, SendError> {
        let mut out = head.chain(body);
        let total = out.remaining();
        let mut interim = 0;
        let early = poll_fn(|cx| loop {
            if !out.has_remaining() {
                return Pin::new(&mut self.io).poll_flush(cx).map(|r| {
                    r.map(|()| None)
                        .map_err(|e| (total - out.remaining(), H1Error::Io(e)))
                });
            }
            match tokio_util::io::poll_write_buf(Pin::new(&mut self.io), cx, &mut out) {
                Poll::Ready(Ok(0)) => {
                    let e = io::Error::from(io::ErrorKind::WriteZero);
                    return Poll::Ready(Err((total - out.remaining(), H1Error::Io(e))));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err((total - out.remaining(), H1Error::Io(e))));
                }
                Poll::Pending => match ready!(self.poll_parse_head(cx)) {
                    Ok(r) if is_interim(r.status()) => {
                        interim += 1;
                        if interim > MAX_INTERIM_RESPONSES {
                            let e = H1Error::Invalid("too many interim responses");
                            return Poll::Ready(Err((total - out.remaining(), e)));
                        }
                    }
                    Ok(r) => return Poll::Ready(Ok(Some(r))),
                    Err(e) => return Poll::Ready(Err((total - out.remaining(), e))),
                },
            }
        })
        .await
        .map_err(|(written, error)| SendError { written, error })?;
        let written = total;
        match early {
            Some(response) => {
                let mut head = self
                    .frame(response, method)
                    .map_err(|error| SendError { written, error })?;
                // The rest of the request was not sent: the connection's state is unknown.
                head.reusable = false;
                Ok(head)
            }
            None => self
                .read_head_after(method, interim)
                .await
                .map_err(|error| SendError { written, error }),
        }
    }

    /// Writes the head and body of a request and flushes them.
    #[cfg(test)]
    pub async fn write_request(&mut self, head: Bytes, body: Bytes) -> io::Result<()> {
        let mut both = head.chain(body);
        self.io.write_all_buf(&mut both).await?;
        self.io.flush().await
    }

    /// Reads the head of the response to a `method` request. Interim (1xx) responses are read
    /// past, as hyper's client does, except `101 Switching Protocols`, up to
    /// [`MAX_INTERIM_RESPONSES`] of them.
    #[cfg(test)]
    pub async fn read_head(&mut self, method: &Method) -> Result<Head, H1Error> {
        self.read_head_after(method, 0).await
    }

    /// [`H1Conn::read_head`], `interim` interim responses having been read already.
    async fn read_head_after(
        &mut self,
        method: &Method,
        mut interim: usize,
    ) -> Result<Head, H1Error> {
        loop {
            let response = poll_fn(|cx| self.poll_parse_head(cx)).await?;
            if is_interim(response.status()) {
                interim += 1;
                if interim > MAX_INTERIM_RESPONSES {
                    return Err(H1Error::Invalid("too many interim responses"));
                }
                continue;
            }
            return self.frame(response, method);
        }
    }

    /// The framing of a final response head; a new body starts.
    fn frame(&mut self, response: Response<()>, method: &Method) -> Result<Head, H1Error> {
        self.extension_bytes = 0;
        frame_head(response, method)
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
                let end = ready!(self.poll_line(MAX_CHUNK_LINE, cx))?;
                let (size, extension) = chunk_size(&self.buf[..end])?;
                self.extension_bytes += extension as u64;
                if self.extension_bytes > MAX_CHUNK_EXTENSION_BYTES {
                    return Poll::Ready(Err(H1Error::Invalid("chunk extensions over the limit")));
                }
                self.buf.advance(end + 2);
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
                // Most often the CRLF came with the data: no line search. Exactly CRLF, as
                // RFC 9112 §7.1 writes it and hyper reads it.
                while self.buf.len() < 2 {
                    if self.buf.first().is_some_and(|&b| b != b'\r') {
                        break;
                    }
                    if ready!(self.poll_fill(cx))? == 0 {
                        return Poll::Ready(Err(H1Error::Incomplete));
                    }
                }
                if !self.buf.starts_with(b"\r\n") {
                    return Poll::Ready(Err(H1Error::Invalid("chunk data longer than its size")));
                }
                self.buf.advance(2);
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
            if self.buf.starts_with(b"\r\n") {
                self.buf.advance(2);
                return Poll::Ready(Ok(None));
            }
            if self.buf.first().is_some_and(|&b| b == b'\n')
                || self.buf.starts_with(b"\r") && self.buf.len() > 1
            {
                return Poll::Ready(Err(H1Error::Invalid("malformed trailers")));
            }
            if self.buf.len() > 1 {
                let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
                match httparse::parse_headers(&self.buf, &mut fields) {
                    Ok(httparse::Status::Complete((n, fields))) => {
                        // Every line ends in CRLF (RFC 9112 §7.1.2), as hyper requires; httparse
                        // alone also takes a bare LF.
                        if !crlf_lines(&self.buf[..n]) {
                            return Poll::Ready(Err(H1Error::Invalid("malformed trailers")));
                        }
                        let map = header_map(fields)?;
                        self.buf.advance(n);
                        return Poll::Ready(Ok(Some(map)));
                    }
                    Ok(httparse::Status::Partial) if self.buf.len() < MAX_TRAILER_BYTES => {}
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

    /// Waits for a whole line at the start of the buffer, ended by CRLF; its length without the
    /// CRLF. A bare CR or LF is refused at once (RFC 9112 §7.1: a chunk-size line ends in CRLF;
    /// hyper refuses the others too), and so is a line past `max` bytes. The caller reads the
    /// line in place and advances past it: no slice of the buffer is made for it. Inlined: it
    /// runs once per chunk, and a call costs about as much as the search.
    #[inline]
    fn poll_line(&mut self, max: usize, cx: &mut Context<'_>) -> Poll<Result<usize, H1Error>> {
        loop {
            // A chunk-size line is a few bytes: a plain search beats memchr's set-up.
            let window = &self.buf[..self.buf.len().min(max + 1)];
            if let Some(end) = window.iter().position(|&b| b == b'\n' || b == b'\r') {
                match self.buf.get(end..end + 2) {
                    Some(b"\r\n") => return Poll::Ready(Ok(end)),
                    Some(_) => {
                        return Poll::Ready(Err(H1Error::Invalid(
                            "bare CR or LF in a chunk-size line",
                        )))
                    }
                    None if self.buf[end] == b'\n' => {
                        return Poll::Ready(Err(H1Error::Invalid(
                            "bare CR or LF in a chunk-size line",
                        )))
                    }
                    None => {}
                }
            } else if self.buf.len() > max {
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
fn frame_head(mut response: Response<()>, method: &Method) -> Result<Head, H1Error> {
    let headers = response.headers();
    let status = response.status();
    // RFC 9112 §9.3: `close` ends the connection whatever else `Connection` lists; HTTP/1.0 keeps
    // it only when asked to.
    let close = has_token(headers, &header::CONNECTION, "close");
    let keep_alive = !close
        && (response.version() != Version::HTTP_10
            || has_token(headers, &header::CONNECTION, "keep-alive"));
    let (framing, reusable) = if status == StatusCode::SWITCHING_PROTOCOLS {
        (Framing::Done, false)
    } else if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        (Framing::Done, keep_alive)
    } else if headers.contains_key(header::TRANSFER_ENCODING) {
        if response.version() == Version::HTTP_10 {
            // HTTP/1.0 has no transfer codings (RFC 9112 §6.1): the framing of a body cannot be
            // trusted, and hyper refuses it too. (A response without a body, above, has none to
            // frame: §6.3 rule 1 comes first.)
            return Err(H1Error::Invalid("HTTP/1.0 response with transfer-encoding"));
        }
        let framing = if last_coding_is_chunked(headers) {
            Framing::Chunked(Chunk::Size)
        } else {
            Framing::UntilClose
        };
        // With a length beside it the framing is suspect (§6.1): the chunks are read, the
        // connection is not kept, and the length, which does not describe the body, is removed
        // before the response is forwarded (§6.3, point 3).
        let suspect = headers.contains_key(header::CONTENT_LENGTH);
        response.headers_mut().remove(header::CONTENT_LENGTH);
        let chunked = matches!(framing, Framing::Chunked(_));
        (framing, keep_alive && chunked && !suspect)
    } else {
        let fields = headers.get_all(header::CONTENT_LENGTH).iter().count();
        let length =
            content_length(headers).map_err(|()| H1Error::Invalid("invalid content-length"))?;
        if let Some(n) = length {
            if fields > 1
                || headers
                    .get(header::CONTENT_LENGTH)
                    .is_some_and(|v| v.as_bytes().contains(&b','))
            {
                // A list of equal lengths (§6.3, point 5) is forwarded as the one length it
                // means, not as it came.
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            }
        }
        match length {
            Some(0) => (Framing::Done, keep_alive),
            Some(n) => (Framing::Length(n), keep_alive),
            None => (Framing::UntilClose, false),
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
            // Digits only (RFC 9110 §8.6: `1*DIGIT`): `parse` alone would take `+5`.
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(());
            }
            let n: u64 = part.parse().map_err(|_| ())?;
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

/// The size of a chunk from its size line, and how many bytes of extensions the line carries.
/// RFC 9112 §7.1: `1*HEXDIG`, then optional whitespace (which hyper also allows) and `;`
/// extensions; anything else after the digits is refused.
fn chunk_size(line: &[u8]) -> Result<(u64, usize), H1Error> {
    let digits_end = line
        .iter()
        .position(|b| !b.is_ascii_hexdigit())
        .unwrap_or(line.len());
    // Leading zeros are digits too (`1*HEXDIG`); what is left must fit 64 bits.
    let zeros = line[..digits_end]
        .iter()
        .take_while(|&&b| b == b'0')
        .count();
    if digits_end == 0 || digits_end - zeros > 16 {
        return Err(invalid_size());
    }
    let rest = &line[digits_end..];
    let ws = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(rest.len());
    let extension = match rest.get(ws) {
        None => 0,
        Some(b';') => rest.len() - ws,
        Some(_) => return Err(invalid_size()),
    };
    let mut size = 0u64;
    for &b in &line[..digits_end] {
        let d = char::from(b).to_digit(16).ok_or_else(invalid_size)?;
        size = size << 4 | u64::from(d);
    }
    Ok((size, extension))
}

fn invalid_size() -> H1Error {
    H1Error::Invalid("invalid chunk size")
}

/// Whether every line of a header section ends in CRLF.
fn crlf_lines(section: &[u8]) -> bool {
    section
        .iter()
        .enumerate()
        .all(|(i, &b)| b != b'\n' || (i > 0 && section[i - 1] == b'\r'))
}

/// An interim response, read past: 1xx but `101 Switching Protocols`, which ends the exchange.
fn is_interim(status: StatusCode) -> bool {
    status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS
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

#[cfg(test)]
#[path = "upstream_h1_diff_tests.rs"]
mod diff_tests;
