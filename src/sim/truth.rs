//! The simulator's KV-cache ground truth, `GET /sim/truth`: the blocks each running request
//! holds and the cache's counters, read at one step boundary.

use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;

use super::config::SimConfig;
use super::metrics::{RequestKv, Stats};

/// The KV cache's ground truth at the engine's last step boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KvTruth {
    /// Tokens per block.
    pub block_size: u64,
    /// Blocks configured (`num_gpu_blocks`, one of them vLLM's null block).
    pub num_gpu_blocks: u64,
    /// Blocks that can hold tokens (`num_gpu_blocks − 1`).
    pub usable_blocks: u64,
    /// Prefix caching on.
    pub enable_prefix_caching: bool,
    /// Σ over running sequences of the blocks in their block tables. While a step runs (the
    /// engine publishes when it schedules one) that is ceil((prompt + generated) / block_size)
    /// per sequence, as vLLM V1 allocates for the tokens a step computes; it equals
    /// `blocks_in_use` when prefix caching is off (no block is shared).
    pub blocks_held: u64,
    /// Distinct blocks in use (shared prefix blocks once); `vllm:kv_cache_usage_perc` =
    /// `blocks_in_use / usable_blocks`.
    pub blocks_in_use: u64,
    /// Blocks findable by prefix hash (in use or free).
    pub cached_blocks: u64,
    /// Cached blocks evicted so far.
    pub evictions: u64,
    /// Preemptions so far (`vllm:num_preemptions_total`).
    pub preemptions: u64,
    /// `vllm:prefix_cache_queries_total`.
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits_total`.
    pub prefix_cache_hits: u64,
    /// `vllm:prompt_tokens_cached_total`.
    pub prompt_tokens_cached: u64,
    /// Sequences running (`vllm:num_requests_running`).
    pub running: u64,
    /// Requests waiting, preempted ones included (`vllm:num_requests_waiting`).
    pub waiting: u64,
    /// The running requests, in admission order.
    pub requests: Vec<RequestKv>,
}

impl KvTruth {
    /// Reads the truth from `stats` (one moment: the engine publishes it under the same lock).
    pub fn read(stats: &Stats, cfg: &SimConfig) -> Self {
        let l = stats.lock();
        let usable = stats.kv_blocks_usable.load(Relaxed);
        KvTruth {
            block_size: u64::from(cfg.block_size),
            num_gpu_blocks: u64::from(cfg.num_gpu_blocks),
            usable_blocks: usable,
            enable_prefix_caching: cfg.enable_prefix_caching,
            blocks_held: stats.kv_blocks_held.load(Relaxed),
            blocks_in_use: stats.kv_blocks_used.load(Relaxed),
            cached_blocks: stats.kv_cached_blocks.load(Relaxed),
            evictions: stats.kv_evictions.load(Relaxed),
            preemptions: stats.preemptions.load(Relaxed),
            prefix_cache_queries: stats.prefix_cache_queries.load(Relaxed),
            prefix_cache_hits: stats.prefix_cache_hits.load(Relaxed),
            prompt_tokens_cached: stats.prompt_tokens_cached.load(Relaxed),
            running: stats.running.load(Relaxed),
            waiting: stats.waiting_total(),
            requests: l.kv_requests.clone(),
        }
    }
}
