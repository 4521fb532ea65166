//! The engine's async shell: one task, one timer per step, absolute deadlines (no drift).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::config::SimConfig;
use super::engine::{Engine, Ev, Job};
use super::metrics::Stats;
use crate::clock::{Clock, NANOS_PER_SEC};

/// A job whose events go to a bounded channel sized to hold all of them.
pub type ChannelJob = Job<mpsc::Sender<Ev>>;

/// Runs the engine until `shutdown` flips or every job sender is gone.
///
/// Step k ends at `busy_start + Σ durations` (absolute), slept to with `sleep_until`, so timer jitter
/// does not accumulate. Lag (actual wake − deadline) is recorded for every step. A wake later than
/// `resync_lag_ms` re-anchors the schedule at the actual time instead of catching up with shortened
/// steps: a late engine is reported (lag, slip), never hidden by compressing the model.
pub async fn run(
    cfg: SimConfig,
    stats: Arc<Stats>,
    mut jobs: mpsc::UnboundedReceiver<ChannelJob>,
    mut shutdown: watch::Receiver<bool>,
) {
    let clock = Clock::global();
    let resync_ns = super::config::ms_to_ns(cfg.resync_lag_ms);
    let mut engine: Engine<mpsc::Sender<Ev>> = Engine::new(cfg, Arc::clone(&stats));
    loop {
        if engine.is_idle() {
            tokio::select! {
                job = jobs.recv() => match job {
                    Some(j) => {
                        stats.inflight.fetch_sub(1, Relaxed);
                        engine.submit(j);
                    }
                    None => return,
                },
                _ = shutdown.changed() => return,
            }
        }
        // A busy period: deadlines are absolute from here on.
        let base = std::time::Instant::now();
        let mut deadline_ns = clock.at(base);
        let mut deadline = tokio::time::Instant::from_std(base);
        loop {
            while let Ok(j) = jobs.try_recv() {
                stats.inflight.fetch_sub(1, Relaxed);
                engine.submit(j);
            }
            let Some(dur_ns) = engine.begin_step(deadline_ns) else {
                break;
            };
            deadline_ns += dur_ns;
            deadline += Duration::from_nanos(dur_ns);
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = shutdown.changed() => return,
            }
            let woke = std::time::Instant::now();
            let now_ns = clock.at(woke);
            let lag_ns = now_ns.saturating_sub(deadline_ns);
            stats.record_lag(lag_ns);
            if lag_ns > resync_ns {
                // Fallen behind: re-anchor at the real time so the next steps keep their full
                // durations (no burst of compressed steps); the lost time is reported as slip.
                stats.record_slip(lag_ns);
                deadline_ns = now_ns;
                deadline = tokio::time::Instant::from_std(woke);
            }
            engine.finish_step(deadline_ns, now_ns / NANOS_PER_SEC);
        }
    }
}
