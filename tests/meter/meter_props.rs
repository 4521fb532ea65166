//! Property tests of the pure pieces against direct computations.

use proptest::prelude::*;
use tokenmeter::meter::histogram::LogHistogram;
use tokenmeter::meter::timeline::spread;

proptest! {
    #[test]
    fn percentiles_are_within_half_a_percent_of_the_exact_nearest_rank(
        values in prop::collection::vec(0.001f64..1e7, 1..300),
        q in 0.0f64..=1.0,
    ) {
        let mut h = LogHistogram::new();
        values.iter().for_each(|v| h.record(*v));
        let mut sorted = values.clone();
        sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        let exact = sorted[rank - 1];
        let got = h.percentile(q).unwrap();
        // Values sharing the exact value's bin are indistinguishable, so compare with the bin.
        prop_assert!((got - exact).abs() / exact <= 0.0051, "q={} exact={} got={}", q, exact, got);
        prop_assert_eq!(h.count(), values.len() as u64);
    }

    #[test]
    fn spreading_conserves_the_amount_and_follows_overlap(
        from in 0u64..50_000_000_000,
        len in 0u64..20_000_000_000,
        amount in 0.0f64..1e6,
    ) {
        let mut got: Vec<(u64, f64)> = vec![];
        spread(from, from + len, amount, 0, &mut |s, v| got.push((s, v)));
        let total: f64 = got.iter().map(|(_, v)| v).sum();
        prop_assert!((total - amount).abs() <= 1e-9 * amount.max(1.0));
        for (s, v) in &got {
            let lo = from.max(s * 1_000_000_000);
            let hi = (from + len).min((s + 1) * 1_000_000_000);
            let want = if len == 0 { amount } else { amount * (hi - lo) as f64 / len as f64 };
            prop_assert!((v - want).abs() <= 1e-6 * amount.max(1.0), "second {} got {} want {}", s, v, want);
        }
    }
}

use crate::meter_support::{at, record, T0};
use tokenmeter::meter::replay::Timeline;
use tokenmeter::meter::{Meter, MeterConfig, SnapshotQuery};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The live meter and the replay of the same records agree on the capacity curve and totals.
    #[test]
    fn live_and_replay_agree(reqs in prop::collection::vec((0u64..120_000, 0u64..20_000, 0u64..400, any::<bool>()), 1..40)) {
        let recs: Vec<_> = reqs.iter().enumerate().map(|(i, &(start_ms, e2e_ms, tokens, stream))| {
            let ttft = stream.then_some((e2e_ms / 5) as f64);
            let mut r = record(at(start_ms as f64 / 1e3), e2e_ms as f64, ttft, Some(tokens), Some(3), stream);
            r.request_id = format!("tm-1-{:x}", i + 1);
            r
        }).collect();
        // At one instant ends come before starts, except a request's own end, which must follow
        // its start (a zero-length request); key 0 = end, 1 = start, 2 = end of a zero-length one.
        let mut events: Vec<(u64, u8, usize)> = vec![];
        for (i, r) in recs.iter().enumerate() {
            events.push((r.start_ns(), 1, i));
            events.push((r.end_ns(), if r.end_ns() == r.start_ns() { 2 } else { 0 }, i));
        }
        events.sort();
        let mut m = Meter::new(MeterConfig::default(), T0);
        for (t, kind, i) in events {
            if kind == 1 {
                m.request_started(t, i as u64 + 1, "u", None);
            } else {
                m.request_finished(t, &recs[i]);
            }
        }
        let snap = m.snapshot(at(300.0), &SnapshotQuery::default()).unwrap();
        let replay = Timeline::from_records(&recs).capacity();
        prop_assert_eq!(snap.capacity.len(), replay.len());
        for (a, b) in snap.capacity.iter().zip(&replay) {
            prop_assert_eq!((a.in_flight, a.seconds), (b.in_flight, b.seconds));
            prop_assert!((a.gen_tok_s.mean - b.gen_tok_s.mean).abs() < 1e-6);
            prop_assert_eq!(a.per_request_tok_s.min, b.per_request_tok_s.min);
            prop_assert_eq!(a.ttft_ms, b.ttft_ms);
        }
        let total: u64 = reqs.iter().map(|r| r.2).sum();
        prop_assert_eq!(snap.totals.completion_tokens, total);
        let w = snap.windows.get("300s").unwrap();
        let live_sum: f64 = w.gen_tok_s.unwrap() * 300.0;
        prop_assert!((live_sum - total as f64).abs() < 1e-6 * (total as f64).max(1.0));
    }
}
