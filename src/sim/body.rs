//! Streaming response bodies: engine-fed SSE and the fixed-pace SSE of the overhead benchmark.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use super::engine::{Ev, Finish, Timings};
use super::metrics::Stats;
use super::request_log::{TruthLog, TruthRecord};
use super::wire_parts::EventWrite;
use crate::clock::{Clock, NANOS_PER_SEC};

/// An SSE body fed by the engine through a bounded per-request channel.
///
/// Dropping it (client gone) closes the channel; the engine sees that at its next step and aborts
/// the request. One `data:` event per frame, so one HTTP chunk per event.
#[derive(Debug)]
pub struct SseBody {
    rx: mpsc::Receiver<Ev>,
    writer: Box<dyn EventWrite>,
    pending: VecDeque<Bytes>,
    finished: bool,
    truth: Option<TruthNote>,
}

/// What a streamed request's truth record needs besides the engine's timings.
#[derive(Debug)]
struct TruthNote {
    log: Arc<TruthLog>,
    arrival_ns: u64,
    prompt_tokens: u64,
    tokens: u64,
}

impl SseBody {
    /// A body reading `rx`, formatting with `writer`.
    pub fn new(rx: mpsc::Receiver<Ev>, mut writer: Box<dyn EventWrite>) -> Self {
        let mut pending = VecDeque::with_capacity(4);
        writer.start(&mut pending);
        SseBody {
            rx,
            writer,
            pending,
            finished: false,
            truth: None,
        }
    }

    /// Writes the request's record to `log` when the engine reports it done.
    pub fn with_truth(mut self, log: Arc<TruthLog>, arrival_ns: u64, prompt_tokens: u64) -> Self {
        self.truth = Some(TruthNote {
            log,
            arrival_ns,
            prompt_tokens,
            tokens: 0,
        });
        self
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(Ev::Token { choice, finish })) => {
                    this.writer.token(choice, finish, &mut this.pending);
                    if let Some(n) = this.truth.as_mut() {
                        n.tokens += 1;
                    }
                }
                Poll::Ready(Some(Ev::Done(t))) => {
                    this.writer.done(Some(&t), &mut this.pending);
                    this.finished = true;
                    if let Some(n) = this.truth.take() {
                        n.log.write(&TruthRecord::of(
                            n.arrival_ns,
                            &t,
                            n.prompt_tokens,
                            n.tokens,
                            true,
                        ));
                    }
                }
                // The engine stopped (shutdown): end the stream without [DONE].
                Poll::Ready(None) => this.finished = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// Fixed-pace SSE: `events` token events per choice, the first `ttft` after acceptance, then one every
/// `gap`, on absolute deadlines (one timer per stream; no batching model). Counts into the ground truth.
#[derive(Debug)]
pub struct FixedBody {
    writer: Box<dyn EventWrite>,
    stats: Arc<Stats>,
    sleep: Pin<Box<Sleep>>,
    start: Instant,
    arrival_ns: u64,
    ttft: Duration,
    gap: Duration,
    events: u64,
    sent: u64,
    n: u32,
    prompt_tokens: u64,
    pending: VecDeque<Bytes>,
    finished: bool,
}

impl FixedBody {
    /// A fixed-pace stream of `events` events for `n` choices; takes `n` running slots until done.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        writer: Box<dyn EventWrite>,
        stats: Arc<Stats>,
        arrival_ns: u64,
        ttft: Duration,
        gap: Duration,
        events: u64,
        n: u32,
        prompt_tokens: u64,
    ) -> Self {
        let mut writer = writer;
        let mut pending = VecDeque::with_capacity(4);
        writer.start(&mut pending);
        let start = Instant::now();
        stats.running.fetch_add(u64::from(n), Relaxed);
        FixedBody {
            writer,
            stats,
            sleep: Box::pin(tokio::time::sleep_until(start + ttft)),
            start,
            arrival_ns,
            ttft,
            gap,
            events,
            sent: 0,
            n,
            prompt_tokens,
            pending,
            finished: false,
        }
    }

    fn complete(&mut self) {
        let now = Clock::global().now();
        let e2e_ns = now.saturating_sub(self.arrival_ns);
        let t = Timings {
            queue_ns: 0,
            ttft_ns: self.ttft.as_nanos() as u64,
            mean_itl_ns: if self.events > 1 {
                self.gap.as_nanos() as u64
            } else {
                0
            },
            e2e_ns,
            cached_tokens: 0,
        };
        {
            let mut l = self.stats.lock();
            l.ttft.observe_n(t.ttft_ns as f64 / 1e9, 1);
            l.itl.observe_n(
                self.gap.as_secs_f64(),
                (self.events.saturating_sub(1)) * u64::from(self.n),
            );
            l.e2e.observe_n(e2e_ns as f64 / 1e9, 1);
            l.queue.observe_n(0.0, 1);
            l.finished_by_reason[1] += 1;
        }
        self.stats.finished.fetch_add(1, Relaxed);
        self.stats.running.fetch_sub(u64::from(self.n), Relaxed);
        self.writer.done(Some(&t), &mut self.pending);
        self.finished = true;
    }
}

impl Body for FixedBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            if this.sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if this.sent == 0 {
                this.stats
                    .prompt_tokens_total
                    .fetch_add(this.prompt_tokens, Relaxed);
            }
            this.sent += 1;
            let last = this.sent >= this.events;
            for c in 0..this.n {
                this.writer
                    .token(c, last.then_some(Finish::Length), &mut this.pending);
            }
            this.stats
                .record_generated(Clock::global().now() / NANOS_PER_SEC, u64::from(this.n));
            if last {
                this.complete();
            } else {
                let next = this.start
                    + this.ttft
                    + Duration::from_nanos((this.gap.as_nanos() as u64).saturating_mul(this.sent));
                this.sleep.as_mut().reset(next);
            }
        }
    }
}

impl Drop for FixedBody {
    fn drop(&mut self) {
        if !self.finished {
            self.stats.running.fetch_sub(u64::from(self.n), Relaxed);
            self.stats.aborted.fetch_add(1, Relaxed);
            self.stats.lock().finished_by_reason[2] += 1;
        }
    }
}
