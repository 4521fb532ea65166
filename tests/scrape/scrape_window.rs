//! The `server` object computed from hand-made samples and proxy seconds, against values worked
//! out by hand; and the `server_sample` log line against its schema.

use crate::common::assert_schema;
use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::meter::ring::proxy_tokens;
use tokenmeter::meter::ring::Ring;
use tokenmeter::scrape::{HistogramValues, ServerSample, ServerTrack, VllmValues};

const S: u64 = NANOS_PER_SEC;
const T0: u64 = 1_800_000_000 * S;

fn sample(at: u64, gen: Option<f64>, running: f64, in_flight: u64) -> ServerSample {
    ServerSample {
        ts_ns: at,
        values: VllmValues {
            running: Some(running),
            waiting: Some(1.0),
            generation_tokens_total: gen,
            prompt_tokens_total: gen.map(|g| g / 10.0),
            kv_cache_usage: Some(0.5),
            ttft: None,
            ..Default::default()
        },
        proxy_in_flight: Some(in_flight),
        scrape_ms: 1.0,
    }
}

/// 100 proxy tokens in each of seconds 0..10 after T0.
fn ring() -> Ring {
    let mut r = Ring::new();
    for s in 0..10 {
        r.bucket_mut(T0 / S + s).gen_tokens = 100.0;
    }
    r
}

#[test]
fn proxy_tokens_are_pro_rata() {
    let r = ring();
    // [0.5 s, 3.25 s]: half of second 0, seconds 1 and 2, a quarter of second 3.
    assert_eq!(proxy_tokens(&r, T0 + S / 2, T0 + 3 * S + S / 4), 275.0);
    assert_eq!(proxy_tokens(&r, T0 + 9 * S, T0 + 12 * S), 100.0);
    assert_eq!(proxy_tokens(&r, T0 + S, T0 + S), 0.0);
}

#[test]
fn rates_min_max_and_disagreement() {
    let mut t = ServerTrack::new(5.0);
    // Server: 1000 → 1420 over [1.5 s, 5.5 s] = 105 tok/s; proxy: 400 tokens = 100 tok/s.
    t.push(sample(T0 + 3 * S / 2, Some(1000.0), 3.0, 4));
    t.push(sample(T0 + 7 * S / 2, Some(1200.0), 5.0, 4));
    t.push(sample(T0 + 11 * S / 2, Some(1420.0), 4.0, 4));
    let w = t.window(T0, T0 + 10 * S, &ring());
    assert_eq!(w.samples, 3);
    assert_eq!(w.interval_s, Some(4.0));
    assert_eq!(w.gen_tok_s, Some(105.0));
    assert_eq!(w.prompt_tok_s, Some(10.5));
    assert_eq!(w.proxy_gen_tok_s, Some(100.0));
    let pct = w.disagreement_pct.unwrap();
    assert!((pct - 100.0 * (400.0 - 420.0) / 420.0).abs() < 1e-9);
    assert_eq!(w.disagreement, Some(false), "-4.76 % is within 5 %");
    assert_eq!((w.running.unwrap().min, w.running.unwrap().max), (3.0, 5.0));
    assert_eq!(w.kv_cache_usage, Some(0.5));
    assert_eq!(w.proxy_in_flight, Some(4.0));
    assert_eq!(w.server_running_plus_waiting, Some(5.0));
    assert_eq!(w.in_flight_diff, Some(-1.0));
    // A tighter threshold flags the same numbers.
    let mut strict = ServerTrack::new(4.0);
    strict.push(sample(T0 + 3 * S / 2, Some(1000.0), 3.0, 4));
    strict.push(sample(T0 + 11 * S / 2, Some(1420.0), 4.0, 4));
    assert_eq!(
        strict.window(T0, T0 + 10 * S, &ring()).disagreement,
        Some(true)
    );
    // Only samples inside [from, to) count.
    let w = t.window(T0 + 2 * S, T0 + 10 * S, &ring());
    assert_eq!((w.samples, w.interval_s), (2, Some(2.0)));
}

#[test]
fn one_sample_gives_levels_but_no_rates() {
    let mut t = ServerTrack::new(5.0);
    t.push(sample(T0 + S, Some(1000.0), 3.0, 2));
    let w = t.window(T0, T0 + 10 * S, &ring());
    assert_eq!(w.samples, 1);
    assert_eq!(w.running.unwrap().max, 3.0);
    assert_eq!(
        (w.interval_s, w.gen_tok_s, w.disagreement),
        (None, None, None)
    );
    let empty = t.window(T0 + 5 * S, T0 + 10 * S, &ring());
    assert_eq!(empty.samples, 0);
    assert!(empty.running.is_none() && empty.proxy_in_flight.is_none());
}

#[test]
fn a_counter_reset_keeps_the_rate_and_drops_the_comparison() {
    let mut t = ServerTrack::new(5.0);
    t.push(sample(T0 + S, Some(5000.0), 3.0, 2));
    t.push(sample(T0 + 3 * S, Some(100.0), 3.0, 2)); // restarted
    t.push(sample(T0 + 5 * S, Some(300.0), 3.0, 2));
    let w = t.window(T0, T0 + 10 * S, &ring());
    assert_eq!(w.counter_resets, 1);
    assert_eq!(w.gen_tok_s, Some(300.0 / 4.0));
    assert_eq!((w.disagreement_pct, w.disagreement), (None, None));
}

#[test]
fn missing_counter_and_idle_server() {
    let mut t = ServerTrack::new(5.0);
    t.push(sample(T0 + S, None, 0.0, 0));
    t.push(sample(T0 + 2 * S, Some(7.0), 0.0, 0));
    t.push(sample(T0 + 3 * S, None, 0.0, 0));
    t.push(sample(T0 + 4 * S, Some(7.0), 0.0, 0));
    // The interval runs between the samples that carry the counter: [2 s, 4 s].
    let w = t.window(T0, T0 + 10 * S, &Ring::new());
    assert_eq!(w.interval_s, Some(2.0));
    assert_eq!(w.gen_tok_s, Some(0.0));
    assert_eq!(w.disagreement_pct, None);
    assert_eq!(w.disagreement, Some(false), "neither side generated");
    let w = t.window(T0, T0 + 10 * S, &ring());
    assert_eq!(
        w.disagreement,
        Some(true),
        "the proxy saw tokens the server did not count"
    );
}

#[test]
fn eviction_keeps_the_horizon() {
    let mut t = ServerTrack::new(5.0);
    for i in 0..5 {
        t.push(sample(T0 + i * S, Some(i as f64), 0.0, 0));
    }
    t.evict_before(T0 + 3 * S);
    assert_eq!(t.len(), 2);
}

#[test]
fn log_line_matches_its_schema_with_and_without_values() {
    let mut s = sample(T0 + 123_456_789, Some(45234.0), 8.0, 8);
    s.values.ttft = Some(HistogramValues {
        buckets: vec![(0.001, 0.0), (0.005, 19.0)],
        sum: 4.9,
        count: 246.0,
    });
    let v: serde_json::Value = serde_json::from_slice(&s.to_json_line()).unwrap();
    assert_schema("server_sample.schema.json", &v);
    assert_eq!(v["type"], "server_sample");
    assert_eq!(v["ts"], "2027-01-15T08:00:00.123456Z");
    assert_eq!(v["ts_ns"], T0 + 123_456_789);
    assert_eq!(v["generation_tokens_total"], 45234.0);
    assert_eq!(
        v["ttft_buckets"],
        serde_json::json!([[0.001, 0.0], [0.005, 19.0]])
    );
    assert_eq!(v["ttft_count"], 246.0);
    let bare = ServerSample {
        ts_ns: T0,
        values: VllmValues::default(),
        proxy_in_flight: None,
        scrape_ms: 0.5,
    };
    let line = bare.to_json_line();
    assert_eq!(line.last(), Some(&b'\n'));
    let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
    assert_schema("server_sample.schema.json", &v);
    assert!(v["running"].is_null() && v["ttft_buckets"].is_null());
    // The schema is strict: an unknown field or a wrong type is rejected.
    let mut bad = v.clone();
    bad["extra"] = 1.into();
    assert!(jsonschema::validator_for(&schema())
        .unwrap()
        .validate(&bad)
        .is_err());
    let mut bad = v;
    bad["type"] = "request".into();
    assert!(jsonschema::validator_for(&schema())
        .unwrap()
        .validate(&bad)
        .is_err());
}

fn schema() -> serde_json::Value {
    let p =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/server_sample.schema.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}
