//! The pure `Meter` on injected time: window sums, steadiness, attribution, scopes.

use crate::meter_support::{at, close, record, T0};
use tokenmeter::meter::replay::Timeline;
use tokenmeter::meter::{Meter, MeterConfig, SnapshotError, SnapshotQuery};
use tokenmeter::record::RequestRecord;

fn all() -> SnapshotQuery {
    SnapshotQuery::default()
}

fn rec_id(mut r: RequestRecord, id: u64, user: &str) -> RequestRecord {
    r.request_id = format!("tm-0000abcd-{id:08x}");
    r.user = user.into();
    r
}

#[test]
fn sixteen_streams_give_exact_window_sums_and_a_steady_level() {
    // 16 streams start at i ms, emit one token every 45 ms from 0.2 s on, and finish at 60 s + i ms.
    let mut events: Vec<(u64, u8, u64)> = vec![]; // (time, kind 0 start / 1 token / 2 finish, stream)
    let mut token_times = vec![];
    for i in 0..16u64 {
        let start = at(0.0) + i * 1_000_000;
        events.push((start, 0, i));
        let mut t = start + 200_000_000;
        while t < at(60.0) {
            events.push((t, 1, i));
            token_times.push(t);
            t += 45_000_000;
        }
        events.push((at(60.0) + i * 1_000_000, 2, i));
    }
    events.sort();
    let mut m = Meter::new(MeterConfig::default(), T0);
    let mut emitted = [0u64; 16];
    for &(t, kind, i) in &events {
        match kind {
            0 => m.request_started(t, i, "u", Some("tiny-llama")),
            1 => {
                m.tokens(t, i, 1);
                emitted[i as usize] += 1;
            }
            _ => {
                let r = rec_id(
                    record(
                        at(0.0) + i * 1_000_000,
                        60_000.0,
                        Some(200.0),
                        Some(emitted[i as usize]),
                        Some(3),
                        true,
                    ),
                    i,
                    "u",
                );
                m.request_finished(t, &r);
            }
        }
    }
    // Before the finishes: snapshot at 55.5 s covers the complete seconds [45, 55).
    let mut m2 = Meter::new(MeterConfig::default(), T0);
    for &(t, kind, i) in events.iter().filter(|e| e.0 < at(55.5)) {
        match kind {
            0 => m2.request_started(t, i, "u", None),
            1 => m2.tokens(t, i, 1),
            _ => unreachable!(),
        }
    }
    let snap = m2.snapshot(at(55.5), &all()).unwrap();
    let w = snap.windows.get("10s").unwrap();
    let known = token_times
        .iter()
        .filter(|&&t| t >= at(45.0) && t < at(55.0))
        .count();
    assert_eq!(w.seconds, 10);
    assert_eq!(w.gen_tok_s, Some(known as f64 / 10.0));
    assert!(w.steady);
    let f = w.in_flight.as_ref().unwrap();
    assert_eq!((f.min, f.max), (16, 16));
    assert!(close(f.mean, 16.0));
    // The 60 s window is clipped to the 55 complete seconds since the meter started.
    let w60 = snap.windows.get("60s").unwrap();
    assert_eq!(w60.seconds, 55);
    assert!(!w60.steady);
    assert_eq!(
        w60.gen_tok_s,
        Some(token_times.iter().filter(|&&t| t < at(55.0)).count() as f64 / 55.0)
    );
    // Every full 10 s window of the complete run equals its known count / 10 (usage == counted).
    let snap = m.snapshot(at(61.0), &all()).unwrap();
    let w = snap.windows.get("60s").unwrap();
    let known = token_times.iter().filter(|&&t| t >= at(1.0)).count();
    assert!(close(w.gen_tok_s.unwrap(), known as f64 / 60.0));
    assert_eq!(snap.totals.completion_tokens, token_times.len() as u64);
    assert_eq!(w.requests_finished, Some(16));
    for end in [10u64, 20, 30, 40, 50, 60] {
        let snap = m.snapshot(at(end as f64 + 0.5), &all()).unwrap();
        let lo = at(end as f64 - 10.0);
        let known = token_times
            .iter()
            .filter(|&&t| t >= lo && t < at(end as f64))
            .count();
        assert_eq!(
            snap.windows.get("10s").unwrap().gen_tok_s,
            Some(known as f64 / 10.0),
            "window ending {end}"
        );
    }
}

#[test]
fn steady_flips_exactly_when_in_flight_changes() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    m.request_started(at(0.0), 1, "a", None);
    let w = |m: &mut Meter, now: f64| {
        m.snapshot(at(now), &all())
            .unwrap()
            .windows
            .get("10s")
            .unwrap()
            .clone()
    };
    assert!(w(&mut m, 12.0).steady_strict); // [2, 12) at N=1
    m.request_started(at(12.3), 2, "a", None);
    let w12 = w(&mut m, 12.9);
    assert!(w12.steady_strict, "second 12 is still partial and excluded");
    let w13 = w(&mut m, 13.0);
    assert!(!w13.steady_strict, "[3, 13) covers second 12");
    // 9.3 s at 1, 0.7 s at 2: the median is 1, the deviation 0.07 > 5 % of 1.
    assert!(!w13.steady);
    assert_eq!(w13.in_flight.as_ref().unwrap().median, 1);
    assert!(close(w13.in_flight.as_ref().unwrap().shares[&2], 0.07));
    let f = w13.in_flight.as_ref().unwrap();
    assert_eq!((f.min, f.max), (1, 2));
    assert!(close(f.mean, 1.07));
    let w22 = w(&mut m, 22.9);
    assert!(!w22.steady_strict, "[12, 22) still covers second 12");
    // 0.3 s at 1 and 9.7 s at 2: deviation 0.03 is 1.5 % of 2, within the 5 % tolerance.
    assert!(w22.steady);
    assert_eq!(w22.steady_in_flight, Some(2));
    assert!(close(w22.in_flight.as_ref().unwrap().deviation, 0.03));
    let w23 = w(&mut m, 23.0);
    assert!(w23.steady_strict && w23.steady, "[13, 23) at N=2");
    assert_eq!(w23.in_flight.as_ref().unwrap().min, 2);
}

#[test]
fn reconciliation_and_non_stream_spread_and_prompt_second() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    // Streamed: 10 counted events in second 2, usage says 14, TTFT at 2.0, end 5.0.
    m.request_started(at(1.0), 7, "a", None);
    for k in 0..10 {
        m.tokens(at(2.0 + k as f64 * 0.05), 7, 1);
    }
    let r = rec_id(
        record(at(1.0), 4000.0, Some(1000.0), Some(14), Some(9), true),
        7,
        "a",
    );
    m.request_finished(at(5.0), &r);
    // Non-streamed: [20.5, 23.5], 30 tokens, prompt 4 at the end second.
    m.request_started(at(20.5), 8, "a", None);
    let r = rec_id(
        record(at(20.5), 3000.0, None, Some(30), Some(4), false),
        8,
        "a",
    );
    m.request_finished(at(23.5), &r);
    let snap = m.snapshot(at(11.0), &all()).unwrap();
    let w = snap.windows.get("10s").unwrap();
    assert!(close(w.gen_tok_s.unwrap() * 10.0, 14.0));
    assert_eq!(w.prompt_tok_s, Some(0.9));
    let per_sec = |m: &mut Meter, s: f64| {
        let q = SnapshotQuery {
            window: Some("10s".into()),
            ..all()
        };
        let a = m
            .snapshot(at(s + 10.0), &q)
            .unwrap()
            .windows
            .get("10s")
            .unwrap()
            .gen_tok_s
            .unwrap()
            * 10.0;
        let b = m
            .snapshot(at(s + 11.0), &q)
            .unwrap()
            .windows
            .get("10s")
            .unwrap()
            .gen_tok_s
            .unwrap()
            * 10.0;
        b - a // tokens of second s + 10 minus those of second s
    };
    // Seconds 20..=23 get 5, 10, 10, 5 (seconds 10..=13 are empty).
    for (s, want) in [(10.0, 5.0), (11.0, 10.0), (12.0, 10.0), (13.0, 5.0)] {
        assert!(close(per_sec(&mut m, s), want), "second {}", s + 10.0);
    }
    let w = m.snapshot(at(30.0), &all()).unwrap();
    let w = w.windows.get("10s").unwrap();
    assert!(close(w.gen_tok_s.unwrap(), 3.0));
    assert_eq!(w.prompt_tok_s, Some(0.4));
}

#[test]
fn users_are_isolated_capped_and_expire() {
    let cfg = MeterConfig {
        max_tracked_users: 2,
        user_idle_expiry_s: 60,
        ..Default::default()
    };
    let mut m = Meter::new(cfg, T0);
    for (id, user) in [(1, "alice"), (2, "bob"), (3, "carol"), (4, "dave")] {
        m.request_started(at(1.0), id, user, Some("m"));
        m.tokens(at(1.5), id, id * 10);
        let r = rec_id(
            record(at(1.0), 1000.0, Some(100.0), Some(id * 10), Some(1), true),
            id,
            user,
        );
        m.request_finished(at(2.0), &r);
    }
    let snap = m.snapshot(at(12.0), &all()).unwrap();
    let names: Vec<_> = snap.users.keys().cloned().collect();
    assert_eq!(names, ["alice", "bob", "other"]);
    assert_eq!(snap.users_folded, 2);
    assert_eq!(snap.users["alice"].totals.completion_tokens, 10);
    let early = m.snapshot(at(11.0), &all()).unwrap();
    assert_eq!(
        early.users["bob"].windows.get("10s").unwrap().gen_tok_s,
        Some(2.0)
    );
    assert_eq!(
        early.users["alice"].windows.get("10s").unwrap().gen_tok_s,
        Some(1.0)
    );
    assert_eq!(early.windows.get("10s").unwrap().gen_tok_s, Some(10.0));
    assert_eq!(snap.users["other"].totals.completion_tokens, 70);
    assert_eq!(snap.users["other"].totals.requests, 2);
    assert_eq!(snap.totals.completion_tokens, 100);
    assert_eq!(snap.users["alice"].idle_s, 10.0);
    let only = m
        .snapshot(
            at(12.0),
            &SnapshotQuery {
                user: Some("bob".into()),
                ..all()
            },
        )
        .unwrap();
    assert_eq!(only.users.keys().collect::<Vec<_>>(), ["bob"]);
    // Idle for more than 60 s: gone from the live view, still in the aggregate totals.
    let late = m.snapshot(at(63.0), &all()).unwrap();
    assert!(late.users.is_empty());
    assert_eq!(late.totals.requests, 4);
    // After expiry a new user fits under the cap again.
    m.request_started(at(70.0), 9, "erin", None);
    assert!(m
        .snapshot(at(71.0), &all())
        .unwrap()
        .users
        .contains_key("erin"));
}

#[test]
fn unknown_window_is_an_error_and_a_known_one_filters() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    let err = m
        .snapshot(
            at(5.0),
            &SnapshotQuery {
                window: Some("7s".into()),
                ..all()
            },
        )
        .unwrap_err();
    assert!(matches!(err, SnapshotError::UnknownWindow { .. }));
    assert!(err.to_string().contains("10s, 60s, 300s"));
    let snap = m
        .snapshot(
            at(5.0),
            &SnapshotQuery {
                window: Some("60s".into()),
                ..all()
            },
        )
        .unwrap();
    assert_eq!(snap.windows.0.len(), 1);
    assert_eq!(snap.windows.get("60s").unwrap().seconds, 5);
    assert_eq!(snap.windows.get("60s").unwrap().gen_tok_s, Some(0.0));
    let fresh = m.snapshot(T0 + 1, &all()).unwrap();
    assert_eq!(
        fresh.windows.get("10s").unwrap().gen_tok_s,
        None,
        "no complete second yet"
    );
}

#[test]
fn live_capacity_matches_the_replayed_timeline() {
    // 120 s at N=1 (70 tok/s), 120 s at N=4 (150 total), 120 s at N=16 (350 total), non-streamed.
    let mut recs = vec![];
    let mut first = record(
        at(0.0),
        120_000.0,
        Some(5000.0),
        Some(8400),
        Some(10),
        false,
    );
    first.cold_start = true;
    recs.push(first);
    for (phase, n, total) in [(1.0, 4u64, 150u64), (2.0, 16, 350)] {
        for i in 0..n {
            let mut r = record(
                at(phase * 120.0),
                120_000.0,
                Some(100.0),
                Some(total * 120 / n),
                Some(10),
                false,
            );
            r.in_flight_at_start = i as u32 + 1;
            recs.push(r);
        }
    }
    let mut m = Meter::new(MeterConfig::default(), T0);
    let mut id = 0;
    let mut phase_recs: Vec<Vec<(u64, RequestRecord)>> = vec![vec![], vec![], vec![]];
    for r in &recs {
        let p = ((r.start_ns() - T0) / 120_000_000_000) as usize;
        id += 1;
        phase_recs[p].push((id, rec_id(r.clone(), id, "u")));
    }
    for phase in &phase_recs {
        for (id, r) in phase {
            m.request_started(r.start_ns(), *id, "u", None);
        }
        for (_, r) in phase {
            m.request_finished(r.end_ns(), r);
        }
    }
    let snap = m.snapshot(at(400.0), &all()).unwrap();
    let replay = Timeline::from_records(&recs).capacity();
    assert_eq!(snap.capacity, replay);
    let means: Vec<_> = snap
        .capacity
        .iter()
        .map(|r| (r.in_flight, r.seconds, r.gen_tok_s.mean))
        .collect();
    assert_eq!(
        means,
        vec![(1, 120, 70.0), (4, 120, 150.0), (16, 120, 350.0)]
    );
    assert_eq!(snap.totals.cold_starts, 1);
    assert_eq!(snap.totals.requests, 21);
}
