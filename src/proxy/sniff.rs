//! Reads request heads beside hyper to catch what hyper does not expose: a request carrying both
//! `Content-Length` and `Transfer-Encoding` (hyper frames it by the chunks and drops the length,
//! so the pair is gone by the time a handler sees the request). Such a request is answered 400
//! and the connection closed, as nginx and HAProxy do, and nothing reaches the upstream.
//!
//! The sniffer follows the request framing (a head, then a length-delimited or chunked body, then
//! the next head) so that it parses each head once and skips bodies by counting. Only heads are
//! parsed; body bytes of a length-delimited body cost a subtraction per read. Anything it cannot
//! follow (a malformed head or chunk, an upgrade) makes it stop looking: hyper rejects those
//! itself, and closes the connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::refusal::{is_automatic_answer, Hook, Refused};

/// Headers parsed per head: hyper's own limit, so the sniffer's parse fails (too many headers)
/// exactly where hyper's does and it can foretell hyper's 431.
const MAX_HEADERS: usize = 100;

/// What the sniffer found on one connection, for its request handler.
#[derive(Debug)]
pub struct Verdict {
    /// Index (0-based, in arrival order) of the first head with both framing headers.
    first_bad: AtomicU64,
    /// Requests the handler has taken so far.
    taken: AtomicU64,
}

impl Default for Verdict {
    fn default() -> Self {
        Verdict {
            first_bad: AtomicU64::new(u64::MAX),
            taken: AtomicU64::new(0),
        }
    }
}

impl Verdict {
    /// Called once per request as the handler takes it, in order: whether this request (or one
    /// before it on the connection) carried both `Content-Length` and `Transfer-Encoding`.
    /// hyper hands requests over in arrival order, one at a time, so the count matches the heads.
    pub fn next_request_is_ambiguous(&self) -> bool {
        let i = self.taken.fetch_add(1, Ordering::Relaxed);
        i >= self.first_bad.load(Ordering::Relaxed)
    }
}

/// Where the sniffer is in the request stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At (or inside) a request head.
    Head,
    /// Inside a length-delimited body: bytes left.
    Body(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// Stopped following the framing; hyper decides on its own.
    Blind,
}

/// Where in a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading the hex chunk size: its value and digit count.
    Size(u64, u8),
    /// In a chunk extension or the size line's end: skip to LF. The size read.
    SizeLine(u64),
    /// In chunk data: bytes left.
    Data(u64),
    /// After chunk data: expecting CRLF (`true` once CR was seen).
    DataEnd(bool),
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer line, or the final empty line after its CR: skip to LF, `true` = final.
    TrailerLine(bool),
}

/// A connection's read side with the head sniffer in it; writes pass straight through, except
/// hyper's bare answer to a head it refuses, which the refusal hook replaces (`refusal.rs`).
pub struct Sniffed<S> {
    inner: S,
    /// Bytes of this connection read before the sniffer was put on it, read again first.
    already_read: Bytes,
    state: State,
    /// Bytes of a head that arrived in pieces (empty in the usual case of a head in one read).
    pending: Vec<u8>,
    max_head: usize,
    heads: u64,
    verdict: Arc<Verdict>,
    /// A head hyper will refuse, foretold; taken when hyper writes its answer.
    refused: Option<Refused>,
    /// What answers a refused head instead of hyper; `None` leaves hyper's answer alone.
    hook: Option<Hook>,
    /// The replacement being written: its bytes, how many went out, and the length of hyper's
    /// answer it stands for (what the write reports as written).
    replacing: Option<(Vec<u8>, usize, usize)>,
}

impl<S> Sniffed<S> {
    /// Wraps `inner`; heads longer than `max_head` are left to hyper (which answers 431).
    pub fn new(inner: S, max_head: usize, verdict: Arc<Verdict>) -> Sniffed<S> {
        Sniffed {
            inner,
            already_read: Bytes::new(),
            state: State::Head,
            pending: Vec::new(),
            max_head,
            heads: 0,
            verdict,
            refused: None,
            hook: None,
            replacing: None,
        }
    }

    /// Reads `read` (what the connection's reader before this one took off the socket, from the
    /// start of a request) before the socket, and sniffs it like any read.
    pub fn with_already_read(mut self, read: Bytes) -> Sniffed<S> {
        self.already_read = read;
        self
    }

    /// Answers the heads hyper refuses through `hook` (the proxy's JSON error and a record)
    /// instead of hyper's empty answer.
    pub fn with_refusals(mut self, hook: Hook) -> Sniffed<S> {
        self.hook = Some(hook);
        self
    }

    /// The head at hand will be refused by hyper with `status`: remember it and stop looking.
    fn refuse(&mut self, status: u16, head: &[u8]) {
        if self.hook.is_some() && self.refused.is_none() {
            self.refused = Some(Refused::of(status, head));
        }
        self.pending = Vec::new();
        self.state = State::Blind;
    }

    /// Follows the framing through `data`, the bytes just read (what every read does; public
    /// for the benchmark).
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.state {
                State::Blind => return,
                State::Body(left) => {
                    let n = (data.len() as u64).min(left);
                    data = &data[n as usize..];
                    self.state = if left == n {
                        State::Head
                    } else {
                        State::Body(left - n)
                    };
                }
                State::Chunked(c) => {
                    let (used, next) = chunk_step(c, data);
                    data = &data[used..];
                    self.state = next;
                }
                State::Head => {
                    if self.pending.is_empty() {
                        match self.head(data) {
                            Some(n) => data = &data[n..],
                            None => {
                                self.keep_pending(data);
                                return;
                            }
                        }
                    } else {
                        // Rare: a head split over reads. Parse the joined bytes.
                        let had = self.pending.len();
                        let mut joined = std::mem::take(&mut self.pending);
                        joined.extend_from_slice(data);
                        match self.head(&joined) {
                            Some(n) => data = &data[n - had..],
                            None => {
                                if self.state == State::Head {
                                    self.keep_pending(&joined);
                                }
                                return;
                            }
                        }
                    }
                }
            }
        }
    }

    fn keep_pending(&mut self, bytes: &[u8]) {
        if self.state != State::Head {
            return;
        }
        // hyper refuses an incomplete head once it holds `max_head` bytes of it (431).
        if self.pending.len() + bytes.len() >= self.max_head {
            let head = if self.pending.is_empty() {
                bytes.to_vec()
            } else {
                std::mem::take(&mut self.pending)
            };
            self.refuse(431, &head);
        } else if self.pending.is_empty() {
            self.pending = bytes.to_vec();
        } else {
            self.pending.extend_from_slice(bytes);
        }
    }

    /// Parses a head at the start of `bytes`: its length when complete (the state is then the
    /// body's), `None` when more bytes are needed (or the sniffer went blind).
    fn head(&mut self, bytes: &[u8]) -> Option<usize> {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut headers);
        let len = match req.parse(bytes) {
            // hyper refuses a whole head longer than `max_head` (431).
            Ok(httparse::Status::Complete(n)) if n > self.max_head => {
                self.refuse(431, bytes);
                return None;
            }
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return None,
            // As hyper answers the same parse errors: 431 for too many headers, 400 otherwise.
            Err(httparse::Error::TooManyHeaders) => {
                self.refuse(431, bytes);
                return None;
            }
            Err(_) => {
                self.refuse(400, bytes);
                return None;
            }
        };
        let index = self.heads;
        self.heads += 1;
        let mut te = None;
        let mut cl = None;
        let mut lengths = 0;
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("transfer-encoding") {
                te = Some(h.value);
            } else if h.name.eq_ignore_ascii_case("content-length") {
                cl = Some(h.value);
                lengths += 1;
            } else if h.name.eq_ignore_ascii_case("upgrade") {
                self.state = State::Blind;
            }
        }
        if req.method == Some("CONNECT") {
            self.state = State::Blind;
        }
        if self.state == State::Blind {
            return Some(len);
        }
        self.state = match (te, cl) {
            (Some(_), Some(_)) => {
                self.verdict.first_bad.fetch_min(index, Ordering::Relaxed);
                State::Blind
            }
            (Some(v), None) if ends_with_chunked(v) => State::Chunked(Chunk::Size(0, 0)),
            (None, Some(v)) if lengths == 1 => match parse_length(v) {
                Some(0) => State::Head,
                Some(n) => State::Body(n),
                None => State::Blind,
            },
            (None, None) => State::Head,
            // Another last coding, or several lengths: hyper answers 400 itself.
            (Some(_), None) | (None, Some(_)) => State::Blind,
        };
        Some(len)
    }
}

/// Whether the last coding of a `Transfer-Encoding` value is `chunked`.
fn ends_with_chunked(v: &[u8]) -> bool {
    let last = v.rsplit(|&b| b == b',').next().unwrap_or(v);
    last.trim_ascii().eq_ignore_ascii_case(b"chunked")
}

/// A `Content-Length` value: digits only.
fn parse_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Advances a chunked body over `data`: bytes used and the new state.
fn chunk_step(c: Chunk, data: &[u8]) -> (usize, State) {
    let mut c = c;
    let mut i = 0;
    while i < data.len() {
        let b = data[i];
        c = match c {
            Chunk::Data(left) => {
                let n = ((data.len() - i) as u64).min(left);
                i += n as usize;
                c = if left == n {
                    Chunk::DataEnd(false)
                } else {
                    Chunk::Data(left - n)
                };
                continue;
            }
            Chunk::Size(v, digits) => match (b as char).to_digit(16) {
                Some(d) if digits < 16 => Chunk::Size(v << 4 | u64::from(d), digits + 1),
                None if digits > 0 && matches!(b, b';' | b' ' | b'\t' | b'\r') => {
                    Chunk::SizeLine(v)
                }
                None if digits > 0 && b == b'\n' => end_of_size_line(v),
                // Too many digits (hyper answers 400 to the overflow), none, or junk.
                _ => return (i, State::Blind),
            },
            Chunk::SizeLine(v) => {
                if b == b'\n' {
                    end_of_size_line(v)
                } else {
                    Chunk::SizeLine(v)
                }
            }
            Chunk::DataEnd(cr) => match b {
                b'\r' if !cr => Chunk::DataEnd(true),
                b'\n' => Chunk::Size(0, 0),
                _ => return (i, State::Blind),
            },
            Chunk::TrailerStart => match b {
                b'\n' => return (i + 1, State::Head),
                b'\r' => Chunk::TrailerLine(true),
                _ => Chunk::TrailerLine(false),
            },
            Chunk::TrailerLine(last) => match b {
                b'\n' if last => return (i + 1, State::Head),
                b'\n' => Chunk::TrailerStart,
                _ => Chunk::TrailerLine(false),
            },
        };
        i += 1;
    }
    (i, State::Chunked(c))
}

fn end_of_size_line(size: u64) -> Chunk {
    if size == 0 {
        Chunk::TrailerStart
    } else {
        Chunk::Data(size)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sniffed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        if !me.already_read.is_empty() {
            let n = me.already_read.len().min(buf.remaining());
            let read = me.already_read.split_to(n);
            buf.put_slice(&read);
            if me.state != State::Blind {
                me.feed(&read);
            }
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut me.inner).poll_read(cx, buf);
        if r.is_ready() && me.state != State::Blind {
            let filled = buf.filled();
            // `feed` needs `&mut me` while the bytes are borrowed from `buf`, not from `me`.
            me.feed(&filled[before..]);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sniffed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        if me.replacing.is_none() {
            let refused = me
                .refused
                .as_ref()
                .is_some_and(|r| is_automatic_answer(data, r.status));
            match (refused, &me.hook, me.refused.take()) {
                (true, Some((answers, remote)), Some(r)) => {
                    me.replacing = Some((answers.answer(*remote, &r), 0, data.len()));
                }
                (_, _, r) => {
                    me.refused = r;
                    return Pin::new(&mut me.inner).poll_write(cx, data);
                }
            }
        }
        // Write the whole replacement before telling hyper its answer went out (it closes the
        // connection right after).
        let Some((bytes, sent, stands_for)) = &mut me.replacing else {
            return Pin::new(&mut me.inner).poll_write(cx, data);
        };
        while *sent < bytes.len() {
            match Pin::new(&mut me.inner).poll_write(cx, &bytes[*sent..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(*stands_for))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` split at every `step` bytes; returns the verdict's first bad index.
    fn first_bad(input: &[u8], step: usize) -> u64 {
        let v = Arc::new(Verdict::default());
        let mut s = Sniffed::new((), 64 * 1024, v.clone());
        for piece in input.chunks(step) {
            s.feed(piece);
        }
        v.first_bad.load(Ordering::Relaxed)
    }

    #[test]
    fn the_pair_is_found_at_its_index_for_every_split() {
        let good_cl = b"POST /a HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello";
        let good_te = b"POST /b HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\ntrailer: t\r\n\r\n";
        let get = b"\r\nGET /c HTTP/1.1\r\nhost: x\r\n\r\n";
        // The body of the first request looks like the forbidden head: it must be skipped.
        let sneaky = b"POST /d HTTP/1.1\r\ncontent-length: 61\r\n\r\nPOST /x HTTP/1.1\r\ncontent-length: 1\r\ntransfer-encoding: x\r\n\r\n";
        let bad = b"POST /e HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n";
        let mut all = Vec::new();
        for part in [&good_cl[..], good_te, get, sneaky, bad] {
            all.extend_from_slice(part);
        }
        for step in [1, 2, 3, 7, 16, all.len()] {
            assert_eq!(first_bad(&all, step), 4, "step {step}");
        }
        assert_eq!(first_bad(&all[..all.len() - bad.len()], 5), u64::MAX);
        // Case and a list value do not hide it.
        let bad2 =
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\nTRANSFER-ENCODING: gzip, chunked\r\n\r\n";
        assert_eq!(first_bad(bad2, 4), 0);
    }

    #[test]
    fn what_it_cannot_follow_makes_it_stop_looking() {
        let junk = b"\x16\x03\x01 not http at all\r\n\r\n";
        let v = Arc::new(Verdict::default());
        let mut s = Sniffed::new((), 1024, v);
        s.feed(junk);
        assert_eq!(s.state, State::Blind);
        let mut s = Sniffed::new((), 64, Arc::new(Verdict::default()));
        s.feed(&[b'a'; 40]);
        s.feed(&[b'a'; 40]);
        assert_eq!(s.state, State::Blind, "longer than the head limit");
    }

    #[test]
    fn the_handler_sees_the_verdict_in_request_order() {
        let v = Verdict::default();
        v.first_bad.store(1, Ordering::Relaxed);
        assert!(!v.next_request_is_ambiguous());
        assert!(v.next_request_is_ambiguous());
        assert!(v.next_request_is_ambiguous());
    }
}
