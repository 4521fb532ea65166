//! The shared pure pieces: attribution, in-flight integration, capacity curve from a replay.

use std::collections::BTreeMap;

use crate::meter_support::{at, close, record, T0};
use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::meter::capacity::{CapacityAccumulator, RequestLevel};
use tokenmeter::meter::inflight::InFlightIntegrator;
use tokenmeter::meter::replay::Timeline;
use tokenmeter::meter::timeline::{attribute_finish, attribute_record, spread, SecondBucket};

const S0: u64 = T0 / NANOS_PER_SEC;

fn attributed(r: &tokenmeter::record::RequestRecord) -> BTreeMap<u64, (f64, f64)> {
    let mut m = BTreeMap::new();
    attribute_record(r, &mut |s, g, p| {
        let e: &mut (f64, f64) = m.entry(s - S0).or_default();
        e.0 += g;
        e.1 += p;
    });
    m
}

#[test]
fn non_streamed_tokens_spread_over_the_life_and_prompt_goes_to_the_end_second() {
    // Life [10.5 s, 13.5 s]: overlaps 0.5, 1, 1, 0.5 s of 3 s.
    let r = record(at(10.5), 3000.0, None, Some(30), Some(7), false);
    let m = attributed(&r);
    assert_eq!(m.keys().copied().collect::<Vec<_>>(), vec![10, 11, 12, 13]);
    for (s, want) in [(10, 5.0), (11, 10.0), (12, 10.0), (13, 5.0)] {
        assert!(close(m[&s].0, want), "second {s}: {}", m[&s].0);
    }
    assert_eq!(m[&13].1, 7.0);
    assert_eq!(m.values().map(|v| v.1).sum::<f64>(), 7.0);
}

#[test]
fn streamed_tokens_spread_over_decode_and_prompt_goes_to_the_ttft_second() {
    // Start 10.2, TTFT at 11.0 (800 ms), end 13.0: decode interval [11, 13] gets 20 tokens.
    let r = record(at(10.2), 2800.0, Some(800.0), Some(20), Some(5), true);
    let m = attributed(&r);
    assert_eq!(m[&11], (10.0, 5.0));
    assert_eq!(m[&12], (10.0, 0.0));
    assert!(!m.contains_key(&10) && !m.contains_key(&13));
}

#[test]
fn zero_length_interval_puts_everything_in_its_second() {
    let mut got = vec![];
    spread(at(4.7), at(4.7), 9.0, 0, &mut |s, v| got.push((s - S0, v)));
    assert_eq!(got, vec![(4, 9.0)]);
}

#[test]
fn reconciliation_spreads_only_the_difference() {
    // 10 counted events were attributed live; usage says 14: 4 more over [ttft, end] = [1, 3].
    let r = record(at(0.5), 2500.0, Some(500.0), Some(14), None, true);
    let mut total = 10.0;
    let mut per_sec = BTreeMap::new();
    attribute_finish(&r, 10.0, r.end_ns(), 0, &mut |s, g, _| {
        total += g;
        *per_sec.entry(s - S0).or_insert(0.0) += g;
    });
    assert!(close(total, 14.0));
    assert_eq!(per_sec, BTreeMap::from([(1, 2.0), (2, 2.0)]));
}

#[test]
fn in_flight_integration_reports_min_max_mean_and_steady() {
    let mut secs: BTreeMap<u64, SecondBucket> = BTreeMap::new();
    let mut integ = InFlightIntegrator::new();
    let mut go = |integ: &mut InFlightIntegrator, t: f64, d: i32| {
        integ.change(at(t), d, 0, &mut |s, l, ns| {
            secs.entry(s - S0).or_default().observe_level(l, ns);
        });
    };
    go(&mut integ, 0.0, 1);
    go(&mut integ, 2.25, 1); // level 2 from 2.25
    go(&mut integ, 4.0, -1);
    go(&mut integ, 5.5, -1); // idle from 5.5
    assert_eq!(secs[&0].steady_level(), Some(1));
    assert_eq!(secs[&1].steady_level(), Some(1));
    assert_eq!(secs[&2].steady_level(), None);
    let (min, max, mean) = secs[&2].in_flight_complete();
    assert_eq!((min, max), (1, 2));
    assert!(close(mean, 1.75));
    assert_eq!(secs[&3].steady_level(), Some(2));
    assert_eq!(secs[&4].steady_level(), Some(1));
    let (min, max, mean) = secs[&5].in_flight_complete();
    assert_eq!((min, max, mean), (0, 1, 0.5));
    assert!(!secs.contains_key(&6));
    assert_eq!(
        integ.area_ns(),
        2_250_000_000u128 + 2 * 1_750_000_000 + 1_500_000_000
    );
}

/// 120 s at N=1 at 70 tok/s, 120 s at N=4 at 150 tok/s total, 120 s at N=16 at 350 tok/s total.
fn synthetic_records() -> Vec<tokenmeter::record::RequestRecord> {
    let mut out = vec![];
    let mut first = record(
        at(0.0),
        120_000.0,
        Some(5000.0),
        Some(8400),
        Some(10),
        false,
    );
    first.cold_start = true;
    out.push(first);
    for (phase, n, total) in [(1.0, 4u32, 150u64), (2.0, 16, 350)] {
        for i in 0..n {
            let each = total * 120 / n as u64;
            let mut r = record(
                at(phase * 120.0),
                120_000.0,
                Some(100.0 * (i + 1) as f64),
                Some(each),
                Some(10),
                false,
            );
            r.in_flight_at_start = i + 1;
            out.push(r);
        }
    }
    out
}

#[test]
fn capacity_curve_of_a_known_timeline_is_exact() {
    let tl = Timeline::from_records(&synthetic_records());
    let rows = tl.capacity();
    assert_eq!(
        rows.iter().map(|r| r.in_flight).collect::<Vec<_>>(),
        vec![1, 4, 16]
    );
    let want = [
        (1u32, 70.0, 70.0, None),
        (4, 150.0, 37.5, Some(150.0 / 70.0 - 1.0)),
        (16, 350.0, 21.875, Some(350.0 / 150.0 - 1.0)),
    ];
    for (row, (n, mean, per_req, marginal)) in rows.iter().zip(want) {
        assert_eq!(row.in_flight, n);
        assert_eq!(row.seconds, 120, "N={n}");
        assert_eq!(row.gen_tok_s.mean, mean);
        assert_eq!(row.gen_tok_s.stdev, Some(0.0));
        assert_eq!(row.per_request_tok_s.avg, per_req);
        assert_eq!(row.per_request_tok_s.min, Some(per_req));
        assert_eq!(row.per_request_tok_s.max, Some(per_req));
        assert!(close(row.scaling.unwrap(), mean / 70.0));
        match marginal {
            None => assert_eq!(row.marginal_gain, None),
            Some(m) => assert!(close(row.marginal_gain.unwrap(), m)),
        }
    }
    assert!(close(rows[1].scaling.unwrap(), 2.142857142857143));
    // At N=1 arrived the cold first request (TTFT 5 s, kept out) and the first request of each
    // later phase (TTFT 100 ms): p99 is 100 ms, not 5 s.
    let p99 = rows[0].ttft_ms.p99.unwrap();
    assert!((p99 - 100.0).abs() / 100.0 < 0.005, "{p99}");
    // N=4 arrivals: only the 4th request arrived at in_flight 4 (TTFT 400 ms).
    let p50 = rows[1].ttft_ms.p50.unwrap();
    assert!((p50 - 400.0).abs() / 400.0 < 0.005);
}

#[test]
fn capacity_rows_need_steady_seconds_and_scaling_needs_n1() {
    let mut acc = CapacityAccumulator::new();
    acc.add_steady_second(2, 100.0);
    acc.add_steady_second(2, 120.0);
    acc.add_request(&RequestLevel {
        level: 3,
        tok_s: Some(9.0),
        ttft_ms: Some(1.0),
        in_flight_at_start: 3,
        cold_start: false,
    });
    let rows = acc.rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].gen_tok_s.mean, 110.0);
    assert!(close(rows[0].gen_tok_s.stdev.unwrap(), 200f64.sqrt()));
    assert_eq!(rows[0].scaling, None);
    assert_eq!(rows[0].marginal_gain, None);
    assert_eq!(rows[0].per_request_tok_s.min, None);
    let json = serde_json::to_value(&rows[0]).unwrap();
    let keys: Vec<_> = json.as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        [
            "in_flight",
            "seconds",
            "gen_tok_s",
            "per_request_tok_s",
            "ttft_ms",
            "scaling",
            "marginal_gain"
        ]
    );
}

#[test]
fn corrupt_records_neither_panic_nor_run_away() {
    let mut huge = record(u64::MAX - 5, 1e300, Some(f64::NAN), Some(5), Some(1), true);
    huge.e2e_ms = Some(1e300);
    let mut long = record(at(0.0), 1e15, Some(-3.0), Some(7), Some(1), true);
    long.tok_s = Some(f64::INFINITY);
    let neg = record(at(0.0), -5.0, Some(-1.0), Some(3), Some(1), false);
    let tl = Timeline::from_records([&huge, &long, &neg]);
    // The 31,700-year request reports at most one day of seconds, and its 7 tokens still add up.
    assert!(tl.seconds.len() <= 2 * 86_400 + 10, "{}", tl.seconds.len());
    let gen: f64 = tl.seconds.values().map(|b| b.gen_tokens).sum();
    assert!(gen <= 15.0 + 1e-9);
    // The negative e2e is a zero-length life: its 3 tokens and 1 prompt token land in second 0.
    assert!(tl.seconds[&S0].gen_tokens >= 3.0);
    assert_eq!(tl.seconds[&S0].prompt_tokens, 2.0);
    let _ = tl.capacity();
}
