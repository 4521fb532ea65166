//! The report of a synthetic log with known steady segments reproduces the known numbers.

use crate::analyze_support::{close, lines_of, write, TempDir};
use tokenmeter::analyze::{analyze, synth, AnalyzeOptions, Report};

fn phases_report() -> Report {
    let dir = TempDir::new("phases");
    let path = write(
        &dir.path("access.jsonl"),
        &lines_of(&synth::steady_phases()),
    );
    analyze(&[path], &AnalyzeOptions::default()).unwrap()
}

#[test]
fn capacity_table_reproduces_the_known_rates_exactly() {
    let r = phases_report();
    let rows = &r.capacity;
    assert_eq!(
        rows.iter().map(|c| c.in_flight).collect::<Vec<_>>(),
        [1, 4, 16]
    );
    let want = [(1u32, 70.0, 70.0), (4, 150.0, 37.5), (16, 350.0, 21.875)];
    for (row, (n, mean, per_req)) in rows.iter().zip(want) {
        assert_eq!(row.seconds, 120, "N={n}");
        assert_eq!(row.gen_tok_s.mean, mean, "N={n}");
        assert_eq!(row.gen_tok_s.stdev, Some(0.0), "N={n}");
        assert_eq!(row.per_request_tok_s.avg, per_req);
        // Every request lived exactly at N, so its own tok/s is the share.
        assert_eq!(row.per_request_tok_s.min, Some(per_req), "N={n}");
        assert_eq!(row.per_request_tok_s.max, Some(per_req), "N={n}");
        assert!(close(row.scaling.unwrap(), mean / 70.0));
    }
    assert_eq!(rows[0].marginal_gain, None);
    assert!(close(rows[1].marginal_gain.unwrap(), 150.0 / 70.0 - 1.0));
    assert!(close(rows[2].marginal_gain.unwrap(), 350.0 / 150.0 - 1.0));
    // TTFT at N=1: the cold start (5 s) is kept out, three warm arrivals at 100 ms remain.
    let p99 = rows[0].ttft_ms.p99.unwrap();
    assert!((p99 - 100.0).abs() / 100.0 < 0.005, "{p99}");
    // N=4 arrivals: the 4th of the first wave and 12 replacements, all 400 ms.
    let p50 = rows[1].ttft_ms.p50.unwrap();
    assert!((p50 - 400.0).abs() / 400.0 < 0.005, "{p50}");
}

#[test]
fn human_table_has_the_write_up_format() {
    let text = tokenmeter::analyze::tables::render(&phases_report());
    assert!(text.contains("| 4           | 150.0 ± 0.0 tok/s"), "{text}");
    assert!(text.contains("37.5 / 37.5 / 37.5"), "{text}");
    assert!(text.contains("| 2.1×"), "{text}");
    assert!(text.contains("+114% for 4× users"), "{text}");
    assert!(text.contains("+133% for 4× users"), "{text}");
}

#[test]
fn steady_windows_are_the_three_phases() {
    let r = phases_report();
    let w: Vec<_> = r
        .timeline
        .steady_windows
        .iter()
        .map(|w| (w.start.as_str(), w.seconds, w.in_flight, w.gen_tok_s))
        .collect();
    assert_eq!(
        w,
        [
            ("2026-11-29T18:00:00.000000Z", 120, 1, 70.0),
            ("2026-11-29T18:02:00.000000Z", 120, 4, 150.0),
            ("2026-11-29T18:04:00.000000Z", 120, 16, 350.0),
        ]
    );
    assert_eq!(r.timeline.active_seconds, 360);
    assert_eq!(r.timeline.steady_seconds, 360);
    assert!(r.timeline.per_second.is_none());
}

#[test]
fn summary_users_saturation_and_cold_starts() {
    let r = phases_report();
    let s = &r.summary;
    assert_eq!(s.requests, 4 + 16 + 16);
    assert_eq!(s.generation_requests, 36);
    assert_eq!(s.by_outcome.get("ok"), Some(&36));
    assert_eq!(s.errors, 0);
    assert_eq!(s.users, 16);
    assert_eq!(s.completion_tokens, 4 * 2100 + 16 * 1125 + 16 * 2625);
    assert_eq!(s.prompt_tokens, 36 * 12);
    assert_eq!(s.duration_s, Some(360.0));
    assert_eq!(
        s.first_arrival.as_deref(),
        Some("2026-11-29T18:00:00.000000Z")
    );
    assert_eq!(s.last_end.as_deref(), Some("2026-11-29T18:06:00.000000Z"));
    // lane-0 ran the whole N=1 phase, a quarter of N=4 and a 16th of N=16.
    let lane0 = r.users.iter().find(|u| u.user == "lane-0").unwrap();
    assert_eq!(lane0.completion_tokens, 4 * 2100 + 4 * 1125 + 2625);
    let share = 100.0 * lane0.completion_tokens as f64 / s.completion_tokens as f64;
    assert!(close(lane0.share_pct.unwrap(), share));
    assert_eq!(r.users[0].user, "lane-0");
    assert_eq!(lane0.tok_s.min, Some(21.875));
    assert_eq!(lane0.tok_s.max, Some(70.0));
    let total_share: f64 = r.users.iter().map(|u| u.share_pct.unwrap()).sum();
    assert!(close(total_share, 100.0));
    // TTFT = 100 ms x arrival level. The knee is sought among the steady curve's levels (1, 4
    // and 16, each with 120 s behind it): p90 at 1 is 100 ms, at 4 it is 400 ms > 2 x 100 ms.
    // Arrival levels 2 and 3 have no steady time of their own, so they are not candidates.
    assert_eq!(r.saturation.knee_basis, "steady");
    let knee = r.saturation.knee.as_ref().unwrap();
    assert_eq!((knee.in_flight, knee.baseline_in_flight), (4, 1));
    assert!((knee.ttft_p90_ms - 400.0).abs() < 2.0);
    assert_eq!(r.saturation.levels.len(), 16);
    assert_eq!(r.saturation.levels[0].requests, 4 + 1 + 1);
    assert_eq!(r.cold_starts.count, 1);
    let c = &r.cold_starts.listed[0];
    assert_eq!(c.ts, "2026-11-29T18:00:00.000000Z");
    assert_eq!(
        (c.user.as_str(), c.ttft_ms, c.e2e_ms),
        ("lane-0", Some(5000.0), Some(30000.0))
    );
}

#[test]
fn per_second_series_is_opt_in_and_exact() {
    let dir = TempDir::new("persec");
    let path = write(&dir.path("a.jsonl"), &lines_of(&synth::steady_phases()));
    let opts = AnalyzeOptions {
        per_second: true,
        ..AnalyzeOptions::default()
    };
    let r = analyze(&[path], &opts).unwrap();
    let ps = r.timeline.per_second.as_ref().unwrap();
    assert_eq!(ps.len(), 360);
    assert!(ps[..120]
        .iter()
        .all(|s| s.gen_tokens == 70.0 && s.in_flight_mean == 1.0 && s.steady));
    assert!(ps[240..]
        .iter()
        .all(|s| s.gen_tokens == 350.0 && s.in_flight_min == 16));
}

#[test]
fn a_request_starting_mid_second_breaks_steadiness_only_there() {
    // Two overlapping requests: [0, 10 s] and [3.5 s, 7.5 s]. Seconds 3 and 7 are not steady.
    let mut recs = vec![
        synth::record(synth::T0, 10_000.0, Some(50.0), 100, true, "a"),
        synth::record(
            synth::T0 + 3_500_000_000,
            4_000.0,
            Some(50.0),
            40,
            true,
            "b",
        ),
    ];
    recs[1].in_flight_at_start = 2;
    let dir = TempDir::new("mid");
    let path = write(&dir.path("a.jsonl"), &lines_of(&recs));
    let opts = AnalyzeOptions {
        per_second: true,
        steady_min_s: 1,
        ..AnalyzeOptions::default()
    };
    let r = analyze(&[path], &opts).unwrap();
    let ps = r.timeline.per_second.as_ref().unwrap();
    let steady: Vec<bool> = ps.iter().map(|s| s.steady).collect();
    let mut want = vec![true; 10];
    want[3] = false;
    want[7] = false;
    assert_eq!(steady, want);
    assert!(close(ps[3].in_flight_mean, 1.5));
    assert_eq!((ps[3].in_flight_min, ps[3].in_flight_max), (1, 2));
    assert!(close(ps[7].in_flight_mean, 1.5));
    let rows: Vec<(u32, u64)> = r
        .capacity
        .iter()
        .map(|c| (c.in_flight, c.seconds))
        .collect();
    assert_eq!(rows, [(1, 5), (2, 3)]);
    // Request b's mean level: 2 over its whole life.
    assert_eq!(r.capacity[1].per_request_tok_s.min, Some(10.0));
}

#[test]
fn replay_memory_follows_seconds_not_records() {
    use tokenmeter::meter::replay::ReplayAccumulator;
    // The same 10 minutes with 100 and with 10,000 requests: the same storage.
    let heap = |n: u64| {
        let mut acc = ReplayAccumulator::new();
        for i in 0..n {
            let start = synth::T0 + i * 600 * 1_000_000_000 / n;
            acc.add(&synth::record(start, 5_000.0, Some(40.0), 100, true, "u"));
        }
        acc.heap_bytes()
    };
    assert_eq!(heap(100), heap(10_000));
    assert!(heap(10_000) < 64 * 1024, "{}", heap(10_000));
}

#[test]
fn a_request_ending_as_the_next_begins_keeps_the_second_steady() {
    // A [0, 5.5 s] then B [5.5 s, 10 s]: the level stays 1 through second 5 (a dip of no length).
    // C [2.25 s, 2.5 s] with D starting at 2.5 s and ending at 2.75 s: second 2 is not steady.
    let mut recs = vec![
        synth::record(synth::T0, 5_500.0, Some(50.0), 55, true, "a"),
        synth::record(
            synth::T0 + 5_500_000_000,
            4_500.0,
            Some(50.0),
            45,
            true,
            "b",
        ),
        synth::record(synth::T0 + 2_250_000_000, 250.0, Some(50.0), 5, true, "c"),
        synth::record(synth::T0 + 2_500_000_000, 250.0, Some(50.0), 5, true, "d"),
    ];
    recs[2].in_flight_at_start = 2;
    recs[3].in_flight_at_start = 2;
    let dir = TempDir::new("handover");
    let path = write(&dir.path("a.jsonl"), &lines_of(&recs));
    let opts = AnalyzeOptions {
        per_second: true,
        steady_min_s: 1,
        ..AnalyzeOptions::default()
    };
    let r = analyze(&[path], &opts).unwrap();
    let ps = r.timeline.per_second.as_ref().unwrap();
    let steady: Vec<bool> = ps.iter().map(|s| s.steady).collect();
    assert_eq!(
        steady,
        [true, true, false, true, true, true, true, true, true, true]
    );
    assert_eq!((ps[5].in_flight_min, ps[5].in_flight_max), (1, 1));
    assert!(close(ps[2].in_flight_mean, 1.5));
    // True range 1..=2; without the order of events only the bounds L - ends, L + starts.
    assert_eq!((ps[2].in_flight_min, ps[2].in_flight_max), (0, 3));
    assert_eq!(r.timeline.steady_windows.len(), 2);
    assert_eq!(r.timeline.steady_windows[1].seconds, 7);
    // Per-request levels: A's mean is (5.5 + 0.5) / 5.5 -> 1, B's 1; C and D (20 tok/s) are at 2,
    // which has no steady second, so no row.
    assert_eq!(r.capacity.len(), 1);
    let row = &r.capacity[0];
    assert_eq!((row.in_flight, row.seconds), (1, 9));
    assert_eq!(row.per_request_tok_s.min, Some(10.0));
    assert_eq!(row.per_request_tok_s.max, Some(10.0));
}

/// The `points` of the plot's series named `name`.
fn series_points<'a>(svg: &'a str, name: &str) -> &'a str {
    let at = svg
        .find(&format!("data-series=\"{name}\""))
        .unwrap_or_else(|| panic!("no series {name} in {svg}"));
    let rest = &svg[at..];
    let start = rest.find("points=\"").unwrap() + "points=\"".len();
    let end = rest[start..].find('"').unwrap();
    &rest[start..start + end]
}

#[test]
fn thin_levels_of_the_steady_curve_are_marked_and_left_out_of_the_plot() {
    let dir = TempDir::new("thin");
    let path = write(
        &dir.path("access.jsonl"),
        &lines_of(&synth::steady_phases()),
    );
    // Each phase has 120 steady seconds: thin below 200, not at the default 10.
    let thin = analyze(
        std::slice::from_ref(&path),
        &AnalyzeOptions {
            capacity_min_s: 200,
            ..AnalyzeOptions::default()
        },
    )
    .unwrap();
    let text = tokenmeter::analyze::tables::render(&thin);
    assert_eq!(text.matches("| 120 (thin) |").count(), 3, "{text}");
    let svg = tokenmeter::analyze::svg::capacity(&thin);
    assert_eq!(series_points(&svg, "aggregate tok/s"), "", "{svg}");
    let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    let text = tokenmeter::analyze::tables::render(&r);
    assert!(!text.contains("(thin) |"), "{text}");
    assert_eq!(
        series_points(&tokenmeter::analyze::svg::capacity(&r), "aggregate tok/s")
            .split(' ')
            .count(),
        3
    );
    // Every column of the saturation table is named.
    let header = text
        .lines()
        .find(|l| l.starts_with("| In flight at arrival"))
        .unwrap();
    assert!(
        header.ends_with("| Knee |") || header.contains("| Knee "),
        "{header}"
    );
    assert!(!header.contains("|  |"), "{header}");
}
