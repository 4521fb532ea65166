//! The live task shell: events from several threads arrive, snapshots go through the task.

use std::sync::Arc;

use crate::meter_support::{at, record, T0};
use tokenmeter::access_log::AccessLogCounters;
use tokenmeter::meter::live::spawn_meter_at;
use tokenmeter::meter::{Meter, MeterConfig, SnapshotError, SnapshotQuery};

#[tokio::test]
async fn events_from_many_threads_all_arrive_in_order_per_request() {
    let h = spawn_meter_at(MeterConfig::default(), T0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let h = h.clone();
            s.spawn(move || {
                for k in 0..25u64 {
                    let id = t * 100 + k;
                    let start = at(1.0 + k as f64 * 0.1);
                    h.started(
                        id,
                        start,
                        Arc::from(format!("user{t}")),
                        Some(Arc::from("m")),
                    );
                    for c in 0..10 {
                        h.tokens(id, start + c * 1_000_000, 1);
                    }
                    let mut r = record(start, 50.0, Some(5.0), Some(10), Some(2), true);
                    r.request_id = format!("tm-00000009-{id:08x}");
                    r.user = format!("user{t}");
                    h.finished(id, start + 50_000_000, Box::new(r));
                }
            });
        }
    });
    let log = AccessLogCounters::default();
    let snap = h
        .snapshot(at(20.0), SnapshotQuery::default(), "up", &log)
        .await
        .unwrap();
    assert_eq!(snap.in_flight, 0);
    assert_eq!(snap.totals.requests, 100);
    assert_eq!(snap.totals.requests_started, 100);
    assert_eq!(snap.totals.completion_tokens, 1000);
    assert_eq!(snap.in_flight, 0);
    assert_eq!(snap.users.len(), 4);
    assert_eq!(snap.upstream, "up");
    let w = snap.windows.get("60s").unwrap();
    assert!((w.gen_tok_s.unwrap() * 20.0 - 1000.0).abs() < 1e-9);
    let bad = SnapshotQuery {
        window: Some("1h".into()),
        ..Default::default()
    };
    let err = h.snapshot(at(20.0), bad, "up", &log).await.unwrap_err();
    assert!(matches!(err, SnapshotError::UnknownWindow { .. }));
    assert!(h
        .prometheus(at(20.0))
        .await
        .contains("tokenmeter_requests_total"));
}

#[test]
fn finishes_without_a_start_and_non_generation_records() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    // Never started: accounted (tokens, totals) without touching the in-flight level.
    let r = record(at(1.0), 2000.0, None, Some(10), Some(3), false);
    m.request_finished(at(3.0), &r);
    let mut other = record(at(1.0), 10.0, None, None, None, false);
    other.path = "/v1/models".into();
    m.request_finished(at(1.01), &other);
    let snap = m.snapshot(at(11.0), &SnapshotQuery::default()).unwrap();
    assert_eq!(snap.totals.requests, 1);
    assert_eq!(snap.in_flight, 0);
    let w = snap.windows.get("10s").unwrap();
    assert_eq!(w.gen_tok_s, Some(1.0));
    assert_eq!(w.in_flight.as_ref().unwrap().max, 0);
    assert!(!w.steady);
    assert_eq!(w.requests_finished, Some(1));
}

#[test]
fn windows_forget_seconds_beyond_the_horizon() {
    let cfg = MeterConfig {
        horizon_s: 20,
        windows_s: vec![10, 20],
        ..Default::default()
    };
    let mut m = Meter::new(cfg, T0);
    m.request_started(at(1.0), 1, "a", None);
    m.tokens(at(1.5), 1, 100);
    let mut r = record(at(1.0), 1000.0, Some(100.0), Some(100), None, true);
    r.request_id = "tm-0-1".into();
    m.request_finished(at(2.0), &r);
    let w = |m: &mut Meter, now: f64| {
        m.snapshot(at(now), &SnapshotQuery::default())
            .unwrap()
            .windows
            .get("20s")
            .unwrap()
            .gen_tok_s
    };
    assert_eq!(w(&mut m, 21.0), Some(5.0));
    assert_eq!(w(&mut m, 22.0), Some(0.0));
    assert_eq!(
        m.snapshot(at(22.0), &SnapshotQuery::default())
            .unwrap()
            .totals
            .completion_tokens,
        100
    );
}
