//! Ground-truth counters, vLLM-named histograms, the per-second token ring and the Prometheus text
//! (vLLM's series, declared in [`crate::exposition::vllm`]).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use super::config::SimConfig;
use crate::exposition::vllm::{self, FINISHED_REASONS};
use crate::exposition::{Metric, Style, Text};

/// A cumulative-on-render histogram in seconds.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum_s: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending, +Inf implied).
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum_s: 0.0,
            count: 0,
        }
    }

    /// Adds `n` observations of `value_s` seconds.
    pub fn observe_n(&mut self, value_s: f64, n: u64) {
        if n == 0 {
            return;
        }
        let i = self
            .bounds
            .iter()
            .position(|b| value_s <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[i] += n;
        self.sum_s += value_s * n as f64;
        self.count += n;
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Everything behind a lock that the engine updates once per step (never per token).
#[derive(Debug)]
pub struct Locked {
    /// `vllm:time_to_first_token_seconds`: arrival → first token, per request.
    pub ttft: Histogram,
    /// `vllm:inter_token_latency_seconds`: gap between consecutive tokens of a sequence.
    pub itl: Histogram,
    /// `vllm:e2e_request_latency_seconds`: arrival → last token, per finished request.
    pub e2e: Histogram,
    /// `vllm:request_queue_time_seconds`: arrival → start of the step that admitted it.
    pub queue: Histogram,
    /// Finished requests by [`FINISHED_REASONS`] index.
    pub finished_by_reason: [u64; 5],
    /// The KV blocks of each running request, as of the engine's last step boundary.
    pub kv_requests: Vec<RequestKv>,
}

/// The KV blocks one running request holds: the sim's ground truth (`/sim/truth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RequestKv {
    /// The engine's number for the request (in order of arrival at the engine).
    pub id: u64,
    /// Its prompt tokens.
    pub prompt_tokens: u64,
    /// Tokens generated so far, all its sequences together.
    pub generated_tokens: u64,
    /// Σ over its live sequences of the blocks in its block table: ceil((prompt + generated) /
    /// block_size) while a step runs (published when it is scheduled).
    pub blocks: u64,
    /// Prompt tokens found in the prefix cache at its first admission.
    pub cached_tokens: u64,
    /// Times it was preempted.
    pub preemptions: u64,
}

/// Shared live statistics: atomics for the gauges and counters, one lock for the rest.
#[derive(Debug)]
pub struct Stats {
    /// Tokens generated (including those of aborted requests).
    pub generation_tokens_total: AtomicU64,
    /// Prompt tokens prefilled.
    pub prompt_tokens_total: AtomicU64,
    /// Sequences in the running batch.
    pub running: AtomicU64,
    /// Requests in the engine's queue waiting for a slot (n > 1 counts as one request).
    pub waiting: AtomicU64,
    /// Requests accepted by the HTTP side but not yet taken in by the engine (it drains its input
    /// at step boundaries); they are waiting too.
    pub inflight: AtomicU64,
    /// Requests finished normally (stop or length).
    pub finished: AtomicU64,
    /// Requests aborted by the client disconnecting.
    pub aborted: AtomicU64,
    /// Tokens held in the KV cache by running sequences (prompt + generated).
    pub kv_tokens: AtomicU64,
    /// Σ over running sequences of ceil((prompt + generated) / block_size): the blocks their
    /// tokens fill, each sequence counted alone (shared prefix blocks once per sequence).
    pub kv_blocks_held: AtomicU64,
    /// Distinct KV blocks in use now (shared blocks once; includes the block a step is about to
    /// write into); `vllm:kv_cache_usage_perc` = this / [`Stats::kv_blocks_usable`].
    pub kv_blocks_used: AtomicU64,
    /// Blocks that can hold tokens (`num_gpu_blocks − 1`).
    pub kv_blocks_usable: AtomicU64,
    /// Blocks findable by prefix hash now.
    pub kv_cached_blocks: AtomicU64,
    /// Cached blocks evicted (reused for other tokens) so far.
    pub kv_evictions: AtomicU64,
    /// Running requests preempted (blocks freed, back to waiting) so far.
    pub preemptions: AtomicU64,
    /// `vllm:prefix_cache_queries`: prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: AtomicU64,
    /// `vllm:prefix_cache_hits`: of those, tokens found.
    pub prefix_cache_hits: AtomicU64,
    /// `vllm:prompt_tokens_cached`: cached prompt tokens of admitted requests, once each.
    pub prompt_tokens_cached: AtomicU64,
    /// Decode steps executed.
    pub steps: AtomicU64,
    /// Largest step lag (actual wake − scheduled deadline), nanoseconds.
    pub lag_max_ns: AtomicU64,
    /// Sum of step lags, nanoseconds.
    pub lag_sum_ns: AtomicU64,
    /// Steps that re-anchored the schedule because they woke too late.
    pub resyncs: AtomicU64,
    /// Total time lost to those late wakes, nanoseconds.
    pub slip_ns: AtomicU64,
    /// Histograms and finish reasons.
    pub locked: Mutex<Locked>,
    /// Per-second ground truth, lock-free: each slot packs `(unix_second << 32) | tokens`.
    ring: Vec<AtomicU64>,
}

impl Stats {
    /// Fresh statistics keeping `window_s` seconds of per-second ground truth.
    pub fn new(window_s: u64) -> Self {
        let z = || AtomicU64::new(0);
        Stats {
            generation_tokens_total: z(),
            prompt_tokens_total: z(),
            running: z(),
            waiting: z(),
            inflight: z(),
            finished: z(),
            aborted: z(),
            kv_tokens: z(),
            kv_blocks_held: z(),
            kv_blocks_used: z(),
            kv_blocks_usable: z(),
            kv_cached_blocks: z(),
            kv_evictions: z(),
            preemptions: z(),
            prefix_cache_queries: z(),
            prefix_cache_hits: z(),
            prompt_tokens_cached: z(),
            steps: z(),
            lag_max_ns: z(),
            lag_sum_ns: z(),
            resyncs: z(),
            slip_ns: z(),
            locked: Mutex::new(Locked {
                ttft: Histogram::new(vllm::TIME_TO_FIRST_TOKEN_SECONDS.buckets),
                itl: Histogram::new(vllm::INTER_TOKEN_LATENCY_SECONDS.buckets),
                e2e: Histogram::new(vllm::E2E_REQUEST_LATENCY_SECONDS.buckets),
                queue: Histogram::new(vllm::REQUEST_QUEUE_TIME_SECONDS.buckets),
                finished_by_reason: [0; 5],
                kv_requests: Vec::new(),
            }),
            ring: (0..window_s.max(1))
                .map(|_| AtomicU64::new(u64::MAX))
                .collect(),
        }
    }

    /// All waiting requests: queued in the engine or handed over but not yet drained.
    pub fn waiting_total(&self) -> u64 {
        self.waiting.load(Relaxed) + self.inflight.load(Relaxed)
    }

    /// Records one step's lag.
    pub fn record_lag(&self, lag_ns: u64) {
        self.steps.fetch_add(1, Relaxed);
        self.lag_sum_ns.fetch_add(lag_ns, Relaxed);
        self.lag_max_ns.fetch_max(lag_ns, Relaxed);
    }

    /// Records a re-anchoring of the schedule after a wake `lag_ns` late.
    pub fn record_slip(&self, lag_ns: u64) {
        self.resyncs.fetch_add(1, Relaxed);
        self.slip_ns.fetch_add(lag_ns, Relaxed);
    }

    /// Adds `tokens` to the generated total and to the ring slot of wall second `unix_s`.
    pub fn record_generated(&self, unix_s: u64, tokens: u64) {
        if tokens == 0 {
            return;
        }
        self.generation_tokens_total.fetch_add(tokens, Relaxed);
        let slot = &self.ring[(unix_s % self.ring.len() as u64) as usize];
        let sec = unix_s & 0xffff_ffff;
        let mut cur = slot.load(Relaxed);
        loop {
            // A slot holding an older second restarts at 0 for this one; counts saturate at 2^32 − 1.
            let count = if cur >> 32 == sec {
                cur & 0xffff_ffff
            } else {
                0
            };
            let next = (sec << 32) | (count + tokens).min(0xffff_ffff);
            match slot.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Tokens generated in wall seconds `[from_s, to_s)` still held by the ring.
    pub fn generated_in(&self, from_s: u64, to_s: u64) -> u64 {
        self.ring
            .iter()
            .map(|slot| slot.load(Relaxed))
            .filter(|v| *v != u64::MAX && (v >> 32) >= from_s && (v >> 32) < to_s)
            .map(|v| v & 0xffff_ffff)
            .sum()
    }

    /// The locked part; a poisoned lock still yields its data (counters stay usable).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Locked> {
        self.locked
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Renders `/metrics` in Prometheus text format with vLLM's names, help texts and labels.
pub fn render(stats: &Stats, cfg: &SimConfig) -> String {
    let mut out = String::with_capacity(12288);
    let mut w = Text::new(&mut out, Style::Python);
    let model = cfg.served_model_name.as_str();
    let labels = ["0", model];
    let usable = stats.kv_blocks_usable.load(Relaxed);
    let kv = stats.kv_blocks_used.load(Relaxed) as f64 / usable.max(1) as f64;
    let waiting = stats.waiting_total() as f64;
    let levels: [(&Metric, f64); 3] = [
        (
            &vllm::NUM_REQUESTS_RUNNING,
            stats.running.load(Relaxed) as f64,
        ),
        (&vllm::NUM_REQUESTS_WAITING, waiting),
        (&vllm::KV_CACHE_USAGE_PERC, kv.min(1.0)),
    ];
    for (m, v) in levels {
        w.header(m);
        w.sample(m, labels, v);
    }
    let m = &vllm::NUM_REQUESTS_WAITING_BY_REASON;
    w.header(m);
    for (reason, v) in vllm::WAITING_REASONS.iter().zip([waiting, 0.0]) {
        w.sample(m, ["0", model, reason], v);
    }
    let counters: [(&Metric, &AtomicU64); 6] = [
        (&vllm::PROMPT_TOKENS_TOTAL, &stats.prompt_tokens_total),
        (
            &vllm::GENERATION_TOKENS_TOTAL,
            &stats.generation_tokens_total,
        ),
        (&vllm::NUM_PREEMPTIONS_TOTAL, &stats.preemptions),
        (
            &vllm::PREFIX_CACHE_QUERIES_TOTAL,
            &stats.prefix_cache_queries,
        ),
        (&vllm::PREFIX_CACHE_HITS_TOTAL, &stats.prefix_cache_hits),
        (
            &vllm::PROMPT_TOKENS_CACHED_TOTAL,
            &stats.prompt_tokens_cached,
        ),
    ];
    for (m, v) in counters {
        w.header(m);
        w.sample(m, labels, v.load(Relaxed) as f64);
    }
    let l = stats.lock();
    let m = &vllm::REQUEST_SUCCESS_TOTAL;
    w.header(m);
    for (reason, n) in FINISHED_REASONS.iter().zip(l.finished_by_reason) {
        w.sample(m, ["0", reason, model], n);
    }
    for (m, h) in [
        (&vllm::TIME_TO_FIRST_TOKEN_SECONDS, &l.ttft),
        (&vllm::INTER_TOKEN_LATENCY_SECONDS, &l.itl),
        (&vllm::E2E_REQUEST_LATENCY_SECONDS, &l.e2e),
        (&vllm::REQUEST_QUEUE_TIME_SECONDS, &l.queue),
    ] {
        w.header(m);
        w.histogram(m, labels, &h.counts, h.count, h.sum_s);
    }
    drop(l);
    let m = &vllm::CACHE_CONFIG_INFO;
    w.header(m);
    w.sample(
        m,
        cache_config_values(cfg).each_ref().map(String::as_str),
        1.0,
    );
    out
}

/// The values of `vllm:cache_config_info`'s labels ([`vllm::CACHE_CONFIG_LABELS`], same order):
/// the simulator's settings where it has them, vLLM 0.32's defaults (as recorded) elsewhere.
pub fn cache_config_values(cfg: &SimConfig) -> [String; 37] {
    let py_bool = |b: bool| if b { "True" } else { "False" }.to_string();
    let s = |v: &str| v.to_string();
    let bs = cfg.block_size.to_string();
    let tokens = cfg.kv_cache_tokens();
    // vLLM's kv_cache_max_concurrency: requests of max_model_len tokens the cache holds at once.
    let concurrency = tokens as f64 / cfg.max_model_len.max(1) as f64;
    [
        s("True"),
        bs.clone(),
        s("auto"),
        s("None"),
        bs,
        s("False"),
        py_bool(cfg.enable_prefix_caching),
        s("0"),
        s("0.92"),
        s("None"),
        s("False"),
        s("[]"),
        s("None"),
        format!("{concurrency:?}"),
        s("None"),
        tokens.to_string(),
        s("native"),
        s("None"),
        s("False"),
        s("None"),
        s("auto"),
        s("none"),
        s("None"),
        s("auto"),
        s("None"),
        cfg.num_gpu_blocks.to_string(),
        s("None"),
        s("0"),
        s("sha256"),
        s("None"),
        s("16"),
        s("None"),
        s("None"),
        s("True"),
        s("False"),
        s("False"),
        s("False"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sums_by_second_and_forgets_old_seconds() {
        let s = Stats::new(10);
        s.record_generated(100, 5);
        s.record_generated(101, 7);
        s.record_generated(101, 1);
        assert_eq!(s.generated_in(100, 102), 13);
        assert_eq!(s.generated_in(101, 102), 8);
        s.record_generated(110, 2); // same slot as 100: overwrites it
        assert_eq!(s.generated_in(100, 101), 0);
        assert_eq!(s.generated_in(0, 200), 10);
    }

    #[test]
    fn histogram_buckets_are_cumulative_in_text() {
        let s = Stats::new(1);
        s.lock().ttft.observe_n(0.03, 2);
        let cfg = SimConfig {
            served_model_name: "m".into(),
            ..SimConfig::default()
        };
        let text = render(&s, &cfg);
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.02\",model_name=\"m\"} 0.0"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.04\",model_name=\"m\"} 2.0"));
        assert!(text.contains("vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 2.0"));
        assert!(text
            .contains("vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"m\"} 2.0"));
    }
}
