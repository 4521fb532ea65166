//! The burst sweep: per level, all requests dispatched together, one distinct prompt per slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::client::{ChatSpec, HttpClient};
use super::progress::{Progress, ProgressEvent};
use super::prompts::prompt_for;
use super::report::{BurstReport, LevelReport};
use super::result::RequestResult;

/// How often a running level reports progress.
const TICK: Duration = Duration::from_secs(1);

/// Runs the warm-up request, then each level in order.
pub async fn run_burst(
    client: &HttpClient,
    spec: &ChatSpec,
    levels: &[usize],
    progress: &dyn Progress,
) -> BurstReport {
    let live = Arc::new(AtomicU64::new(0));
    let warmup_spec = ChatSpec {
        prompt: prompt_for(0),
        ..spec.clone()
    };
    let warmup = client.chat(0, &warmup_spec, &live).await;
    progress.report(&ProgressEvent::Warmup(&warmup));

    let mut out: Vec<LevelReport> = Vec::with_capacity(levels.len());
    for &level in levels {
        let (wall_s, results) = run_level(client, spec, level, &live, progress).await;
        let first = out.first().and_then(|l| l.aggregate_tok_s);
        let prev = out.last().map(|l| (l.level, l.aggregate_tok_s));
        let report = LevelReport::new(level, wall_s, results, first, prev);
        progress.report(&ProgressEvent::LevelDone(&report));
        out.push(report);
    }
    BurstReport {
        warmup,
        levels: out,
    }
}

/// One batch of `level` requests; its wall in seconds and the results sorted by slot.
async fn run_level(
    client: &HttpClient,
    spec: &ChatSpec,
    level: usize,
    live: &Arc<AtomicU64>,
    progress: &dyn Progress,
) -> (f64, Vec<RequestResult>) {
    // Bodies are built before the clock starts so every request leaves at once.
    let specs: Vec<ChatSpec> = (0..level)
        .map(|slot| ChatSpec {
            prompt: prompt_for(slot),
            ..spec.clone()
        })
        .collect();
    let events_before = live.load(Ordering::Relaxed);
    let dispatched = Instant::now();
    let mut set = JoinSet::new();
    for (slot, spec) in specs.into_iter().enumerate() {
        let (client, live) = (client.clone(), Arc::clone(live));
        set.spawn(async move { client.chat(slot, &spec, &live).await });
    }
    let mut results = Vec::with_capacity(level);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + TICK, TICK);
    loop {
        tokio::select! {
            joined = set.join_next() => match joined {
                Some(Ok(r)) => results.push(r),
                Some(Err(e)) => results.push(RequestResult::failed(usize::MAX, format!("task: {e}"))),
                None => break,
            },
            _ = ticker.tick() => progress.report(&ProgressEvent::LevelTick {
                level,
                done: results.len(),
                in_flight: set.len(),
                elapsed_s: dispatched.elapsed().as_secs_f64(),
                events_per_s: (live.load(Ordering::Relaxed) - events_before) as f64
                    / dispatched.elapsed().as_secs_f64().max(1e-9),
            }),
        }
    }
    let wall_s = dispatched.elapsed().as_secs_f64();
    results.sort_by_key(|r| r.slot);
    (wall_s, results)
}
