//! vLLM's periodic throughput log line, computed over the exact interval between two snapshots.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::metrics::Stats;

/// The counters one log line is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// `prompt_tokens_total` at the snapshot.
    pub prompt_tokens: u64,
    /// `generation_tokens_total` at the snapshot.
    pub generation_tokens: u64,
    /// Running sequences.
    pub running: u64,
    /// Waiting requests.
    pub waiting: u64,
    /// Tokens held in the KV cache.
    pub kv_tokens: u64,
}

impl Snapshot {
    /// Reads the live statistics.
    pub fn take(stats: &Stats) -> Self {
        Snapshot {
            prompt_tokens: stats.prompt_tokens_total.load(Relaxed),
            generation_tokens: stats.generation_tokens_total.load(Relaxed),
            running: stats.running.load(Relaxed),
            waiting: stats.waiting_total(),
            kv_tokens: stats.kv_tokens.load(Relaxed),
        }
    }
}

/// vLLM's line for the interval `prev → now` lasting `elapsed_s`: `Engine 000: Avg prompt throughput:
/// X tokens/s, Avg generation throughput: Y tokens/s, Running: N reqs, Waiting: M reqs, GPU KV cache
/// usage: P%, Prefix cache hit rate: 0.0%` where X and Y are token deltas / `elapsed_s`, N, M and P
/// are the values at `now`.
pub fn line(prev: &Snapshot, now: &Snapshot, elapsed_s: f64, kv_capacity_tokens: u64) -> String {
    let dt = elapsed_s.max(1e-9);
    let kv = 100.0 * (now.kv_tokens as f64 / kv_capacity_tokens.max(1) as f64).min(1.0);
    format!(
        "Engine 000: Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, Running: {} reqs, Waiting: {} reqs, GPU KV cache usage: {kv:.1}%, Prefix cache hit rate: 0.0%",
        now.prompt_tokens.saturating_sub(prev.prompt_tokens) as f64 / dt,
        now.generation_tokens.saturating_sub(prev.generation_tokens) as f64 / dt,
        now.running,
        now.waiting
    )
}

/// Logs [`line`] every `interval_s` via `tracing::info!`; quiet while idle (after one idle line).
pub async fn run(
    interval_s: f64,
    kv_capacity_tokens: u64,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let period = Duration::from_secs_f64(interval_s.max(0.001));
    let mut last_t = Instant::now();
    let mut last = Snapshot::take(&stats);
    let mut was_active = false;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now_t = Instant::now();
        let now = Snapshot::take(&stats);
        let active = now.prompt_tokens != last.prompt_tokens
            || now.generation_tokens != last.generation_tokens
            || now.running > 0
            || now.waiting > 0;
        if active || was_active {
            let elapsed = now_t.duration_since(last_t).as_secs_f64();
            tracing::info!("{}", line(&last, &now, elapsed, kv_capacity_tokens));
        }
        was_active = active;
        last_t = now_t;
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_matches_vllm_and_divides_by_the_interval() {
        let prev = Snapshot {
            prompt_tokens: 100,
            generation_tokens: 1000,
            ..Snapshot::default()
        };
        let now = Snapshot {
            prompt_tokens: 687,
            generation_tokens: 5511,
            running: 3,
            waiting: 1,
            kv_tokens: 50,
        };
        assert_eq!(
            line(&prev, &now, 10.0, 1000),
            "Engine 000: Avg prompt throughput: 58.7 tokens/s, Avg generation throughput: 451.1 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 0.0%"
        );
    }
}
