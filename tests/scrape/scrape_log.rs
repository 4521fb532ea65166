//! Scrape samples through the meter (explicit time) and through the access-log writer: the
//! `server` object in a snapshot against the strict stats schema, and `server_sample` lines
//! sharing the request lines' queue and drop counting.

use std::sync::Arc;

use crate::common::{assert_schema, TempDir};
use tokenmeter::access_log::{self, AccessLogCounters};
use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::meter::{Meter, MeterConfig, SnapshotQuery};
use tokenmeter::scrape::{ServerSample, VllmValues};

const S: u64 = NANOS_PER_SEC;
const T0: u64 = 1_800_000_000 * S;

fn sample(ts_ns: u64, gen: f64, in_flight: u64) -> ServerSample {
    ServerSample {
        ts_ns,
        values: VllmValues {
            running: Some(in_flight as f64),
            waiting: Some(0.0),
            generation_tokens_total: Some(gen),
            prompt_tokens_total: Some(10.0),
            kv_cache_usage: Some(0.1),
            ttft: None,
            ..Default::default()
        },
        proxy_in_flight: Some(in_flight),
        scrape_ms: 2.0,
    }
}

fn meter() -> Meter {
    Meter::new(
        MeterConfig {
            windows_s: vec![10],
            ..Default::default()
        },
        T0,
    )
}

#[test]
fn the_meter_fills_server_only_when_enabled() {
    let mut m = meter();
    m.server_sample(sample(T0 + S, 0.0, 0)); // ignored: cross-check off
    let v =
        serde_json::to_value(m.snapshot(T0 + 11 * S, &SnapshotQuery::default()).unwrap()).unwrap();
    assert_schema("stats.schema.json", &v);
    assert!(v["windows"]["10s"]["server"].is_null());

    let mut m = meter();
    m.enable_server(5.0);
    let v =
        serde_json::to_value(m.snapshot(T0 + 3 * S, &SnapshotQuery::default()).unwrap()).unwrap();
    assert_schema("stats.schema.json", &v);
    assert_eq!(v["windows"]["10s"]["server"]["samples"], 0);
    assert!(v["windows"]["10s"]["server"]["gen_tok_s"].is_null());
    // One request streaming 50 tokens a second for seconds 1..9, no server samples before.
    m.request_started(T0 + S, 1, "u", Some("m"));
    for i in 0..400u64 {
        m.tokens(T0 + S + i * S / 50, 1, 1);
    }
    m.server_sample(sample(T0 + 2 * S, 1000.0, 1));
    m.server_sample(sample(T0 + 6 * S, 1200.0, 1));
    let v =
        serde_json::to_value(m.snapshot(T0 + 9 * S, &SnapshotQuery::default()).unwrap()).unwrap();
    assert_schema("stats.schema.json", &v);
    let s = &v["windows"]["10s"]["server"];
    assert_eq!(s["samples"], 2);
    assert_eq!(s["interval_s"], 4.0);
    assert_eq!(s["gen_tok_s"], 50.0);
    assert_eq!(s["proxy_gen_tok_s"], 50.0);
    assert_eq!(s["disagreement_pct"], 0.0);
    assert_eq!(s["disagreement"], false);
    // Users' windows do not carry it.
    assert!(v["users"]["u"]["windows"]["10s"]["server"].is_null());
    // The schema is strict about the object.
    let mut bad = v.clone();
    bad["windows"]["10s"]["server"]["extra"] = 1.into();
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/schemas/stats.schema.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert!(jsonschema::validator_for(&schema)
        .unwrap()
        .validate(&bad)
        .is_err());
    let mut bad = v;
    bad["windows"]["10s"]["server"]["disagreement"] = "yes".into();
    assert!(jsonschema::validator_for(&schema)
        .unwrap()
        .validate(&bad)
        .is_err());
}

/// Waits (up to 5 s) until the writer has written its first line: it then rests for its batch
/// interval, so what is offered next meets a queue that is not being drained.
async fn first_line_written(counters: &AccessLogCounters) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while counters.get().0 < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "first line never written"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn samples_share_the_request_queue_and_its_drop_count() {
    let dir = TempDir::new("xcheck-log");
    let path = dir.0.join("access.jsonl");
    let counters = Arc::new(AccessLogCounters::default());
    let (sink, writer) = access_log::spawn(&path, 2, counters.clone()).unwrap();
    // The writer runs on a thread of its own, so when it drains is not ours to decide. Once it
    // has written a line it rests for its batch interval; fifty samples offered then meet a
    // queue of two: most are dropped, and each drop is counted where the requests' are.
    sink.server_sample(Arc::new(sample(T0, 0.0, 0)));
    first_line_written(&counters).await;
    for i in 1..51 {
        sink.server_sample(Arc::new(sample(T0 + i * S, i as f64, 0)));
    }
    writer.close().await;
    let (written, dropped, failed) = counters.get();
    assert_eq!(failed, 0);
    assert_eq!(written + dropped, 51, "every sample written or counted");
    assert!(dropped >= 1, "a queue of two took fifty: {dropped} dropped");
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len() as u64, written);
    for l in &lines {
        assert_schema("server_sample.schema.json", l);
        assert_eq!(
            ServerSample::from_json(l)
                .unwrap()
                .values
                .prompt_tokens_total,
            Some(10.0)
        );
    }
    assert_eq!(lines[0]["generation_tokens_total"], 0.0);
}

#[tokio::test(flavor = "current_thread")]
async fn lines_queued_while_the_writer_rests_are_written_at_close() {
    let dir = TempDir::new("xcheck-log-rest");
    let path = dir.0.join("access.jsonl");
    let counters = Arc::new(AccessLogCounters::default());
    let (sink, writer) = access_log::spawn(&path, 2, counters.clone()).unwrap();
    sink.server_sample(Arc::new(sample(T0, 0.0, 0)));
    // The first line written: the writer now rests for its batch interval.
    first_line_written(&counters).await;
    // Queued during the rest: two fit, the third is dropped and counted; close ends the rest
    // and must write what is queued.
    for i in 1..4 {
        sink.server_sample(Arc::new(sample(T0 + i * S, i as f64, 0)));
    }
    writer.close().await;
    let (written, dropped, failed) = counters.get();
    assert_eq!(failed, 0);
    assert_eq!(written + dropped, 4, "every line written or counted");
    assert!(written >= 3, "the queue held two lines: {written} written");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count() as u64, written);
}
