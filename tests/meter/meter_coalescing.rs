//! Token reports coalesced per request and second change no number the meter shows: the same
//! traffic, driven through real trackers into two live meters, once coalesced and once per
//! event, gives the same `/stats` snapshot (windows, users, models, both capacity curves), the
//! same Prometheus text and the same timeline, with far fewer reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenmeter::access_log::AccessLogCounters;
use tokenmeter::clock::{Clock, UnixNanos};
use tokenmeter::dialect::{EventSummary, TokenUsage};
use tokenmeter::meter::live::spawn_meter_at;
use tokenmeter::meter::{MeterConfig, MeterHandle, SnapshotQuery};
use tokenmeter::observe::Observer;
use tokenmeter::proxy::{RequestMeta, Tracker, TrackerShared};
use tokenmeter::record::{Outcome, RequestRecord, UserSource};

// Numbers are held to 1e-9: the level attribution adds one run's tokens once where per event it
// adds them one event at a time, so a float sum may differ in its last bits.
use crate::meter_support::{close, json_close};

/// Counts token reports.
#[derive(Default)]
struct CountReports(AtomicU64);

impl Observer for CountReports {
    fn started(&self, _: u64, _: UnixNanos, _: &Arc<str>, _: Option<&Arc<str>>) {}
    fn tokens(&self, _: u64, _: UnixNanos, _: u64, _: tokenmeter::itl::Gaps) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn finished(&self, _: u64, _: UnixNanos, _: &Arc<RequestRecord>, _: bool) {}
}

fn meta(user: &str, stream: bool) -> RequestMeta {
    RequestMeta {
        user: user.into(),
        user_source: UserSource::KeyHash,
        model: Some("m".into()),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        client_request_id: None,
        user_agent: None,
        client_ip: None,
        api: tokenmeter::dialect::detect("/v1/chat/completions"),
        stream: Some(stream),
        n: None,
        bytes_in: 100,
        trace: None,
        session: None,
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Start,
    Token,
    Usage(u64),
    NonStreamedBody(u64),
    Finish,
}

/// (time after the base, request, step), in time order: overlapping streams with gaps inside
/// and across seconds and pauses of over a second, and non-streamed requests that outlast the
/// guard's cap.
fn mixed() -> Vec<(Duration, usize, Step)> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut steps = Vec::new();
    for r in 0..24 {
        let arrival = Duration::from_millis(r as u64 * 290 + rand(200));
        let mut t = arrival + Duration::from_millis(40 + rand(400));
        steps.push((arrival, r, Step::Start));
        if r % 6 == 5 {
            // Longer than the guard's cap (1 s): its guard closes at a time no event marks.
            t += Duration::from_millis(1000 + rand(2500));
            steps.push((t, r, Step::NonStreamedBody(20 + rand(30))));
        } else {
            let events = 3 + rand(80);
            for _ in 0..events {
                steps.push((t, r, Step::Token));
                let gap = if rand(40) == 0 { 1200 } else { 5 + rand(60) };
                t += Duration::from_millis(gap);
            }
            steps.push((t, r, Step::Usage(events)));
        }
        steps.push((t + Duration::from_millis(1), r, Step::Finish));
    }
    steps.sort_by_key(|s| s.0);
    steps
}

/// Eight streams that arrive together and then stream 300 events 10 ms apart: the bench's shape,
/// where only the start and the end change the level.
fn steady() -> Vec<(Duration, usize, Step)> {
    let mut steps = Vec::new();
    for r in 0..8 {
        steps.push((Duration::from_millis(r as u64), r, Step::Start));
        for e in 0..300u64 {
            let t = Duration::from_millis(100 + r as u64 + e * 10);
            steps.push((t, r, Step::Token));
        }
        steps.push((Duration::from_millis(3200 + r as u64), r, Step::Usage(300)));
        steps.push((Duration::from_millis(3201 + r as u64), r, Step::Finish));
    }
    steps.sort_by_key(|s| s.0);
    steps
}

/// Runs the script through trackers feeding a fresh meter; returns the meter and the count of
/// token reports.
fn run(
    script: &[(Duration, usize, Step)],
    base: Instant,
    origin: UnixNanos,
    coalesce: bool,
) -> (MeterHandle, u64) {
    let meter = spawn_meter_at(MeterConfig::default(), origin);
    let count = Arc::new(CountReports::default());
    let shared = Arc::new(
        TrackerShared::new(
            vec![Arc::new(meter.clone()), count.clone()],
            Duration::from_secs(5),
        )
        .with_token_coalescing(coalesce),
    );
    let requests = script.iter().map(|s| s.1 + 1).max().unwrap_or(0);
    let mut trackers: Vec<Option<Tracker>> = (0..requests).map(|_| None).collect();
    for &(at, r, step) in script {
        let now = base + at;
        match step {
            Step::Start => {
                let user = format!("user{}", r % 3);
                let mut t = Tracker::start(shared.clone(), now, meta(&user, r % 6 != 5), true);
                t.admit();
                trackers[r] = Some(t);
            }
            Step::Token => {
                let s = EventSummary {
                    output: 1,
                    choices: 1,
                    ..Default::default()
                };
                trackers[r].as_mut().unwrap().on_event(&s, now, true);
            }
            Step::Usage(n) | Step::NonStreamedBody(n) => {
                let s = EventSummary {
                    usage: Some(TokenUsage {
                        input: Some(10),
                        output: Some(n),
                        ..Default::default()
                    }),
                    usage_only: matches!(step, Step::Usage(_)),
                    ..Default::default()
                };
                let streamed = matches!(step, Step::Usage(_));
                trackers[r].as_mut().unwrap().on_event(&s, now, streamed);
            }
            Step::Finish => {
                let mut t = trackers[r].take().unwrap();
                t.set_status(200);
                t.finish(Outcome::Ok, None, now);
            }
        }
    }
    let reports = count.0.load(Ordering::Relaxed);
    (meter, reports)
}

/// Prometheus text: the same lines, their values `close`.
fn same_text(a: &str, b: &str) {
    let (a, b): (Vec<_>, Vec<_>) = (a.lines().collect(), b.lines().collect());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        let (xs, xv) = x.rsplit_once(' ').unwrap_or((x, ""));
        let (ys, yv) = y.rsplit_once(' ').unwrap_or((y, ""));
        assert_eq!(xs, ys);
        match (xv.parse::<f64>(), yv.parse::<f64>()) {
            (Ok(p), Ok(q)) => assert!(close(p, q), "{x} vs {y}"),
            _ => assert_eq!(x, y),
        }
    }
}

/// Runs `script` both ways and holds every view of the two meters to each other; returns the
/// token reports per event and coalesced.
async fn both_ways(script: &[(Duration, usize, Step)]) -> (u64, u64) {
    let base = Instant::now();
    let origin = Clock::global().at(base);
    let (per_event, n_per_event) = run(script, base, origin, false);
    let (coalesced, n_coalesced) = run(script, base, origin, true);
    let events = script.iter().filter(|s| matches!(s.2, Step::Token)).count() as u64;
    assert_eq!(n_per_event, events, "per event: one report per token event");
    let end = script.last().unwrap().0;
    let log = AccessLogCounters::default();
    for after in [Duration::from_millis(2500), Duration::from_secs(20)] {
        let now = Clock::global().at(base + end + after);
        let a = per_event
            .snapshot(now, SnapshotQuery::default(), "up", &log)
            .await
            .unwrap();
        let b = coalesced
            .snapshot(now, SnapshotQuery::default(), "up", &log)
            .await
            .unwrap();
        let (a, b) = (
            serde_json::to_value(&a).unwrap(),
            serde_json::to_value(&b).unwrap(),
        );
        assert!(
            a["capacity_production"]
                .as_array()
                .is_some_and(|r| !r.is_empty()),
            "{a}"
        );
        json_close(&a, &b, "stats");
        same_text(
            &per_event.prometheus(now).await,
            &coalesced.prometheus(now).await,
        );
        let (ta, tb) = (
            per_event.timeline(now, 60).await.unwrap(),
            coalesced.timeline(now, 60).await.unwrap(),
        );
        json_close(
            &serde_json::to_value(&ta).unwrap(),
            &serde_json::to_value(&tb).unwrap(),
            "timeline",
        );
    }
    (n_per_event, n_coalesced)
}

#[tokio::test]
async fn coalescing_changes_no_number_in_mixed_traffic() {
    let (per_event, coalesced) = both_ways(&mixed()).await;
    assert!(coalesced < per_event, "{coalesced} of {per_event}");
}

#[tokio::test]
async fn steady_streams_report_about_once_per_second() {
    let (per_event, coalesced) = both_ways(&steady()).await;
    // Per stream: the first token alone, then about one run per second of its 3 s.
    assert_eq!(per_event, 2400);
    assert!(coalesced <= 8 * 6, "{coalesced}");
}
