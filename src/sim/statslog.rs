//! vLLM's periodic throughput log line, computed over the exact interval between two snapshots.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::metrics::Stats;

/// Logs `Engine 000: Avg prompt throughput: X tokens/s, Avg generation throughput: Y tokens/s,
/// Running: N reqs, Waiting: M reqs, GPU KV cache usage: P%, Prefix cache hit rate: 0.0%` every
/// `interval_s`; throughputs are token deltas divided by the measured elapsed time. Quiet while idle.
pub async fn run(
    interval_s: f64,
    kv_capacity_tokens: u64,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let period = Duration::from_secs_f64(interval_s.max(0.001));
    let mut last_t = Instant::now();
    let mut last_p = stats.prompt_tokens_total.load(Relaxed);
    let mut last_g = stats.generation_tokens_total.load(Relaxed);
    let mut was_active = false;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let now = Instant::now();
        let p = stats.prompt_tokens_total.load(Relaxed);
        let g = stats.generation_tokens_total.load(Relaxed);
        let running = stats.running.load(Relaxed);
        let waiting = stats.waiting.load(Relaxed);
        let dt = now.duration_since(last_t).as_secs_f64();
        let active = p != last_p || g != last_g || running > 0 || waiting > 0;
        if active || was_active {
            let kv = stats.kv_tokens.load(Relaxed);
            tracing::info!(
                "Engine 000: Avg prompt throughput: {:.1} tokens/s, Avg generation throughput: {:.1} tokens/s, Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: {:.1}%, Prefix cache hit rate: 0.0%",
                (p - last_p) as f64 / dt,
                (g - last_g) as f64 / dt,
                100.0 * (kv as f64 / kv_capacity_tokens.max(1) as f64).min(1.0)
            );
        }
        was_active = active;
        last_t = now;
        last_p = p;
        last_g = g;
    }
}
