//! KV-cache figures from live traffic: the context each request holds at its end, how many
//! sequences of the observed p50/p90/p99 context the upstream's KV cache holds (beside the
//! capacity at the service level and `--max-num-seqs`), the blocks the in-flight requests hold
//! by the proxy's own count beside vLLM's usage, and the headroom before preemption.
//! Definitions: `docs/kv-cache.md`.

use std::collections::VecDeque;

use serde::Serialize;

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::record::RequestRecord;
use crate::scrape::KvValues;

use super::histogram::nearest_rank;

/// Contexts kept per scope for its distribution: the newest this many within the horizon.
pub const MAX_CONTEXTS_KEPT: usize = 4096;

/// The contexts (prompt + completion tokens) of a scope's finished requests.
#[derive(Debug, Clone, Default)]
pub struct ContextSizes {
    /// `(finish time, context tokens)`, oldest first.
    recent: VecDeque<(UnixNanos, u64)>,
    /// The largest context since the scope appeared.
    max_since_start: Option<u64>,
}

/// A request's context at its end: the tokens its sequence holds in the KV cache, prompt plus
/// generated; `None` when either count is unknown (no usage).
pub fn context_tokens(record: &RequestRecord) -> Option<u64> {
    Some(record.prompt_tokens? + record.completion_tokens?)
}

impl ContextSizes {
    /// Counts a finished request (those without a known context are left out).
    pub fn add(&mut self, now: UnixNanos, record: &RequestRecord) {
        let Some(c) = context_tokens(record) else {
            return;
        };
        if self.recent.len() == MAX_CONTEXTS_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back((now, c));
        self.max_since_start = Some(self.max_since_start.map_or(c, |m| m.max(c)));
    }

    /// Forgets contexts of requests that finished before second `min_sec`.
    pub fn evict_before(&mut self, min_sec: u64) {
        let min_ns = min_sec.saturating_mul(NANOS_PER_SEC);
        while self.recent.front().is_some_and(|(t, _)| *t < min_ns) {
            self.recent.pop_front();
        }
    }

    /// The distribution of contexts of requests that finished in `[from, to)`.
    pub fn view(&self, from: UnixNanos, to: UnixNanos) -> ContextView {
        let mut v: Vec<u64> = self
            .recent
            .iter()
            .filter(|(t, _)| (from..to).contains(t))
            .map(|(_, c)| *c)
            .collect();
        ContextView::of(&mut v, self.max_since_start)
    }
}

/// Context sizes (prompt + completion tokens of finished requests), exact nearest-rank
/// percentiles; `null` without a request of known context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ContextView {
    /// Requests counted (finished, with prompt and completion tokens known).
    pub requests: u64,
    /// Median context, tokens.
    pub p50: Option<u64>,
    /// 90th percentile, tokens.
    pub p90: Option<u64>,
    /// 99th percentile, tokens.
    pub p99: Option<u64>,
    /// Largest, tokens.
    pub max: Option<u64>,
    /// Largest since the scope appeared in the live view (beyond the horizon too), tokens.
    pub max_since_start: Option<u64>,
}

impl ContextView {
    /// The distribution of `v` (sorted in place).
    pub fn of(v: &mut [u64], max_since_start: Option<u64>) -> Self {
        v.sort_unstable();
        ContextView {
            requests: v.len() as u64,
            p50: nearest_rank(v, 0.5),
            p90: nearest_rank(v, 0.9),
            p99: nearest_rank(v, 0.99),
            max: v.last().copied(),
            max_since_start,
        }
    }
}

/// The upstream's KV cache as its last scrape gave it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct KvCache {
    /// `num_gpu_blocks` of `vllm:cache_config_info`.
    pub num_gpu_blocks: Option<u64>,
    /// `block_size`, tokens per block.
    pub block_size: Option<u64>,
    /// `kv_cache_size_tokens`.
    pub kv_cache_size_tokens: Option<u64>,
    /// `enable_prefix_caching`.
    pub enable_prefix_caching: Option<bool>,
    /// How sequences are counted: `"blocks"` (blocks and block size known, block rounding),
    /// `"tokens"` (only the size in tokens: no block rounding, an upper bound), `null` unknown.
    pub basis: Option<&'static str>,
}

impl KvCache {
    /// From a scrape's values.
    pub fn of(v: &KvValues) -> Self {
        let basis = match (v.num_gpu_blocks, v.block_size, v.kv_cache_size_tokens) {
            (Some(_), Some(_), _) => Some("blocks"),
            (_, _, Some(_)) => Some("tokens"),
            _ => None,
        };
        KvCache {
            num_gpu_blocks: v.num_gpu_blocks,
            block_size: v.block_size.filter(|b| *b > 0),
            kv_cache_size_tokens: v.kv_cache_size_tokens,
            enable_prefix_caching: v.enable_prefix_caching,
            basis,
        }
    }

    /// Blocks that can hold tokens: `num_gpu_blocks − 1` (vLLM keeps one as its null block, and
    /// `kv_cache_usage_perc` is blocks in use over these).
    pub fn usable_blocks(&self) -> Option<u64> {
        Some(self.num_gpu_blocks?.saturating_sub(1))
    }

    /// Blocks a sequence of `tokens` holds: `ceil(tokens / block_size)`.
    pub fn blocks_of(&self, tokens: u64) -> Option<u64> {
        Some(tokens.div_ceil(self.block_size?))
    }

    /// Sequences of `context` tokens the cache holds at once:
    /// `floor(num_gpu_blocks / ceil(context / block_size))`, or without blocks
    /// `floor(kv_cache_size_tokens / context)`.
    pub fn sequences_fit(&self, context: u64) -> Option<u64> {
        let context = context.max(1);
        if let (Some(n), Some(per)) = (self.num_gpu_blocks, self.blocks_of(context)) {
            return Some(n / per);
        }
        Some(self.kv_cache_size_tokens? / context)
    }
}

/// One row of the live table: at a percentile of the observed context, the three limits on
/// concurrent sequences and which is lowest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvTableRow {
    /// `"p50"`, `"p90"` or `"p99"`.
    pub percentile: &'static str,
    /// The context at that percentile, tokens (the horizon's finished requests).
    pub context_tokens: Option<u64>,
    /// Sequences of that context the KV cache holds ([`KvCache::sequences_fit`]).
    pub kv_sequences: Option<u64>,
    /// The capacity at the service level (`service_level.capacity.in_flight`), the compute answer.
    pub service_level_in_flight: Option<u32>,
    /// `--max-num-seqs` (the `[meter]` setting `max_num_seqs`; vLLM does not export it).
    pub max_num_seqs: Option<u32>,
    /// The lowest of the three known limits: `"kv_cache"`, `"service_level"` or
    /// `"max_num_seqs"` (ties: in that order); `null` when none is known.
    pub binds_first: Option<&'static str>,
}

/// The proxy's count of blocks its in-flight requests hold, beside vLLM's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvEstimate {
    /// Requests in flight through the proxy.
    pub in_flight: u64,
    /// Of them, those whose prompt size is not known yet (no usage on their events): they are
    /// counted by their generated tokens only, so `blocks` is then a lower bound.
    pub prompt_unknown: u64,
    /// Tokens they hold: Σ (prompt + generated so far).
    pub tokens: u64,
    /// Blocks they hold: Σ ceil((prompt + generated so far) / block_size); `null` without a
    /// block size.
    pub blocks: Option<u64>,
    /// vLLM's blocks in use: `kv_cache_usage_perc × (num_gpu_blocks − 1)` of the last scrape.
    pub server_blocks: Option<f64>,
    /// `server_blocks − blocks`: > 0 is traffic that bypassed the proxy (or blocks not yet
    /// freed); < 0 is prefix blocks shared between sequences (counted once by vLLM).
    pub diff_blocks: Option<f64>,
}

/// How many more sequences of today's p90 context fit before preemption.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvHeadroom {
    /// Blocks in use: the larger of the proxy's estimate and vLLM's count.
    pub used_blocks: Option<f64>,
    /// `used_blocks / (num_gpu_blocks − 1)`.
    pub used_fraction: Option<f64>,
    /// `floor((num_gpu_blocks − 1 − used_blocks) / ceil(p90 context / block_size))`, at least 0.
    pub sequences_p90: Option<u64>,
    /// `used_fraction ≥ threshold_pct / 100`: the cache is near full.
    pub warning: Option<bool>,
    /// The `[meter]` setting `kv_headroom_threshold_pct`.
    pub threshold_pct: u32,
    /// Net growth of the live estimate's `blocks` over the shortest window, blocks per second:
    /// `(blocks now − blocks at the start of the window) / its seconds`, arrivals, context
    /// growth and departures together; `null` before a window of history (or without a block
    /// size).
    pub growth_blocks_per_s: Option<f64>,
    /// Seconds until the cache is full at that growth: `(num_gpu_blocks − 1 − used_blocks) /
    /// growth_blocks_per_s`, only while it grows (else `null`: not filling).
    pub seconds_to_full: Option<f64>,
    /// Why the figures are `null`, when they are.
    pub reason: Option<String>,
}

/// The live estimate's blocks at the first event of each second that had one, oldest first: the
/// history its growth is read from. Every event ticks the meter first, so between two points
/// only the first point's second changed the blocks: the blocks at the start of any second
/// after a point are the next point's (or, after the last, the current).
#[derive(Debug, Clone, Default)]
pub struct BlockHistory {
    points: VecDeque<(u64, u64)>,
}

impl BlockHistory {
    /// Keeps `blocks` at second `sec`, forgetting the points a window of `keep_s` seconds no
    /// longer needs (the latest at or before its start stays).
    pub fn push(&mut self, sec: u64, blocks: u64, keep_s: u64) {
        self.points.push_back((sec, blocks));
        let start = sec.saturating_sub(keep_s);
        while self.points.get(1).is_some_and(|(s, _)| *s <= start) {
            self.points.pop_front();
        }
    }

    /// `(blocks_now − blocks at the start of second sec − window_s) / window_s`; `None` while
    /// the history does not reach back to that second.
    pub fn growth(&self, sec: u64, blocks_now: u64, window_s: u64) -> Option<f64> {
        let from = sec.checked_sub(window_s).filter(|_| window_s > 0)?;
        if self.points.front()?.0 > from {
            return None;
        }
        let then = self
            .points
            .iter()
            .find(|(s, _)| *s >= from)
            .map_or(blocks_now, |(_, b)| *b);
        Some((blocks_now as f64 - then as f64) / window_s as f64)
    }
}

/// The `kv` object of `/stats`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvView {
    /// The cache, from the last scrape; `null` without a scrape carrying `cache_config_info`.
    pub cache: Option<KvCache>,
    /// Why `cache` is `null`.
    pub cache_reason: Option<String>,
    /// Contexts of the horizon's finished requests.
    pub contexts: ContextView,
    /// The live table at p50, p90 and p99.
    pub table: Vec<KvTableRow>,
    /// The live KV estimate.
    pub estimate: KvEstimate,
    /// Headroom before preemption.
    pub headroom: KvHeadroom,
}

/// The lowest known limit; ties go to the first named.
pub fn binds_first(
    kv: Option<u64>,
    service: Option<u32>,
    seqs: Option<u32>,
) -> Option<&'static str> {
    [
        ("kv_cache", kv),
        ("service_level", service.map(u64::from)),
        ("max_num_seqs", seqs.map(u64::from)),
    ]
    .into_iter()
    .filter_map(|(n, v)| Some((n, v?)))
    .min_by_key(|(_, v)| *v)
    .map(|(n, _)| n)
}

/// The live table's rows.
pub fn table(
    cache: Option<&KvCache>,
    contexts: &ContextView,
    service_level_in_flight: Option<u32>,
    max_num_seqs: Option<u32>,
) -> Vec<KvTableRow> {
    [
        ("p50", contexts.p50),
        ("p90", contexts.p90),
        ("p99", contexts.p99),
    ]
    .into_iter()
    .map(|(percentile, context_tokens)| {
        let kv_sequences = cache
            .zip(context_tokens)
            .and_then(|(c, t)| c.sequences_fit(t));
        KvTableRow {
            percentile,
            context_tokens,
            kv_sequences,
            service_level_in_flight,
            max_num_seqs,
            binds_first: binds_first(kv_sequences, service_level_in_flight, max_num_seqs),
        }
    })
    .collect()
}

/// The headroom from the estimate, the cache, the p90 context and the estimate's growth.
pub fn headroom(
    cache: Option<&KvCache>,
    estimate: &KvEstimate,
    p90: Option<u64>,
    threshold_pct: u32,
    growth_blocks_per_s: Option<f64>,
) -> KvHeadroom {
    let mut h = KvHeadroom {
        used_blocks: None,
        used_fraction: None,
        sequences_p90: None,
        warning: None,
        threshold_pct,
        growth_blocks_per_s,
        seconds_to_full: None,
        reason: None,
    };
    let Some((cache, total)) = cache.and_then(|c| Some((c, c.usable_blocks()?))) else {
        h.reason =
            Some("the KV cache's blocks are unknown (no scrape of cache_config_info)".into());
        return h;
    };
    let used = match (estimate.blocks.map(|b| b as f64), estimate.server_blocks) {
        (Some(a), Some(b)) => a.max(b),
        (a, b) => match a.or(b) {
            Some(u) => u,
            None => {
                h.reason = Some("neither the proxy's estimate nor vLLM's usage is known".into());
                return h;
            }
        },
    };
    h.used_blocks = Some(used);
    h.seconds_to_full = growth_blocks_per_s
        .filter(|g| *g > 0.0)
        .map(|g| (total as f64 - used).max(0.0) / g);
    if total > 0 {
        let f = used / total as f64;
        h.used_fraction = Some(f);
        h.warning = Some(f * 100.0 >= threshold_pct as f64);
    }
    match p90.and_then(|c| cache.blocks_of(c.max(1))) {
        Some(per) => {
            let free = (total as f64 - used).max(0.0).floor() as u64;
            h.sequences_p90 = Some(free / per.max(1));
        }
        None => h.reason = Some("no finished request of known context yet (p90 unknown)".into()),
    }
    h
}
