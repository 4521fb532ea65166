//! The response body wrapper: forwards upstream frames as they arrive, measures them on the way,
//! and finishes its request's record exactly once (end, error, timeout, or drop = client abort).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::pool::PooledBody;
use super::upstream_fields::UpstreamFields;
use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use crate::config::ServeConfig;
use crate::dialect::{Dialect, EventSummary, StreamReader};
use crate::proxy::tracker::Tracker;
use crate::record::Outcome;
use crate::sse::SseScanner;

/// Error type of the proxied body; any error makes hyper cut the response (no clean end).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How the body is read on the way through.
pub enum Reading {
    /// Server-sent events, scanned incrementally and read by the API's stream `reader`;
    /// `strip_usage` removes usage-only events the proxy asked for on the client's behalf.
    Sse {
        reader: Box<dyn StreamReader>,
        scanner: SseScanner,
        strip_usage: bool,
        held: BytesMut,
        max_held: usize,
    },
    /// A JSON body copied aside (up to `limit` bytes) for `dialect` to read at the end.
    Json {
        dialect: &'static dyn Dialect,
        copy: Vec<u8>,
        limit: usize,
        overflow: bool,
    },
    /// Passed through, only counted.
    Opaque,
}

impl Reading {
    /// How a metered response with these `fields` is read by `dialect`: as events, or as one
    /// JSON body. (A stream whose usage is stripped has no known length: its
    /// `Content-Length` is left out, `MeteredBody::size_hint`.)
    pub fn for_response(
        dialect: &'static dyn Dialect,
        fields: &UpstreamFields,
        strip_usage: bool,
        cfg: &ServeConfig,
    ) -> Reading {
        if fields.content_type_starts("text/event-stream") {
            Reading::Sse {
                reader: dialect.stream_reader(),
                scanner: SseScanner::new(cfg.max_sse_event_bytes),
                strip_usage,
                held: Default::default(),
                max_held: cfg.max_sse_event_bytes,
            }
        } else if fields.content_type_starts("application/json") {
            Reading::Json {
                dialect,
                copy: Vec::new(),
                limit: cfg.max_response_scan_bytes,
                overflow: false,
            }
        } else {
            Reading::Opaque
        }
    }
}

/// A body frame arrived too late.
#[derive(Debug, thiserror::Error)]
#[error("upstream body idle timeout")]
struct IdleTimeout;

/// A body the upstream cut short, on its way to the client.
enum Cut {
    /// Everything read before the cut has been handed to the server: one more poll, after its
    /// write buffer has gone to the socket, before the error.
    Flush(BoxError),
    /// The error to end the response with (no clean end: the client sees the body cut).
    Fail(BoxError),
}

/// The upstream's response body, metered.
pub struct MeteredBody {
    inner: Option<PooledBody>,
    /// The upstream cut the body short; set once, after the record is finished.
    cut: Option<Cut>,
    /// The response has no body (HEAD, 204, 304, a zero length): finished when built, since the
    /// server never polls it.
    bodiless: bool,
    tracker: Tracker,
    reading: Reading,
    idle: Duration,
    last_frame: Instant,
    timer: Pin<Box<Sleep>>,
    /// The waker the timer last registered: polling the timer registers the waker again, so it is
    /// polled only when the task changed or the timer fired, not on every frame.
    timer_waker: Option<Waker>,
    /// A frame handed to the server before it was measured.
    deferred: Option<Deferred>,
    /// The upstream's fields, until the writer of the response head takes them.
    fields: Option<UpstreamFields>,
}

/// A data frame handed to the server before it was measured: the meter reads it after the server
/// has written it, so the client's bytes never wait for the meter. Only frames that measuring
/// cannot change are handed on first ([`MeteredBody::deferrable`]).
struct Deferred {
    data: Bytes,
    /// When it arrived, on the tracker's clock (the measurement's time, whenever it is made).
    at: Instant,
    /// When the body was polled again after handing it on: the server buffered it then and
    /// writes it before its next poll. `None` until then.
    handed: Option<Instant>,
}

impl MeteredBody {
    /// Wraps `inner`, headed by the upstream's `fields`; the request's record is finished by
    /// this body from now on.
    pub fn new(
        inner: PooledBody,
        tracker: Tracker,
        reading: Reading,
        idle: Duration,
        fields: Option<UpstreamFields>,
    ) -> Self {
        let now = Instant::now();
        let bodiless = inner.is_end_stream();
        let mut body = MeteredBody {
            inner: Some(inner),
            cut: None,
            bodiless,
            tracker,
            reading,
            idle,
            last_frame: now,
            timer: Box::pin(tokio::time::sleep_until((now + idle).into())),
            timer_waker: None,
            deferred: None,
            fields,
        };
        if bodiless {
            body.end(Outcome::Ok, None);
        }
        body
    }

    /// The upstream's response has no body (HEAD, 204, 304, a zero length): its
    /// `content-length`, if any, is forwarded as it came.
    pub fn is_bodiless(&self) -> bool {
        self.bodiless
    }

    /// The upstream's fields, taken by the writer of the response head.
    pub fn take_fields(&mut self) -> Option<UpstreamFields> {
        self.fields.take()
    }

    fn holds_bytes(&self) -> bool {
        matches!(&self.reading, Reading::Sse { held, .. } if !held.is_empty())
    }

    fn end(&mut self, outcome: Outcome, error: Option<&str>) {
        self.settle();
        let now = self.tracker.now();
        if let Reading::Json {
            dialect,
            copy,
            overflow: false,
            ..
        } = &self.reading
        {
            if let Some(s) = dialect.body(copy) {
                self.tracker.on_event(&s, now, false);
            }
        }
        self.inner = None;
        self.tracker.finish(outcome, error, now);
    }

    /// Whether `data` may go to the client before it is measured: measuring sends it as it came.
    /// Only the usage strip changes what is sent, and only for frames it must read first; the
    /// search that tells costs more than the wait it saves once the first token is out, so under
    /// the strip only frames up to the first token are handed on first.
    fn deferrable(&self, data: &Bytes) -> bool {
        if data.is_empty() {
            return false;
        }
        match &self.reading {
            Reading::Sse {
                strip_usage: true,
                held,
                ..
            } => self.tracker.awaits_output() && passes_strip_unread(held, data),
            _ => true,
        }
    }

    /// Measures the frame handed on unmeasured, if there is one.
    fn settle(&mut self) {
        let Some(d) = self.deferred.take() else {
            return;
        };
        let len = d.data.len();
        let sent = self.on_data(d.data, d.at);
        debug_assert_eq!(
            sent.map_or(0, |b| b.len()),
            len,
            "a deferred frame goes as it came"
        );
        if let Some(at) = d.handed {
            self.tracker.on_handed(at);
        }
    }

    /// Measures one data frame; returns what to send on (possibly less, when usage is stripped).
    fn on_data(&mut self, data: Bytes, now: Instant) -> Option<Bytes> {
        let tracker = &mut self.tracker;
        tracker.on_upstream_bytes(now);
        let out = match &mut self.reading {
            Reading::Opaque => data,
            Reading::Json {
                copy,
                limit,
                overflow,
                ..
            } => {
                if !*overflow {
                    if copy.len() + data.len() > *limit {
                        *overflow = true;
                        *copy = Vec::new();
                    } else {
                        copy.extend_from_slice(&data);
                    }
                }
                data
            }
            Reading::Sse {
                reader,
                scanner,
                strip_usage,
                held,
                max_held,
            } => {
                if !*strip_usage {
                    scanner.feed(&data, |ev| {
                        if !ev.oversize {
                            if let Some(s) = reader.next_event(ev.data) {
                                tracker.on_event(&s, now, true);
                            }
                        }
                    });
                    data
                } else {
                    let mut out = strip_usage_events(&mut **reader, scanner, held, &data, |s| {
                        tracker.on_event(s, now, true);
                    });
                    if held.len() > *max_held {
                        // An event this large is not a usage event: stop holding, pass everything.
                        let mut all = BytesMut::with_capacity(out.len() + held.len());
                        all.extend_from_slice(&out);
                        all.extend_from_slice(held);
                        held.clear();
                        *strip_usage = false;
                        out = all.freeze();
                    }
                    out
                }
            }
        };
        if out.is_empty() {
            return None;
        }
        tracker.on_sent(out.len());
        Some(out)
    }
}

/// Whether the usage strip ([`strip_usage_events`]) sends `data` unchanged, told without reading
/// it: nothing is held back from earlier frames (so the scanner is between events), `data` ends
/// an event (a blank line), and no event in it can be usage-only, since none names `usage`
/// (nor holds a `\u` escape, which could spell it).
pub(crate) fn passes_strip_unread(held: &BytesMut, data: &[u8]) -> bool {
    static USAGE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"usage"));
    static ESCAPE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\\u"));
    held.is_empty()
        && data.ends_with(b"\n\n")
        && USAGE.find(data).is_none()
        && ESCAPE.find(data).is_none()
}

/// Feeds `data` through the scanner, drops usage-only events (`"choices": []` with usage), holds
/// back an event that is not complete yet (it might be one), and returns the bytes to send now.
pub(crate) fn strip_usage_events(
    reader: &mut dyn StreamReader,
    scanner: &mut SseScanner,
    held: &mut BytesMut,
    data: &Bytes,
    mut on_summary: impl FnMut(&EventSummary<'_>),
) -> Bytes {
    // Ranges of `data` to drop, and whether the held prefix is dropped.
    let mut drops: [(usize, usize); 4] = [(0, 0); 4];
    let mut n_drops = 0;
    let mut overflow_drops: Vec<(usize, usize)> = Vec::new();
    let mut drop_held = false;
    let mut held_ends_at: Option<usize> = None;
    scanner.feed(data, |ev| {
        let mut usage_only = false;
        if !ev.oversize {
            if let Some(s) = reader.next_event(ev.data) {
                usage_only = s.usage_only;
                on_summary(&s);
            }
        }
        if ev.start.is_none() {
            held_ends_at = Some(ev.end);
            drop_held = usage_only;
            if usage_only {
                push_range(&mut drops, &mut n_drops, &mut overflow_drops, (0, ev.end));
            }
        } else if usage_only {
            push_range(
                &mut drops,
                &mut n_drops,
                &mut overflow_drops,
                (ev.start.unwrap_or(0), ev.end),
            );
        }
    });
    let tail_from = if scanner.in_event() {
        scanner.pending_from().unwrap_or(0)
    } else {
        data.len()
    };
    let held_complete =
        held_ends_at.is_some() || !scanner.in_event() || scanner.pending_from().is_some();
    let mut ranges = drops[..n_drops]
        .iter()
        .chain(overflow_drops.iter())
        .copied()
        .peekable();
    // Common case: nothing held, nothing dropped, nothing pending.
    if held.is_empty() && ranges.peek().is_none() && tail_from == data.len() {
        return data.clone();
    }
    let mut out = BytesMut::new();
    if !held.is_empty() && held_complete {
        if !drop_held {
            out.extend_from_slice(held);
        }
        held.clear();
    }
    let mut pos = 0;
    for (from, to) in ranges {
        if from > pos {
            out.extend_from_slice(&data[pos..from.min(tail_from)]);
        }
        pos = pos.max(to);
    }
    if pos < tail_from {
        out.extend_from_slice(&data[pos..tail_from]);
    }
    if tail_from < data.len() {
        held.extend_from_slice(&data[tail_from.max(pos)..]);
    }
    out.freeze()
}

fn push_range(
    fixed: &mut [(usize, usize); 4],
    n: &mut usize,
    more: &mut Vec<(usize, usize)>,
    r: (usize, usize),
) {
    if *n < fixed.len() {
        fixed[*n] = r;
        *n += 1;
    } else {
        more.push(r);
    }
}

impl Drop for MeteredBody {
    fn drop(&mut self) {
        // A frame handed on and then the client gone: measured before the record is finished.
        self.settle();
    }
}

impl Body for MeteredBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match this.cut.take() {
            None => {}
            Some(Cut::Flush(e)) => {
                // hyper writes its buffer to the socket after a pending body and before it polls
                // again; an error now would close the connection with the bytes already read
                // still in that buffer, and the client would get none of them.
                this.cut = Some(Cut::Fail(e));
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Some(Cut::Fail(e)) => return Poll::Ready(Some(Err(e))),
        }
        this.tracker.on_poll();
        if let Some(d) = &mut this.deferred {
            // The first poll after a frame was handed on comes before the server writes it (it
            // writes once the body is pending); any later one, after.
            if d.handed.is_none() {
                d.handed = Some(this.tracker.now());
            } else {
                this.settle();
            }
        }
        loop {
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // The idle timer runs on real time; the measurement on the tracker's clock.
                    let real = Instant::now();
                    this.last_frame = real;
                    match frame.into_data() {
                        Ok(data) => {
                            // Frames are measured in order: the one handed on before, first.
                            this.settle();
                            let now = this.tracker.observe(real);
                            let ends = this
                                .inner
                                .as_ref()
                                .is_some_and(http_body::Body::is_end_stream);
                            if !ends && this.deferrable(&data) {
                                this.deferred = Some(Deferred {
                                    data: data.clone(),
                                    at: now,
                                    handed: None,
                                });
                                return Poll::Ready(Some(Ok(Frame::data(data))));
                            }
                            let out = this.on_data(data, now);
                            // A body of known length is over with its last byte: hyper will not
                            // poll again, so the record is finished now, not at drop.
                            let over = ends && !this.holds_bytes();
                            if over {
                                this.end(Outcome::Ok, None);
                            }
                            if let Some(out) = out {
                                return Poll::Ready(Some(Ok(Frame::data(out))));
                            }
                            if over {
                                return Poll::Ready(None);
                            }
                        }
                        Err(frame) => {
                            this.settle();
                            // Trailers are the last frame: the server will not poll again.
                            if this
                                .inner
                                .as_ref()
                                .is_some_and(http_body::Body::is_end_stream)
                            {
                                this.end(Outcome::Ok, None);
                            }
                            return Poll::Ready(Some(Ok(frame)));
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    this.settle();
                    // What was read before the cut reaches the client, then the cut: an event
                    // held back (it might have been a usage event) goes as the upstream sent it.
                    let rest = match &mut this.reading {
                        Reading::Sse { held, .. } if !held.is_empty() => {
                            Some(held.split().freeze())
                        }
                        _ => None,
                    };
                    if let Some(rest) = &rest {
                        this.tracker.on_sent(rest.len());
                    }
                    this.end(
                        Outcome::UpstreamAborted,
                        Some("upstream connection lost mid-body"),
                    );
                    if let Some(rest) = rest {
                        this.cut = Some(Cut::Flush(Box::new(e)));
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                    // As `Cut::Flush`: pending once, so the server writes what it holds first.
                    this.cut = Some(Cut::Fail(Box::new(e)));
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                Poll::Ready(None) => {
                    this.settle();
                    if let Reading::Sse { held, .. } = &mut this.reading {
                        if !held.is_empty() {
                            // An unterminated last event: pass it on as the upstream sent it.
                            let rest = held.split().freeze();
                            this.tracker.on_sent(rest.len());
                            return Poll::Ready(Some(Ok(Frame::data(rest))));
                        }
                    }
                    this.end(Outcome::Ok, None);
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    // The timer is re-armed lazily: frames only record their time.
                    let armed = this
                        .timer_waker
                        .as_ref()
                        .is_some_and(|w| w.will_wake(cx.waker()));
                    if armed && !this.timer.is_elapsed() {
                        return Poll::Pending;
                    }
                    while this.timer.as_mut().poll(cx).is_ready() {
                        let deadline = this.last_frame + this.idle;
                        if Instant::now() >= deadline {
                            this.end(Outcome::Timeout, Some("upstream body idle timeout"));
                            return Poll::Ready(Some(Err(Box::new(IdleTimeout))));
                        }
                        this.timer.as_mut().reset(deadline.into());
                    }
                    this.timer_waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // A bodiless response keeps its zero-length hint, so the server writes its head as the
        // upstream sent it (a 304's or a HEAD answer's content-length) and never polls it.
        self.inner.is_none() && self.cut.is_none() && !self.bodiless
    }

    fn size_hint(&self) -> SizeHint {
        if self.bodiless {
            return SizeHint::with_exact(0);
        }
        match (&self.inner, &self.reading) {
            // Bytes pass unchanged but for stripped usage events.
            (
                Some(b),
                Reading::Json { .. }
                | Reading::Opaque
                | Reading::Sse {
                    strip_usage: false, ..
                },
            ) => b.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
#[path = "body_tests.rs"]
mod tests;
