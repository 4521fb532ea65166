//! The engine core: continuous batching as a pure state machine driven by explicit times.
//!
//! A step is planned by [`Engine::begin_step`] (drop aborted requests, give every running
//! sequence room for its next token in the KV cache or preempt, admit waiting ones into free
//! slots and blocks, return the step's duration) and completed by [`Engine::finish_step`] (one
//! token for every sequence in the batch, finish and report). The async shell only sleeps
//! between the two. The KV cache's blocks are kept by [`super::kv::BlockPool`]; how a request
//! takes, grows and gives back its blocks is `engine_kv.rs`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::config::SimConfig;
use super::kv::{BlockPool, SeqBlocks};
use super::metrics::Stats;

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Reached its max_tokens.
    Length,
    /// The stop rule fired (an end-of-sequence token).
    Stop,
}

impl Finish {
    /// vLLM's `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Length => "length",
            Finish::Stop => "stop",
        }
    }
}

/// Per-request timings from the engine's own schedule, nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timings {
    /// Arrival → start of the step that admitted the request.
    pub queue_ns: u64,
    /// Arrival → end of its prefill step (first token).
    pub ttft_ns: u64,
    /// Mean gap between consecutive tokens of the same sequence (0 with one token per sequence).
    pub mean_itl_ns: u64,
    /// Arrival → last token.
    pub e2e_ns: u64,
    /// Prompt tokens found in the prefix cache when the request was first admitted (whole
    /// blocks, never the last prompt token).
    pub cached_tokens: u64,
}

/// What the engine tells a request's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ev {
    /// One generated token of sequence `choice`; `finish` is set on its last token.
    Token {
        /// The choice index (0..n).
        choice: u32,
        /// Set when this token ends the sequence.
        finish: Option<Finish>,
    },
    /// All sequences finished; the request's timings.
    Done(Timings),
}

/// Where the engine delivers a request's events; never blocks.
pub trait Sink {
    /// True once the client has gone (the request is then aborted at the next step).
    fn is_closed(&self) -> bool;
    /// Delivers one event without blocking; false if it could not be delivered.
    fn deliver(&mut self, ev: Ev) -> bool;
}

impl Sink for tokio::sync::mpsc::Sender<Ev> {
    fn is_closed(&self) -> bool {
        tokio::sync::mpsc::Sender::is_closed(self)
    }
    fn deliver(&mut self, ev: Ev) -> bool {
        self.try_send(ev).is_ok()
    }
}

/// A validated request as the engine sees it.
#[derive(Debug)]
pub struct Job<S> {
    /// Number of sequences (`n`), each takes one slot.
    pub n: u32,
    /// Prompt tokens (prefilled once per request).
    pub prompt_tokens: u64,
    /// Output limit per sequence.
    pub max_tokens: u64,
    /// Per choice: the stop rule's stop position, `None` = never stops early.
    pub stop_after: Vec<Option<u64>>,
    /// Arrival time, nanoseconds on the engine's timeline.
    pub arrival_ns: u64,
    /// The identities of the prompt's tokens, one per prompt token, for the prefix cache
    /// ([`super::prompt::chat_prompt_ids`]); empty when unknown (never found, never cached).
    pub prompt_ids: Vec<u64>,
    /// The request's stream.
    pub sink: S,
}

/// A request in the engine, waiting or running.
#[derive(Debug)]
pub(super) struct Active<S> {
    pub(super) job: Job<S>,
    /// The engine's number for it (arrival order).
    pub(super) id: u64,
    pub(super) generated: Vec<u64>,
    pub(super) done: Vec<bool>,
    pub(super) live_seqs: u32,
    /// Per choice, its KV blocks (empty while waiting and once the choice is done).
    pub(super) blocks: Vec<SeqBlocks>,
    /// Its first admission (`None` while it never ran).
    pub(super) admitted_ns: Option<u64>,
    pub(super) cached_tokens: u64,
    pub(super) preemptions: u64,
    first_token_ns: Option<u64>,
    pub(super) last_token_ns: u64,
    itl_sum_ns: u64,
    itl_count: u64,
    last_finish: Finish,
    /// Per choice, what the current step produced (delivered after the counters are updated).
    step_out: Vec<StepOut>,
    /// Set when the request finished in the current step.
    timings: Option<Timings>,
}

impl<S> Active<S> {
    /// True until the request finished in the current step.
    pub(super) fn timings_pending(&self) -> bool {
        self.timings.is_none()
    }
}

/// What one step produced for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepOut {
    Nothing,
    Token(Option<Finish>),
}

/// The continuous-batching engine.
#[derive(Debug)]
pub struct Engine<S> {
    pub(super) cfg: SimConfig,
    pub(super) stats: Arc<Stats>,
    pub(super) pool: BlockPool,
    pub(super) waiting: VecDeque<Active<S>>,
    pub(super) running: Vec<Active<S>>,
    pub(super) running_seqs: u64,
    next_id: u64,
    ever_admitted: bool,
    idle_since_ns: Option<u64>,
}

impl<S: Sink> Engine<S> {
    /// An idle engine with the model in `cfg`, publishing into `stats`.
    pub fn new(cfg: SimConfig, stats: Arc<Stats>) -> Self {
        let pool = BlockPool::new(
            cfg.num_gpu_blocks,
            cfg.block_size,
            cfg.enable_prefix_caching,
        );
        stats.kv_blocks_usable.store(pool.usable(), Relaxed);
        Engine {
            cfg,
            stats,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            running_seqs: 0,
            next_id: 0,
            ever_admitted: false,
            idle_since_ns: None,
        }
    }

    /// Queues a request (FIFO); it is admitted at a step boundary with enough free slots and
    /// KV blocks.
    pub fn submit(&mut self, job: Job<S>) {
        let n = job.n as usize;
        self.next_id += 1;
        self.waiting.push_back(Active {
            id: self.next_id,
            generated: vec![0; n],
            done: vec![false; n],
            live_seqs: job.n,
            blocks: vec![SeqBlocks::default(); n],
            admitted_ns: None,
            cached_tokens: 0,
            preemptions: 0,
            first_token_ns: None,
            last_token_ns: 0,
            itl_sum_ns: 0,
            itl_count: 0,
            last_finish: Finish::Length,
            step_out: vec![StepOut::Nothing; n],
            timings: None,
            job,
        });
        self.stats.waiting.store(self.waiting.len() as u64, Relaxed);
    }

    /// True when nothing is running or waiting.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Sequences in the batch.
    pub fn running_seqs(&self) -> u64 {
        self.running_seqs
    }

    /// Requests waiting.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// The KV cache's block pool.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Plans the step starting at `now_ns`: aborts requests whose client left, gives each
    /// running sequence room for this step's token (preempting the most recently admitted
    /// requests when blocks run out, as vLLM V1 does), admits waiting requests FIFO while `n`
    /// slots and their blocks are free (none after a preemption), and returns the step's
    /// duration in nanoseconds (`None` when there is nothing to run).
    pub fn begin_step(&mut self, now_ns: u64) -> Option<u64> {
        let mut aborted = 0u64;
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].job.sink.is_closed() {
                let mut a = self.running.remove(i);
                self.release_all(&mut a);
                aborted += 1;
            } else {
                i += 1;
            }
        }
        let before = self.waiting.len();
        self.waiting.retain(|a| !a.job.sink.is_closed());
        aborted += (before - self.waiting.len()) as u64;

        let preempted = self.make_room();
        let mut prefill_tokens = 0u64;
        let mut admitted_any = false;
        let max = u64::from(self.cfg.max_num_seqs);
        // No admission in a step that preempted (vLLM's scheduler does the same).
        while let Some(front) = self.waiting.front().filter(|_| preempted == 0) {
            // A request wider than the whole batch runs alone rather than blocking the queue forever.
            if self.running_seqs + u64::from(front.live_seqs) > max && self.running_seqs > 0 {
                break;
            }
            let Some(computed) = self.try_admit(now_ns) else {
                break;
            };
            prefill_tokens += computed;
            admitted_any = true;
        }
        if aborted > 0 {
            self.stats.aborted.fetch_add(aborted, Relaxed);
            self.stats.lock().finished_by_reason[2] += aborted;
        }
        self.stats.running.store(self.running_seqs, Relaxed);
        self.stats.waiting.store(self.waiting.len() as u64, Relaxed);
        self.publish_kv();
        if self.running.is_empty() {
            self.mark_idle(now_ns);
            return None;
        }
        let mut dur =
            self.cfg.decode_step_ns(self.running_seqs) + self.cfg.prefill_ns(prefill_tokens);
        if admitted_any {
            let idle_too_long = self
                .idle_since_ns
                .is_some_and(|t| now_ns.saturating_sub(t) as f64 > self.cfg.idle_reset_s * 1e9);
            if !self.ever_admitted || idle_too_long {
                dur += super::config::ms_to_ns(self.cfg.cold_start_ms);
            }
            self.ever_admitted = true;
        }
        self.idle_since_ns = None;
        Some(dur)
    }

    fn mark_idle(&mut self, now_ns: u64) {
        if self.idle_since_ns.is_none() {
            self.idle_since_ns = Some(now_ns);
        }
    }

    /// Completes the step ending at `end_ns`: every sequence in the batch gets one token; finished
    /// requests are reported. `wall_unix_s` is the wall second the tokens are attributed to.
    /// The ground-truth counters are updated before any event is delivered, so a client that has
    /// seen a token can rely on the counters including it. Returns the number of tokens generated.
    pub fn finish_step(&mut self, end_ns: u64, wall_unix_s: u64) -> u64 {
        let (mut tokens, mut prompt, mut finished_seqs, mut kv, mut finished_reqs) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        {
            let mut l = self.stats.lock();
            for a in self.running.iter_mut() {
                if a.first_token_ns.is_none() {
                    prompt += a.job.prompt_tokens;
                    a.first_token_ns = Some(end_ns);
                    l.ttft
                        .observe_n(secs(end_ns.saturating_sub(a.job.arrival_ns)), 1);
                } else {
                    let gap = end_ns.saturating_sub(a.last_token_ns);
                    l.itl.observe_n(secs(gap), u64::from(a.live_seqs));
                    a.itl_sum_ns += gap * u64::from(a.live_seqs);
                    a.itl_count += u64::from(a.live_seqs);
                }
                a.last_token_ns = end_ns;
                for c in 0..a.generated.len() {
                    if a.done[c] {
                        a.step_out[c] = StepOut::Nothing;
                        continue;
                    }
                    a.generated[c] += 1;
                    let g = a.generated[c];
                    let finish = if a.job.stop_after.get(c).copied().flatten() == Some(g) {
                        Some(Finish::Stop)
                    } else if g >= a.job.max_tokens {
                        Some(Finish::Length)
                    } else {
                        None
                    };
                    tokens += 1;
                    a.step_out[c] = StepOut::Token(finish);
                    a.register_filled(&mut self.pool, c);
                    if let Some(f) = finish {
                        a.done[c] = true;
                        a.live_seqs -= 1;
                        a.last_finish = f;
                        finished_seqs += 1;
                        self.pool.release(&mut a.blocks[c]);
                    }
                }
                if a.live_seqs > 0 {
                    let live = a.generated.iter().zip(&a.done).filter(|(_, d)| !**d);
                    kv += a.job.prompt_tokens * u64::from(a.live_seqs)
                        + live.map(|(g, _)| g).sum::<u64>();
                    continue;
                }
                let first_ns = a.first_token_ns.unwrap_or(end_ns);
                let t = Timings {
                    queue_ns: a
                        .admitted_ns
                        .unwrap_or(end_ns)
                        .saturating_sub(a.job.arrival_ns),
                    ttft_ns: first_ns.saturating_sub(a.job.arrival_ns),
                    mean_itl_ns: a.itl_sum_ns.checked_div(a.itl_count).unwrap_or(0),
                    e2e_ns: end_ns.saturating_sub(a.job.arrival_ns),
                    cached_tokens: a.cached_tokens,
                };
                l.e2e.observe_n(secs(t.e2e_ns), 1);
                l.finished_by_reason[if a.last_finish == Finish::Stop { 0 } else { 1 }] += 1;
                a.timings = Some(t);
                finished_reqs += 1;
            }
        }
        self.running_seqs -= finished_seqs;
        self.stats.prompt_tokens_total.fetch_add(prompt, Relaxed);
        self.stats.finished.fetch_add(finished_reqs, Relaxed);
        self.stats.kv_tokens.store(kv, Relaxed);
        self.stats.running.store(self.running_seqs, Relaxed);
        self.stats.record_generated(wall_unix_s, tokens);
        // The block truth leaves out the finished requests before their last events go out.
        self.publish_kv();
        self.running.retain_mut(|a| {
            deliver(a);
            a.timings.is_none()
        });
        if self.is_idle() {
            self.mark_idle(end_ns);
        }
        tokens
    }
}

/// Delivers what the step produced for `a`: its tokens, then `Done` when it finished.
fn deliver<S: Sink>(a: &mut Active<S>) {
    for (c, out) in a.step_out.iter().enumerate() {
        if let StepOut::Token(finish) = *out {
            a.job.sink.deliver(Ev::Token {
                choice: c as u32,
                finish,
            });
        }
    }
    if let Some(t) = a.timings {
        a.job.sink.deliver(Ev::Done(t));
    }
}

/// Nanoseconds to seconds.
pub(super) fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}
