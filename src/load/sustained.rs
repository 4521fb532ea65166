//! The sustained method: N requests kept in flight for a duration.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::client::{ChatSpec, HttpClient};
use super::progress::{Progress, ProgressEvent};
use super::prompts::prompt_for;
use super::report::{ClientTick, RequestFigures, SustainedReport};
use super::result::RequestResult;

/// Upper bound on requests started in one run.
const MAX_STARTED: usize = 10_000_000;

/// Keeps `concurrency` requests in flight: when one finishes the next starts at once; at
/// `start + duration` the ones still running are cancelled. Stops early after a run of
/// consecutive failures (max(3·N, 10)) so a broken server is not hammered for the whole duration.
pub async fn run_sustained(
    client: &HttpClient,
    spec: &ChatSpec,
    concurrency: usize,
    duration: Duration,
    tick_interval: Duration,
    progress: &dyn Progress,
) -> SustainedReport {
    let concurrency = concurrency.max(1);
    let failure_limit = (3 * concurrency).max(10);
    let live = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = tokio::time::Instant::from_std(start + duration);
    let mut set: JoinSet<RequestResult> = JoinSet::new();
    let mut started = 0usize;
    let spawn = |set: &mut JoinSet<RequestResult>, seq: usize| {
        let (client, live) = (client.clone(), Arc::clone(&live));
        let spec = ChatSpec {
            prompt: prompt_for(seq),
            ..spec.clone()
        };
        set.spawn(async move { client.chat(seq, &spec, &live).await });
    };
    while started < concurrency {
        spawn(&mut set, started);
        started += 1;
    }
    let mut max_in_flight = set.len();
    let mut results: Vec<RequestResult> = Vec::new();
    let mut ticks = Vec::new();
    let mut consecutive_failures = 0usize;
    let mut stopped_early = None;
    let tick_interval = tick_interval.max(Duration::from_millis(10));
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + tick_interval, tick_interval);
    let (mut last_tick_t, mut last_tick_events) = (0.0_f64, 0u64);
    let sleep = tokio::time::sleep_until(deadline);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            biased;
            _ = &mut sleep => break,
            Some(joined) = set.join_next() => {
                let r = joined.unwrap_or_else(|e| RequestResult::failed(usize::MAX, format!("task: {e}")));
                consecutive_failures = if r.ok { 0 } else { consecutive_failures + 1 };
                results.push(r);
                if consecutive_failures >= failure_limit {
                    stopped_early = Some(format!("{consecutive_failures} consecutive failures"));
                    break;
                }
                if tokio::time::Instant::now() < deadline && started < MAX_STARTED {
                    spawn(&mut set, started);
                    started += 1;
                    max_in_flight = max_in_flight.max(set.len());
                }
            }
            _ = ticker.tick() => {
                let t_s = start.elapsed().as_secs_f64();
                let events = live.load(Ordering::Relaxed);
                let dt = t_s - last_tick_t;
                let tick = ClientTick {
                    t_s,
                    done: results.len(),
                    in_flight: set.len(),
                    events_per_s: if dt > 0.0 { (events - last_tick_events) as f64 / dt } else { 0.0 },
                };
                (last_tick_t, last_tick_events) = (t_s, events);
                progress.report(&ProgressEvent::SustainedTick(&tick));
                ticks.push(tick);
            }
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let events_at_stop = live.load(Ordering::Relaxed);
    let cancelled_at_deadline = set.len();
    set.abort_all();
    // Aborted tasks are awaited so no request outlives the run.
    while set.join_next().await.is_some() {}

    let figures = RequestFigures::of(&results);
    let finished_events: u64 = results.iter().map(|r| r.content_events).sum();
    let partial_content_events = events_at_stop.saturating_sub(finished_events);
    let rate = |tokens: u64| (wall_s > 0.0).then(|| tokens as f64 / wall_s);
    let report = SustainedReport {
        concurrency,
        duration_s: duration.as_secs_f64(),
        wall_s,
        started,
        cancelled_at_deadline,
        client_aggregate_tok_s: rate(figures.completion_tokens),
        partial_content_events,
        client_aggregate_incl_partial_tok_s: if spec.stream {
            rate(figures.completion_tokens + partial_content_events)
        } else {
            None
        },
        figures,
        max_in_flight,
        stopped_early,
        ticks,
        results,
    };
    progress.report(&ProgressEvent::SustainedDone(&report));
    report
}
