//! vLLM's series, as vLLM names, describes and labels them: the simulator writes them
//! (`sim/metrics.rs`) and the scraper reads them from a real server (`scrape/prom_text.rs`), both
//! from these declarations. Help texts are vLLM's.

use super::metric::{Metric, Unit};
use super::{ITL_BUCKETS, REQUEST_BUCKETS, TTFT_BUCKETS};

/// The labels of every vLLM series: the engine index and the served model's name.
pub const LABELS: &[&str] = &["engine", "model_name"];

/// Sequences in the running batch.
pub const NUM_REQUESTS_RUNNING: Metric = Metric::gauge(
    "vllm:num_requests_running",
    "Number of requests in model execution batches.",
    Unit::Count("{request}"),
    LABELS,
);

/// Requests waiting for a slot.
pub const NUM_REQUESTS_WAITING: Metric = Metric::gauge(
    "vllm:num_requests_waiting",
    "Number of requests waiting to be processed.",
    Unit::Count("{request}"),
    LABELS,
);

/// KV-cache use, a fraction.
pub const KV_CACHE_USAGE_PERC: Metric = Metric::gauge(
    "vllm:kv_cache_usage_perc",
    "KV-cache usage. 1 means 100 percent usage.",
    Unit::Ratio,
    LABELS,
);

/// The name older vLLM releases gave [`KV_CACHE_USAGE_PERC`]: read when the new one is absent,
/// never written.
pub const GPU_CACHE_USAGE_PERC: Metric = Metric::gauge(
    "vllm:gpu_cache_usage_perc",
    "GPU KV-cache usage. 1 means 100 percent usage.",
    Unit::Ratio,
    LABELS,
);

/// Prompt tokens prefilled.
pub const PROMPT_TOKENS_TOTAL: Metric = Metric::counter(
    "vllm:prompt_tokens_total",
    "Number of prefill tokens processed.",
    Unit::Count("{token}"),
    LABELS,
);

/// Tokens generated.
pub const GENERATION_TOKENS_TOTAL: Metric = Metric::counter(
    "vllm:generation_tokens_total",
    "Number of generation tokens processed.",
    Unit::Count("{token}"),
    LABELS,
);

/// Finished requests by finish reason ([`FINISHED_REASONS`]).
pub const REQUEST_SUCCESS_TOTAL: Metric = Metric::counter(
    "vllm:request_success_total",
    "Count of successfully processed requests.",
    Unit::Count("{request}"),
    &["engine", "finished_reason", "model_name"],
);

/// Values of `finished_reason` on [`REQUEST_SUCCESS_TOTAL`].
pub const FINISHED_REASONS: [&str; 5] = ["stop", "length", "abort", "error", "repetition"];

/// Arrival to the first token, per request.
pub const TIME_TO_FIRST_TOKEN_SECONDS: Metric = Metric::histogram(
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    Unit::Seconds,
    LABELS,
    TTFT_BUCKETS,
);

/// The gap between consecutive tokens of a sequence.
pub const INTER_TOKEN_LATENCY_SECONDS: Metric = Metric::histogram(
    "vllm:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    Unit::Seconds,
    LABELS,
    &ITL_BUCKETS,
);

/// Arrival to the last token, per finished request.
pub const E2E_REQUEST_LATENCY_SECONDS: Metric = Metric::histogram(
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    Unit::Seconds,
    LABELS,
    REQUEST_BUCKETS,
);

/// Arrival to the start of the step that admitted the request.
pub const REQUEST_QUEUE_TIME_SECONDS: Metric = Metric::histogram(
    "vllm:request_queue_time_seconds",
    "Histogram of time spent in WAITING phase for request.",
    Unit::Seconds,
    LABELS,
    REQUEST_BUCKETS,
);

/// Waiting requests by why they wait ([`WAITING_REASONS`]); the reasons sum to
/// [`NUM_REQUESTS_WAITING`].
pub const NUM_REQUESTS_WAITING_BY_REASON: Metric = Metric::gauge(
    "vllm:num_requests_waiting_by_reason",
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    Unit::Count("{request}"),
    &["engine", "model_name", "reason"],
);

/// Values of `reason` on [`NUM_REQUESTS_WAITING_BY_REASON`].
pub const WAITING_REASONS: [&str; 2] = ["capacity", "deferred"];

/// Running requests preempted (their KV blocks freed, to be computed again).
pub const NUM_PREEMPTIONS_TOTAL: Metric = Metric::counter(
    "vllm:num_preemptions_total",
    "Cumulative number of preemption from the engine.",
    Unit::Count("{preemption}"),
    LABELS,
);

/// Prompt tokens looked up in the prefix cache.
pub const PREFIX_CACHE_QUERIES_TOTAL: Metric = Metric::counter(
    "vllm:prefix_cache_queries_total",
    "Prefix cache queries, in terms of number of queried tokens.",
    Unit::Count("{token}"),
    LABELS,
);

/// Prompt tokens found in the prefix cache.
pub const PREFIX_CACHE_HITS_TOTAL: Metric = Metric::counter(
    "vllm:prefix_cache_hits_total",
    "Prefix cache hits, in terms of number of cached tokens.",
    Unit::Count("{token}"),
    LABELS,
);

/// Cached prompt tokens of admitted requests.
pub const PROMPT_TOKENS_CACHED_TOTAL: Metric = Metric::counter(
    "vllm:prompt_tokens_cached_total",
    "Number of cached prompt tokens (local + external).",
    Unit::Count("{token}"),
    LABELS,
);

/// The label names of [`CACHE_CONFIG_INFO`], as vLLM 0.32 writes them (name order).
pub const CACHE_CONFIG_LABELS: &[&str] = &[
    "_block_size_resolved",
    "block_size",
    "cache_dtype",
    "cache_hit_alignment_tokens",
    "effective_attention_block_size",
    "enable_mamba_shared_prefix_checkpoint",
    "enable_prefix_caching",
    "engine",
    "gpu_memory_utilization",
    "hash_block_size",
    "is_attention_free",
    "kv_cache_dtype_skip_layers",
    "kv_cache_layout",
    "kv_cache_max_concurrency",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "kv_offloading_backend",
    "kv_offloading_size",
    "kv_sharing_fast_prefill",
    "mamba_block_size",
    "mamba_cache_dtype",
    "mamba_cache_mode",
    "mamba_page_size_padded",
    "mamba_ssm_cache_dtype",
    "num_cpu_blocks",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "prefix_cache_retention_interval",
    "prefix_caching_hash_algo",
    "prefix_match_unit",
    "replayssm_buffer_len",
    "skip_page_size_padded",
    "sliding_window",
    "swa_bounded_replay",
    "use_kda_recoverssm",
    "use_replayssm",
    "user_specified_block_size",
];

/// The KV cache's configuration as labels (always 1).
pub const CACHE_CONFIG_INFO: Metric = Metric::gauge(
    "vllm:cache_config_info",
    "Information of the LLMEngine CacheConfig",
    Unit::Info,
    CACHE_CONFIG_LABELS,
);
