//! Per-request measurement state, and the guarantee of exactly one record per request: the
//! tracker is finished explicitly (end, error, timeout) or, when dropped unfinished, as a client
//! abort.

mod build_record;
mod meta;
mod shared;

pub use meta::{RequestMeta, SessionClues};
pub use shared::TrackerShared;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::clock::{Clock, UnixNanos};
use crate::dialect::EventSummary;
use crate::fleet::Load;
use crate::itl::{Gap, Gaps, ItlHistogram};
use crate::observe::Observer;
use crate::openai::ServerTimings;
use crate::proxy::request_id::RequestId;
use crate::proxy::session::Conversation;
use crate::proxy::session_table::CallFigures;
use crate::proxy::token_run::TokenRun;
use crate::record::Outcome;
use crate::token_curve::TokenCurveBuilder;

/// Measurement state of one request.
pub struct Tracker {
    shared: Arc<TrackerShared>,
    id: u64,
    t0: Instant,
    t0_ns: UnixNanos,
    meta: RequestMeta,
    metered: bool,
    announced: bool,
    /// The prompt's size was reported to the observers, and the size reported.
    prompt_announced: bool,
    announced_prompt: u64,
    cold: bool,
    in_flight_at_start: u32,
    status: Option<u16>,
    first_byte: Option<Instant>,
    ttft: Option<Instant>,
    bench_ttft: Option<Instant>,
    /// The first streamed event that reported the generation's end (a finish reason, or the
    /// API's terminal event): the TTFT of a stream that generated tokens but showed none.
    generation_end: Option<Instant>,
    /// The last output event's time, on the Unix clock that observers get (one clock reading
    /// per event serves both the gap and the observers).
    last_output_ns: Option<UnixNanos>,
    /// Boxed on the first gap: non-streamed and one-token requests carry none.
    itl: Option<Box<ItlHistogram>>,
    /// Announced, and no token reported yet.
    waiting: bool,
    /// Tokens passed and not reported yet.
    run: TokenRun,
    /// The reported tokens over time, for the log (`token_curve`).
    curve: TokenCurveBuilder,
    usage_prompt: Option<u64>,
    usage_completion: Option<u64>,
    usage_cached: Option<u64>,
    usage_reasoning: Option<u64>,
    /// The API's terminal event was read (`[DONE]`, `response.completed`, `message_stop`) and
    /// whether the frame holding it has been handed to the client since.
    terminal: Terminal,
    counted: u64,
    attributed: u64,
    finish_reason: Option<String>,
    error_event: bool,
    server: Option<ServerTimings>,
    bytes_out: u64,
    /// The replica this request is routed to, and its hold on that replica's load.
    upstream: Option<Load>,
    /// Whether the replica's own observer heard of the start.
    upstream_announced: bool,
    /// Set when a non-streamed request was answered from an upstream stream.
    ttft_source: Option<&'static str>,
    /// Why a non-streamed request was not sent as a stream, or fell back to pass-through.
    ttft_fallback: Option<&'static str>,
    /// The body's `user`, for identification.
    body_user: Option<String>,
    /// What names the session, worked out when the request is admitted or ends.
    session_clues: Option<SessionClues>,
    done: bool,
}

impl Tracker {
    /// Starts measuring a request whose head was read at `t0`; `metered` (generation) requests
    /// count in flight from this moment. Observers hear of it at [`admit`](Self::admit).
    pub fn start(
        shared: Arc<TrackerShared>,
        t0: Instant,
        meta: RequestMeta,
        metered: bool,
    ) -> Tracker {
        let t0_ns = Clock::global().at(t0);
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (in_flight_at_start, cold) = if metered {
            shared.in_flight.arrive(t0_ns)
        } else {
            (0, false)
        };
        Tracker {
            id,
            t0,
            t0_ns,
            metered,
            announced: false,
            prompt_announced: false,
            announced_prompt: 0,
            cold,
            in_flight_at_start,
            meta,
            shared,
            status: None,
            first_byte: None,
            ttft: None,
            bench_ttft: None,
            generation_end: None,
            last_output_ns: None,
            itl: None,
            waiting: false,
            run: TokenRun::default(),
            curve: TokenCurveBuilder::new(t0_ns),
            usage_prompt: None,
            usage_completion: None,
            usage_cached: None,
            usage_reasoning: None,
            terminal: Terminal::NotYet,
            counted: 0,
            attributed: 0,
            finish_reason: None,
            error_event: false,
            server: None,
            bytes_out: 0,
            upstream: None,
            upstream_announced: false,
            ttft_source: None,
            ttft_fallback: None,
            body_user: None,
            session_clues: None,
            done: false,
        }
    }

    /// Fills the meta's identity (user, user agent, trace) with `fill`, given the body's `user`.
    /// Identification (a key's SHA-256, the user agent's copy) shapes nothing sent upstream, so
    /// the forwarder calls this once the request is on its way, before admitting it, or as it
    /// refuses it.
    pub fn identify(&mut self, fill: impl FnOnce(&mut RequestMeta, Option<&str>)) {
        fill(&mut self.meta, self.body_user.as_deref());
    }

    /// The body named a `user`: identification considers it.
    pub fn set_body_user(&mut self, user: String) {
        self.body_user = Some(user);
    }

    /// What names the request's session: read when the request is admitted or ends.
    pub fn set_session_clues(&mut self, clues: SessionClues) {
        self.session_clues = Some(clues);
    }

    /// Works out the session (reading the conversation once the request is on its way).
    fn settle_session(&mut self) {
        if let Some(clues) = self.session_clues.take() {
            let conversation = clues.conversation.and_then(|b| {
                serde_json::from_slice::<&serde_json::value::RawValue>(&b)
                    .ok()
                    .and_then(Conversation::read)
            });
            self.meta.session = crate::proxy::session::identify(
                clues.header,
                clues.body,
                conversation,
                clues.turn_key,
            );
        }
    }

    /// The request is being sent to `load`'s replica (replacing an earlier failed attempt's).
    pub fn route(&mut self, load: Load) {
        self.upstream = Some(load);
    }

    /// The replica is final (a response head arrived, or the last attempt failed): its own
    /// observer hears of the start now.
    pub fn commit_upstream(&mut self, now: Instant) {
        if !self.metered || !self.announced || self.upstream_announced {
            return;
        }
        let Some(o) = self
            .upstream
            .as_ref()
            .and_then(|l| self.shared.per_upstream.get(l.index))
        else {
            return;
        };
        self.upstream_announced = true;
        self.shared.level_changes.change();
        o.started(
            self.id,
            Clock::global().at(now),
            &self.meta.user,
            self.meta.model.as_ref(),
        );
    }

    /// The observer of the replica this request is committed to, if any.
    #[inline]
    fn upstream_observer(&self) -> Option<&Arc<dyn Observer>> {
        if !self.upstream_announced {
            return None;
        }
        self.shared.per_upstream.get(self.upstream.as_ref()?.index)
    }

    /// What is known about the request, to complete once its body is read (before
    /// [`admit`](Self::admit)).
    pub fn meta_mut(&mut self) -> &mut RequestMeta {
        &mut self.meta
    }

    /// The request was read and is being forwarded: its identity in the meta is settled, and
    /// observers hear of it.
    pub fn admit(&mut self) {
        self.settle_session();
        if self.metered && !self.announced {
            self.announced = true;
            self.waiting = true;
            self.shared.level_changes.arrival();
            for o in &self.shared.observers {
                o.started(
                    self.id,
                    self.t0_ns,
                    &self.meta.user,
                    self.meta.model.as_ref(),
                );
            }
        }
    }

    /// The request's id as logged and sent in `request_id_header`.
    pub fn request_id(&self) -> RequestId {
        RequestId::new(self.shared.id_prefix, self.id)
    }

    /// Whether this request is metered (a generation request).
    pub fn metered(&self) -> bool {
        self.metered
    }

    /// The status sent to the client.
    pub fn set_status(&mut self, status: u16) {
        self.status = Some(status);
    }

    /// A body frame arrived from upstream at `now`.
    #[inline]
    pub fn on_upstream_bytes(&mut self, now: Instant) {
        if self.first_byte.is_none() {
            self.first_byte = Some(now);
        }
    }

    /// `len` bytes were handed to the client.
    #[inline]
    pub fn on_sent(&mut self, len: usize) {
        self.bytes_out += len as u64;
    }

    /// One SSE event (or a whole non-streamed JSON body), read by the request's dialect, passed
    /// at `now`.
    pub fn on_event(&mut self, s: &EventSummary<'_>, now: Instant, streamed: bool) {
        if s.error {
            self.error_event = true;
        }
        // `now` on the Unix clock, converted once and only for an event that carries output.
        let (mut now_ns, mut gap) = (None, None);
        if streamed {
            if s.choices > 0 && self.bench_ttft.is_none() {
                self.bench_ttft = Some(now);
            }
            if s.output > 0 {
                if self.ttft.is_none() {
                    self.ttft = Some(now);
                }
                // The same clock's difference: the gap between the two instants, to the ns.
                let ns = Clock::global().at(now);
                now_ns = Some(ns);
                if let Some(prev) = self.last_output_ns {
                    let g = Gap::of(ns.saturating_sub(prev));
                    self.itl.get_or_insert_with(Default::default).record_gap(g);
                    gap = Some(g);
                }
                self.last_output_ns = Some(ns);
            }
            if s.end && self.terminal == Terminal::NotYet {
                self.terminal = Terminal::Read;
            }
            if self.generation_end.is_none() && (s.end || s.finish_reason.is_some()) {
                self.generation_end = Some(now);
            }
        }
        self.counted += s.output as u64;
        if self.finish_reason.is_none() {
            if let Some(r) = &s.finish_reason {
                self.finish_reason = Some(r.chars().take(32).collect());
            }
        }
        if let Some(t) = s.server_timings {
            self.server = Some(t);
        }
        if let Some(u) = s.usage {
            // Each count keeps its last reported value (Messages repeats the cumulative output).
            let keep = |slot: &mut Option<u64>, v: Option<u64>| {
                if v.is_some() {
                    *slot = v;
                }
            };
            keep(&mut self.usage_prompt, u.input);
            keep(&mut self.usage_completion, u.output);
            keep(&mut self.usage_cached, u.cached_input);
            keep(&mut self.usage_reasoning, u.reasoning);
        }
        if streamed && self.announced && (s.output > 0 || s.choices > 0) {
            // The prompt's size, once, as soon as an output event passes and a usage gave it
            // (Messages' first event, or every event with continuous usage).
            if let (false, Some(p)) = (self.prompt_announced, self.usage_prompt) {
                self.prompt_announced = true;
                self.announced_prompt = p;
                for o in &self.shared.observers {
                    o.prompt_tokens(self.id, p);
                }
            }
            // Tokens to attribute now: cumulative usage when the upstream sends it on every event
            // (exact), else one per output-carrying piece; the final usage reconciles at the end.
            let delta = match s.usage.and_then(|u| u.output) {
                Some(total) => total.saturating_sub(self.attributed),
                None => s.output as u64,
            };
            // A gap goes to the meter with the tokens (vLLM observes ITL as it passes), or alone.
            if delta > 0 || (gap.is_some() && !self.waiting) {
                self.attributed += delta;
                let now_ns = now_ns.unwrap_or_else(|| Clock::global().at(now));
                if delta > 0 {
                    self.curve.push(now_ns, delta);
                }
                let changes = &self.shared.level_changes;
                if std::mem::take(&mut self.waiting) {
                    // The first token closes the request's guard: reported at once.
                    changes.no_longer_waiting();
                    self.run.reported_alone(changes);
                    self.report_tokens((now_ns, delta, Gaps::of(gap)));
                } else {
                    let held = self.announced_prompt + self.attributed;
                    let index = self.upstream.as_ref().map_or(0, |u| u.index);
                    let alone = self.shared.starts_block(index, held - delta, held);
                    for r in self
                        .run
                        .add(changes, now_ns, (delta, gap), alone)
                        .into_iter()
                        .flatten()
                    {
                        self.report_tokens(r);
                    }
                }
            }
        }
    }

    /// Tells the observers of `tokens` passed by `now_ns`.
    fn report_tokens(&self, (now_ns, tokens, gaps): (UnixNanos, u64, Gaps)) {
        for o in &self.shared.observers {
            o.tokens(self.id, now_ns, tokens, gaps);
        }
        if let Some(o) = self.upstream_observer() {
            o.tokens(self.id, now_ns, tokens, gaps);
        }
    }

    /// Reports the tokens not reported yet.
    fn report_pending(&mut self) {
        if let Some(r) = self.run.take() {
            self.report_tokens(r);
        }
    }

    /// The answer was rebuilt from a stream the proxy asked for instead of the client's
    /// non-streamed request: its TTFT is that stream's.
    pub fn set_ttft_source(&mut self, source: &'static str) {
        self.ttft_source = Some(source);
    }

    /// A non-streamed request passes through unchanged, for this reason.
    pub fn set_ttft_fallback(&mut self, why: &'static str) {
        self.ttft_fallback = Some(why);
    }

    /// The stream sent in its place was abandoned for `why` and the request is sent again as the client
    /// wrote it: what was measured on the abandoned stream no longer describes the answer.
    /// Tokens already reported to observers stay reported (vLLM generated them).
    pub fn restart_for_fallback(&mut self, why: &'static str) {
        self.report_pending();
        self.ttft_fallback = Some(why);
        self.ttft_source = None;
        self.first_byte = None;
        self.ttft = None;
        self.bench_ttft = None;
        self.generation_end = None;
        self.last_output_ns = None;
        self.itl = None;
        self.usage_prompt = None;
        self.usage_completion = None;
        self.usage_cached = None;
        self.usage_reasoning = None;
        self.terminal = Terminal::NotYet;
        self.counted = 0;
        self.finish_reason = None;
        self.error_event = false;
        self.server = None;
        self.status = None;
    }

    /// The body is about to be polled again: any frame produced before has been handed to the
    /// client, the terminal event's included.
    #[inline]
    pub fn on_poll(&mut self) {
        if self.terminal == Terminal::Read {
            self.terminal = Terminal::Delivered(self.now());
        }
    }

    /// No event with output has been read yet: the stream's first token is still to come.
    #[inline]
    pub fn awaits_output(&self) -> bool {
        self.ttft.is_none()
    }

    /// The frame read last was handed to the client at `at` (it is measured after that, so its
    /// terminal event, if it held one, is marked delivered then).
    #[inline]
    pub fn on_handed(&mut self, at: Instant) {
        if self.terminal == Terminal::Read {
            self.terminal = Terminal::Delivered(at);
        }
    }

    /// Now, on the proxy's measuring clock.
    #[inline]
    pub fn now(&self) -> Instant {
        self.shared.time.now()
    }

    /// The instant to record for a frame the caller timed at `real` for its own timers.
    #[inline]
    pub fn observe(&self, real: Instant) -> Instant {
        self.shared.time.observe(real)
    }

    /// Ends the request with `outcome` at `now`; later calls do nothing.
    pub fn finish(&mut self, outcome: Outcome, error: Option<&str>, now: Instant) {
        if self.done {
            return;
        }
        self.done = true;
        self.settle_session();
        let now_ns = Clock::global().at(now);
        if self.metered {
            self.shared.in_flight.depart(now_ns);
        }
        self.report_pending();
        if self.announced {
            let changes = &self.shared.level_changes;
            if std::mem::take(&mut self.waiting) {
                changes.no_longer_waiting();
            } else {
                changes.change();
            }
        }
        let outcome = match outcome {
            Outcome::Ok => Outcome::of_answer(self.status, self.error_event),
            o => o,
        };
        let mut record = self.record(outcome, error, now);
        record.judge(&self.shared.slo);
        if let Some(call) = &self.meta.session {
            let audit = self.shared.sessions.audit(
                call,
                CallFigures {
                    start_ns: record.ts_ns,
                    end_ns: record.end_ns(),
                    prompt: record.prompt_tokens,
                    completion: record
                        .completion_tokens
                        .filter(|_| record.tokens_source == crate::record::TokensSource::Usage),
                    cached: record.cached_prompt_tokens,
                    upstream: self.upstream.as_ref().map(|l| l.index),
                },
            );
            record.session = Some(call.name.clone());
            record.session_source = Some(call.source);
            record.turn = audit.turn;
            record.session_call = Some(audit.call);
            record.session_gap_ms = audit.gap_ms;
            record.prefix_expected_tokens = audit.expected_cached;
            record.prefix_lost_tokens = audit.lost;
            record.prefix_audit = Some(audit.verdict.to_string());
        }
        let record = Arc::new(record);
        for o in &self.shared.observers {
            o.finished(self.id, now_ns, &record, self.announced);
        }
        if let Some(load) = self.upstream.take() {
            load.upstream
                .count_finished(outcome, record.prompt_tokens, record.completion_tokens);
            if let Some(o) = self.shared.per_upstream.get(load.index) {
                o.finished(self.id, now_ns, &record, self.upstream_announced);
            }
        }
    }
}

/// Where the API's terminal event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Terminal {
    /// Not seen yet.
    NotYet,
    /// Read from the upstream, in a frame not yet handed to the client.
    Read,
    /// Handed to the client at this time.
    Delivered(Instant),
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        match self.terminal {
            // The client had the whole answer (Codex closes right after `response.completed`):
            // the request ended when the terminal event left.
            Terminal::Delivered(at) => self.finish(Outcome::Ok, None, at),
            _ => {
                let now = self.now();
                self.finish(Outcome::ClientAborted, Some("client disconnected"), now);
            }
        }
    }
}
