//! The simulator's configuration: model timing, limits and wire options (TOML or CLI flags).

use serde::Deserialize;

/// Everything the simulator needs to know; every field has a default, units are in the names.
///
/// Timing model (continuous batching): a step lasts
/// `step_base_ms + step_per_seq_ms × running_seqs` plus, when it admits new requests, their
/// prompt tokens not found in the prefix cache / `prefill_tok_s` seconds (plus `cold_start_ms` on
/// the first admission after start or after an idle gap longer than `idle_reset_s`). Every running sequence gets one token at the end of each
/// step; a newly admitted request gets its first token at the end of its prefill step.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// The model name served (`/v1/models`, `model` in responses, `model_name` metric label).
    pub served_model_name: String,
    /// Context length: prompt + output tokens may not exceed it (vLLM's `--max-model-len`).
    pub max_model_len: u64,
    /// Maximum concurrently running sequences (vLLM's `--max-num-seqs`); more wait in FIFO order.
    /// vLLM's default is 256; the benchmarked box ran with 16.
    pub max_num_seqs: u32,
    /// Fixed part of one decode step, milliseconds.
    pub step_base_ms: f64,
    /// Per-running-sequence part of one decode step, milliseconds.
    pub step_per_seq_ms: f64,
    /// Prefill speed, prompt tokens per second (added to the step that admits the prompt).
    pub prefill_tok_s: f64,
    /// Extra time of the first prefill after start or after an idle gap, milliseconds.
    pub cold_start_ms: f64,
    /// An idle gap longer than this (seconds) makes the next admission pay `cold_start_ms` again.
    pub idle_reset_s: f64,
    /// A step waking later than this behind its deadline re-anchors the schedule (see the scheduler).
    pub resync_lag_ms: f64,
    /// Probability per generated token of an end-of-sequence stop (0 disables stops globally).
    pub stop_probability_per_token: f64,
    /// KV-cache blocks (vLLM's `num_gpu_blocks`; one is vLLM's null block, the others hold
    /// tokens). The cache holds `num_gpu_blocks × block_size` tokens
    /// (`kv_cache_size_tokens`); `vllm:kv_cache_usage_perc` = blocks in use / (`num_gpu_blocks` − 1).
    pub num_gpu_blocks: u32,
    /// Tokens per KV-cache block (vLLM's `--block-size`).
    pub block_size: u32,
    /// Keep full blocks of finished requests and reuse them for prompts that start with the same
    /// tokens (vLLM's `--enable-prefix-caching`, on by default in V1).
    pub enable_prefix_caching: bool,
    /// Report cached prompt tokens in chat's `usage.prompt_tokens_details` and Messages'
    /// `usage.cache_read_input_tokens` (vLLM's `--enable-prompt-tokens-details`, off by default).
    pub enable_prompt_tokens_details: bool,
    /// Period of the throughput log line, seconds (0 disables it).
    pub log_stats_interval_s: f64,
    /// Fill vLLM's `metrics` response field / final usage event with per-request timings.
    pub per_request_metrics: bool,
    /// Fixed-pace mode: each request gets max_tokens events at a fixed pace, no batching model.
    pub fixed_pace: bool,
    /// Fixed-pace mode: time from request acceptance to the first event, milliseconds.
    pub fixed_ttft_ms: f64,
    /// Fixed-pace mode: gap between consecutive events, milliseconds.
    pub fixed_gap_ms: f64,
    /// Add `"tm_sent_ns"` (CLOCK_MONOTONIC nanoseconds at write) to every streamed event.
    pub stamp_events: bool,
    /// How many wall seconds of per-second generated-token ground truth are kept.
    pub ground_truth_window_s: u64,
    /// Largest accepted request body, bytes.
    pub max_body_bytes: usize,
    /// Write one JSON line per finished request here, with the engine's own timings
    /// (`sim::request_log`: the truth a run's service level is checked against); off when
    /// unset.
    pub truth_log: Option<std::path::PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            served_model_name: "sim-model".to_string(),
            max_model_len: 131_072,
            max_num_seqs: 256,
            step_base_ms: 12.2,
            step_per_seq_ms: 2.1,
            prefill_tok_s: 8000.0,
            cold_start_ms: 0.0,
            idle_reset_s: 60.0,
            resync_lag_ms: 2.0,
            stop_probability_per_token: 0.002,
            num_gpu_blocks: 65_536,
            block_size: 16,
            enable_prefix_caching: true,
            enable_prompt_tokens_details: false,
            log_stats_interval_s: 10.0,
            per_request_metrics: false,
            fixed_pace: false,
            fixed_ttft_ms: 50.0,
            fixed_gap_ms: 20.0,
            stamp_events: false,
            ground_truth_window_s: 3600,
            max_body_bytes: 32 * 1024 * 1024,
            truth_log: None,
        }
    }
}

impl SimConfig {
    /// Checks the values that would make the model meaningless.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.max_num_seqs >= 1, "max_num_seqs must be >= 1");
        anyhow::ensure!(self.max_model_len >= 2, "max_model_len must be >= 2");
        anyhow::ensure!(
            self.step_base_ms >= 0.0 && self.step_per_seq_ms >= 0.0 && self.cold_start_ms >= 0.0,
            "step times must be >= 0"
        );
        anyhow::ensure!(
            self.step_base_ms + self.step_per_seq_ms > 0.0,
            "a step must take some time"
        );
        anyhow::ensure!(self.prefill_tok_s > 0.0, "prefill_tok_s must be > 0");
        anyhow::ensure!(self.resync_lag_ms >= 0.0, "resync_lag_ms must be >= 0");
        anyhow::ensure!(
            (0.0..1.0).contains(&self.stop_probability_per_token),
            "stop_probability_per_token must be in [0, 1)"
        );
        anyhow::ensure!(self.block_size >= 1, "block_size must be >= 1");
        anyhow::ensure!(self.num_gpu_blocks >= 2, "num_gpu_blocks must be >= 2");
        // vLLM refuses to start when one request of max_model_len tokens cannot fit.
        let usable_tokens = u64::from(self.num_gpu_blocks - 1) * u64::from(self.block_size);
        anyhow::ensure!(
            usable_tokens >= self.max_model_len,
            "max_model_len ({}) is larger than the KV cache can hold ((num_gpu_blocks − 1) × block_size = {usable_tokens} tokens)",
            self.max_model_len
        );
        anyhow::ensure!(
            self.fixed_ttft_ms >= 0.0 && self.fixed_gap_ms >= 0.0,
            "fixed-pace times must be >= 0"
        );
        anyhow::ensure!(
            self.ground_truth_window_s >= 1,
            "ground_truth_window_s must be >= 1"
        );
        Ok(())
    }

    /// Tokens the KV cache holds: `num_gpu_blocks × block_size` (vLLM's `kv_cache_size_tokens`).
    pub fn kv_cache_tokens(&self) -> u64 {
        u64::from(self.num_gpu_blocks) * u64::from(self.block_size)
    }

    /// Nanoseconds of a step with `running` sequences, excluding prefill and cold start.
    pub fn decode_step_ns(&self, running: u64) -> u64 {
        ms_to_ns(self.step_base_ms + self.step_per_seq_ms * running as f64)
    }

    /// Nanoseconds to prefill `prompt_tokens`.
    pub fn prefill_ns(&self, prompt_tokens: u64) -> u64 {
        (prompt_tokens as f64 / self.prefill_tok_s * 1e9).round() as u64
    }
}

/// Milliseconds (fractional) to whole nanoseconds, rounded.
pub fn ms_to_ns(ms: f64) -> u64 {
    (ms * 1e6).round().max(0.0) as u64
}
