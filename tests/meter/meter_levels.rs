//! The production-traffic curve against the simulator's step-time formula, on a controlled
//! clock: the simulator's engine core (a pure state machine) runs agent-like traffic with think
//! time, varied prompts and lengths; its events reach the meter with a little delivery jitter,
//! exactly as the proxy would report them (`sim_traffic.rs`). The truth per level is
//! N x 1000 / (12.2 + 2.1 N) tok/s. The same run's records, with the token curves the tracker
//! would log, go through `analyze`, which must give the meter's curve.

use tokenmeter::meter::{Meter, SnapshotQuery};

use crate::meter_support::T0;
use crate::sim_traffic::{analyze, run_traffic, Traffic};

/// Known aggregate rate of the default simulator at `n` running sequences (no prefill).
fn truth(n: u32) -> f64 {
    n as f64 * 1000.0 / (12.2 + 2.1 * n as f64)
}

/// Runs `agents` closed-loop agents for `duration_s` simulated seconds; think time uniform in
/// `think_ms`, prompts of 20..3000 tokens, outputs of `out` tokens. Returns the meter.
fn run(agents: usize, duration_s: u64, think_ms: (u64, u64), out: (u64, u64), seed: u64) -> Meter {
    run_traffic(&Traffic::new(agents, duration_s, think_ms, out, seed)).meter
}

#[test]
fn sixteen_agents_with_think_time_match_the_step_formula_at_every_level() {
    let mut m = run(16, 600, (200, 3000), (50, 600), 7);
    let snap = m
        .snapshot(T0 + 1_300 * 1_000_000_000, &SnapshotQuery::default())
        .unwrap();
    let rows = &snap.capacity_production;
    println!("level | clean s | guard s | tok/s | truth | diff % | unguarded diff %");
    let mut checked = 0;
    for r in rows {
        let tr = truth(r.in_flight);
        let d = r.gen_tok_s.map(|g| (g / tr - 1.0) * 100.0);
        let du = r.gen_tok_s_unguarded.map(|g| (g / tr - 1.0) * 100.0);
        println!(
            "{:5} | {:7.1} | {:7.1} | {:>7} | {tr:5.1} | {:>6} | {:>6}",
            r.in_flight,
            r.seconds,
            r.guard_s,
            r.gen_tok_s.map_or("thin".into(), |g| format!("{g:.1}")),
            d.map_or("—".into(), |d| format!("{d:+.2}")),
            du.map_or("—".into(), |d| format!("{d:+.2}")),
        );
        if r.seconds >= 20.0 {
            checked += 1;
            let d = d.unwrap();
            // Exact up to the events' delivery jitter: 0.1 %. (The top level was 0.7 % low while
            // the run's first guards, 16 arrivals waiting seconds for one joint prefill, closed at
            // the cap and let that stall into clean time.)
            assert!(d.abs() < 0.1, "level {}: {d:+.2}%", r.in_flight);
        }
    }
    // The traffic puts 20 s or more at levels 13 to 16 in every run; level 12 lands near 20 s
    // (19.7 to 21.8 s seen), so it is not counted on.
    assert!(checked >= 4, "{checked} levels with 20 s");
    // The steady-only curve has far less to go on.
    let steady_s: u64 = snap.capacity.iter().map(|r| r.seconds).sum();
    let clean_s: f64 = rows.iter().map(|r| r.seconds).sum();
    assert!(clean_s > 3.0 * steady_s as f64, "{clean_s} vs {steady_s}");
}

#[test]
fn without_the_guard_prefill_drags_the_figure_down() {
    // Long prompts (20..3000 tokens at 8000 tok/s of prefill) stall every running sequence; the
    // unguarded figure absorbs those stalls, the guarded one does not.
    let mut m = run(8, 300, (100, 1500), (50, 400), 11);
    let snap = m
        .snapshot(T0 + 1_000 * 1_000_000_000, &SnapshotQuery::default())
        .unwrap();
    let mut worse = 0;
    for r in snap
        .capacity_production
        .iter()
        .filter(|r| r.seconds >= 20.0)
    {
        let g = r.gen_tok_s.unwrap();
        let u = r.gen_tok_s_unguarded.unwrap();
        let tr = truth(r.in_flight);
        assert!((g / tr - 1.0).abs() < 0.01, "level {}", r.in_flight);
        if (u / tr - 1.0) < -0.02 {
            worse += 1;
        }
    }
    assert!(worse >= 2, "the guard made no difference");
}

#[test]
fn analyze_of_the_log_gives_the_meter_s_curve_on_the_demo_s_traffic() {
    // The demo's agents: think 0.2-3 s, a third of the requests non-streamed, 20-300 output
    // tokens (prompts of 20-3000 tokens): arrivals are frequent and most time is guarded.
    let run = run_traffic(&Traffic {
        stream_share: 0.7,
        ordered: true,
        ..Traffic::new(16, 900, (200, 3000), (20, 300), 34)
    });
    let (mut m, mut records) = (run.meter, run.records);
    let live = m
        .snapshot(T0 + 1_600 * 1_000_000_000, &SnapshotQuery::default())
        .unwrap()
        .capacity_production;
    let offline = analyze(&records, Default::default());
    assert_eq!(offline.capacity_production_tokens.spread, 0);
    let bytes: usize = records
        .iter()
        .map(|r| serde_json::to_string(&r.token_curve).unwrap().len())
        .sum();
    println!(
        "token_curve: {:.1} bytes a line",
        bytes as f64 / records.len() as f64
    );
    // Lines without the curve (written before it) are spread over [TTFT, end], as before.
    records.iter_mut().for_each(|r| r.token_curve = None);
    let spread = analyze(&records, Default::default());
    println!("| N | clean s | meter tok/s | analyze tok/s | diff % | spread tok/s | diff % |");
    println!("|---|---|---|---|---|---|---|");
    let (mut checked, mut spread_worst) = (0, 0.0f64);
    for l in live.iter().filter(|r| !r.thin) {
        let find = |rep: &tokenmeter::analyze::Report| {
            rep.capacity_production
                .iter()
                .find(|o| o.in_flight == l.in_flight)
                .cloned()
                .unwrap()
        };
        let (o, s) = (find(&offline), find(&spread));
        let g = l.gen_tok_s.unwrap();
        let d = o.gen_tok_s.unwrap() / g - 1.0;
        let ds = s.gen_tok_s.unwrap() / g - 1.0;
        println!(
            "| {} | {:.1} | {g:.1} | {:.1} | {:+.3} | {:.1} | {:+.2} |",
            l.in_flight,
            l.seconds,
            o.gen_tok_s.unwrap(),
            d * 100.0,
            s.gen_tok_s.unwrap(),
            ds * 100.0
        );
        // The same arrivals, first tokens (to the ms) and ends: the same clean time.
        assert!(
            (o.seconds / l.seconds - 1.0).abs() < 1e-3,
            "level {}: clean {} s vs {} s; guard {} vs {}",
            l.in_flight,
            o.seconds,
            l.seconds,
            o.guard_s,
            l.guard_s
        );
        assert!(d.abs() < 0.01, "level {}: {:+.2} %", l.in_flight, d * 100.0);
        checked += 1;
        spread_worst = spread_worst.max(ds.abs());
    }
    assert!(checked >= 3, "{checked} non-thin levels");
    assert!(
        spread_worst > 0.03,
        "the old spreading is off by {spread_worst}"
    );
}
