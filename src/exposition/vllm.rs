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
