//! One HTTP/1.1 client connection to an upstream replica, read and written directly by the task
//! that serves the client: the request is written from that task, and the response head and body
//! are read from the socket into one buffer, each body frame a slice of it.
//!
//! Why not hyper's client connection: hyper reads the socket in its connection future and hands
//! each body frame to the response body through a channel. Driving that future from the client's
//! own task (the previous design) still cost a channel hand-off per frame and kept a dispatch
//! channel and two fixed-size buffers per connection (`benches/overhead.rs` and
//! `benches/stream_memory.rs` measure CPU per event and memory per stream). The framing and
//! keep-alive rules are in `h1_message.rs`; the tests in `upstream_h1_tests.rs` and the
//! differential test against hyper's client (`upstream_h1_diff_tests.rs`) hold both to them.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::header::HeaderMap;
use http::Method;
use http_body::Frame;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWrite;
#[cfg(test)]
use tokio::io::AsyncWriteExt;

use super::h1_message::{
    chunk_size, crlf_lines, frame_head, header_map, is_interim, parse_head, Parsed,
};
pub use super::h1_message::{Chunk, Framing, H1Error, Head};
use super::upstream_fields::MAX_HEADERS;

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
                    Ok(r) if is_interim(r.status) => {
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
            if is_interim(response.status) {
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
    fn frame(&mut self, response: Parsed, method: &Method) -> Result<Head, H1Error> {
        self.extension_bytes = 0;
        frame_head(response, method)
    }

    fn poll_parse_head(&mut self, cx: &mut Context<'_>) -> Poll<Result<Parsed, H1Error>> {
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

#[cfg(test)]
#[path = "upstream_h1_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "upstream_h1_diff_tests.rs"]
mod diff_tests;
