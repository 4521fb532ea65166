//! The way in for the fuzz target `fuzz/fuzz_targets/h1_response.rs` to the upstream response
//! reader (`upstream_h1`), which is otherwise private: one function that reads one response from
//! a scripted in-memory stream and says what the reader made of it. Not part of the proxy's API.
//!
//! It uses only what the proxy itself uses of the reader (`H1Conn::new`, `send`, `poll_body`,
//! `is_clean`), so the target keeps working as the reader's insides change.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderMap, Method};

use super::upstream_h1::{Framing, H1Conn, H1Error};

/// What the reader made of one response.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The final status code, once a head was read.
    pub status: Option<u16>,
    /// The final head's header fields, in order, as received (framing fields included).
    pub headers: Vec<(String, Bytes)>,
    /// The body's data frames, joined.
    pub body: Bytes,
    /// The trailer fields, when a trailer section was given.
    pub trailers: Option<Vec<(String, Bytes)>>,
    /// The head allows another request on the connection once the body is over
    /// (`Head::reusable`).
    pub reusable: bool,
    /// At the end of the body, nothing was left read but unused (`H1Conn::is_clean`). With
    /// `reusable` and no `error`, the proxy's pool would keep the connection.
    pub clean: bool,
    /// Why the head or the body could not be read, as displayed; `None` if the body ended.
    pub error: Option<String>,
    /// The error was the stream ending mid-message.
    pub incomplete: bool,
    /// The reader was given the end of the stream (a read of no bytes).
    pub saw_eof: bool,
    /// The reader waited with nothing to wait for: it returned `Pending` without the stream
    /// having returned `Pending` (it would hang on a real socket).
    pub stalled: bool,
    /// The bytes of the stream the reader did not use: left in its buffer or never read.
    pub unread: Bytes,
}

/// Reads one response to a `GET` (or, if `head`, a `HEAD`) request from a stream made of
/// `script`: each non-empty element is what one read returns (cut to the room the reader
/// offers), an empty element makes the next read return `Pending` once, and after the last
/// element every read returns end of stream. The request written is accepted and discarded.
/// The reader is polled with a waker that does nothing, so the function returns without a
/// runtime.
pub fn read_response(script: &[&[u8]], head: bool) -> Outcome {
    let state = Rc::new(State::default());
    let stream = Script {
        chunks: script.iter().map(|c| c.to_vec()).collect(),
        next: 0,
        offset: 0,
        state: Rc::clone(&state),
    };
    let method = if head { Method::HEAD } else { Method::GET };
    let mut conn = H1Conn::new(stream);
    let mut out = Outcome::default();
    let read = run(&state, read_one(&mut conn, &method, &mut out));
    if read.is_none() {
        out.stalled = true;
        return out;
    }
    out.saw_eof = state.eof.get();
    // What is left: the rest of the reader's buffer, then the rest of the stream. Read as a
    // close-delimited body would be, through the same public call.
    let rest = run(&state, async {
        let mut framing = Framing::UntilClose;
        let mut rest = Vec::new();
        while let Some(Ok(frame)) = poll_fn(|cx| conn.poll_body(&mut framing, cx)).await {
            if let Ok(data) = frame.into_data() {
                rest.extend_from_slice(&data);
            }
        }
        rest
    });
    match rest {
        Some(rest) => out.unread = Bytes::from(rest),
        None => out.stalled = true,
    }
    out
}

/// Sends the request, reads the head and the body into `out`.
async fn read_one(conn: &mut H1Conn<Script>, method: &Method, out: &mut Outcome) {
    let request = format!("{method} / HTTP/1.1\r\nhost: fuzz\r\n\r\n");
    let mut head = match conn.send(Bytes::from(request), Bytes::new(), method).await {
        Ok(head) => head,
        Err(e) => return fail(out, &e.error),
    };
    out.status = Some(head.status.as_u16());
    out.headers = fields(&head.fields.as_sent());
    out.reusable = head.reusable;
    let mut body = Vec::new();
    while let Some(frame) = poll_fn(|cx| conn.poll_body(&mut head.framing, cx)).await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                out.body = Bytes::from(body);
                return fail(out, &e);
            }
        };
        match frame.into_data() {
            Ok(data) => body.extend_from_slice(&data),
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    out.trailers = Some(fields(&trailers));
                }
            }
        }
    }
    out.body = Bytes::from(body);
    out.clean = conn.is_clean();
}

fn fail(out: &mut Outcome, e: &H1Error) {
    out.error = Some(e.to_string());
    out.incomplete = matches!(e, H1Error::Incomplete);
}

fn fields(map: &HeaderMap) -> Vec<(String, Bytes)> {
    map.iter()
        .map(|(n, v)| (n.as_str().to_owned(), Bytes::copy_from_slice(v.as_bytes())))
        .collect()
}

/// Polls `fut` to its end; `None` if it returned `Pending` while the stream had not (a hang).
fn run<F: Future>(state: &State, fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        state.pended.set(false);
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return Some(out),
            Poll::Pending if state.pended.get() => {}
            Poll::Pending => return None,
        }
    }
}

/// What the stream tells the harness.
#[derive(Default)]
struct State {
    /// A read returned `Pending` during the last poll.
    pended: Cell<bool>,
    /// A read returned end of stream.
    eof: Cell<bool>,
}

/// The scripted stream: reads follow the script, writes are discarded.
struct Script {
    chunks: Vec<Vec<u8>>,
    /// The element being read, and how far into it.
    next: usize,
    offset: usize,
    state: Rc<State>,
}

impl hyper::rt::Read for Script {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(chunk) = this.chunks.get(this.next) else {
            this.state.eof.set(true);
            return Poll::Ready(Ok(()));
        };
        if chunk.is_empty() {
            // A `Pending` as a socket gives it: the waker is woken when the data is there,
            // which is at once.
            this.next += 1;
            this.state.pended.set(true);
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = buf.remaining().min(chunk.len() - this.offset);
        buf.put_slice(&chunk[this.offset..this.offset + n]);
        this.offset += n;
        if this.offset == chunk.len() {
            this.next += 1;
            this.offset = 0;
        }
        Poll::Ready(Ok(()))
    }
}

impl hyper::rt::Write for Script {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
