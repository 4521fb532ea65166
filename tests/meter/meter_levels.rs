//! The production-traffic curve against the simulator's step-time formula, on a controlled
//! clock: the simulator's engine core (a pure state machine) runs agent-like traffic with think
//! time, varied prompts and lengths; its events reach the meter with a little delivery jitter,
//! exactly as the proxy would report them. The truth per level is N x 1000 / (12.2 + 2.1 N) tok/s.
//! The same run's records, with the token curves the tracker would log, go through `analyze`,
//! which must give the meter's curve.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use rand::{rngs::SmallRng, Rng, SeedableRng};
use tokenmeter::meter::{Meter, MeterConfig, SnapshotQuery};
use tokenmeter::sim::engine::{Engine, Ev, Job, Sink};
use tokenmeter::sim::metrics::Stats;
use tokenmeter::sim::SimConfig;
use tokenmeter::token_curve::TokenCurveBuilder;

use crate::meter_support::{record, T0};

#[derive(Clone, Default)]
struct Rec(Rc<RefCell<Vec<Ev>>>);

impl Sink for Rec {
    fn is_closed(&self) -> bool {
        false
    }
    fn deliver(&mut self, ev: Ev) -> bool {
        self.0.borrow_mut().push(ev);
        true
    }
}

struct Open {
    rec: Rec,
    arrival: u64,
    first: Option<u64>,
    tokens: u64,
    agent: usize,
    prompt: u64,
    /// Streamed (its tokens reach the meter as they pass), else answered at its end.
    stream: bool,
    curve: TokenCurveBuilder,
}

/// The traffic of one run.
struct Traffic {
    agents: usize,
    duration_s: u64,
    think_ms: (u64, u64),
    out: (u64, u64),
    /// Share of the requests streamed (1: every one).
    stream_share: f64,
    /// The meter hears of events in time order; else as the harness makes them (an arrival
    /// after the previous step's tokens, a finish after its step's tokens: up to 0.7 ms late,
    /// which the meter applies at the later time).
    ordered: bool,
    seed: u64,
}

/// One call to the meter.
enum Call {
    Start(String),
    Tokens(u64),
    Finish(Box<tokenmeter::record::RequestRecord>),
}

/// The meter, told of events at once or in time order.
struct Delivery {
    meter: Meter,
    ordered: bool,
    /// (time, order made, request, call) not told yet.
    queue: Vec<(u64, u64, u64, Call)>,
    made: u64,
}

impl Delivery {
    fn send(&mut self, at: u64, id: u64, call: Call) {
        self.made += 1;
        self.queue.push((at, self.made, id, call));
        if !self.ordered {
            self.flush_before(u64::MAX);
        }
    }

    /// Tells the meter every event before `t`, in time order.
    fn flush_before(&mut self, t: u64) {
        self.queue.sort_by_key(|e| (e.0, e.1));
        let n = self.queue.partition_point(|e| e.0 < t);
        for (at, _, id, call) in self.queue.drain(..n) {
            match call {
                Call::Start(agent) => self.meter.request_started(at, id, &agent, Some("m")),
                Call::Tokens(n) => self.meter.tokens(at, id, n),
                Call::Finish(r) => self.meter.request_finished_id(at, Some(id), &r),
            }
        }
    }
}

/// Known aggregate rate of the default simulator at `n` running sequences (no prefill).
fn truth(n: u32) -> f64 {
    n as f64 * 1000.0 / (12.2 + 2.1 * n as f64)
}

/// Runs `agents` closed-loop agents for `duration_s` simulated seconds; think time uniform in
/// `think_ms`, prompts of 20..3000 tokens, outputs of `out` tokens. Returns the meter.
fn run(agents: usize, duration_s: u64, think_ms: (u64, u64), out: (u64, u64), seed: u64) -> Meter {
    run_traffic(&Traffic {
        agents,
        duration_s,
        think_ms,
        out,
        stream_share: 1.0,
        ordered: false,
        seed,
    })
    .0
}

/// Runs `t`; returns the meter and every record, with the token curve the tracker would log.
fn run_traffic(t: &Traffic) -> (Meter, Vec<tokenmeter::record::RequestRecord>) {
    let &Traffic {
        agents,
        duration_s,
        think_ms,
        out,
        stream_share,
        ordered,
        seed,
    } = t;
    const MS: u64 = 1_000_000;
    let mut records = Vec::new();
    let cfg = SimConfig {
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    };
    let mut engine: Engine<Rec> = Engine::new(cfg, Arc::new(Stats::new(3600)));
    let mut meter = Delivery {
        meter: Meter::new(MeterConfig::default(), T0),
        ordered,
        queue: Vec::new(),
        made: 0,
    };
    let mut rng = SmallRng::seed_from_u64(seed);
    // Next arrival time per agent (engine time, ns from 0).
    let mut next: Vec<Option<u64>> = (0..agents)
        .map(|_| Some(rng.gen_range(0..2000) * MS))
        .collect();
    let mut open: HashMap<u64, Open> = HashMap::new();
    let mut id = 0u64;
    let mut t = 0u64;
    let end_ns = duration_s * 1_000_000_000;
    let jitter = |rng: &mut SmallRng| rng.gen_range(20_000..600_000u64);
    let mut arrivals_until = |t_to: u64,
                              rng: &mut SmallRng,
                              engine: &mut Engine<Rec>,
                              meter: &mut Delivery,
                              open: &mut HashMap<u64, Open>,
                              next: &mut Vec<Option<u64>>| {
        loop {
            let Some((agent, at)) = next
                .iter()
                .enumerate()
                .filter_map(|(i, n)| n.map(|n| (i, n)))
                .min_by_key(|&(_, n)| n)
            else {
                return;
            };
            if at >= t_to || at >= end_ns {
                return;
            }
            next[agent] = None;
            id += 1;
            let rec = Rec::default();
            let prompt = rng.gen_range(20..3000);
            // Drawn only for mixed traffic, so all-streamed runs keep their sequence.
            let stream = stream_share >= 1.0 || rng.gen_bool(stream_share);
            engine.submit(Job {
                n: 1,
                prompt_tokens: prompt,
                max_tokens: rng.gen_range(out.0..out.1),
                stop_after: vec![None],
                arrival_ns: at,
                prompt_ids: Vec::new(),
                sink: rec.clone(),
            });
            meter.send(T0 + at, id, Call::Start(format!("agent-{agent}")));
            open.insert(
                id,
                Open {
                    rec,
                    arrival: at,
                    first: None,
                    tokens: 0,
                    agent,
                    prompt,
                    stream,
                    curve: TokenCurveBuilder::new(T0 + at),
                },
            );
        }
    };
    while t < end_ns + 600_000_000_000 {
        let Some(dur) = engine.begin_step(t) else {
            // Idle: jump to the next arrival.
            match next.iter().flatten().min() {
                Some(&n) if n < end_ns => {
                    t = t.max(n);
                    arrivals_until(
                        t + 1,
                        &mut rng,
                        &mut engine,
                        &mut meter,
                        &mut open,
                        &mut next,
                    );
                    continue;
                }
                _ => break,
            }
        };
        let step_end = t + dur;
        arrivals_until(
            step_end,
            &mut rng,
            &mut engine,
            &mut meter,
            &mut open,
            &mut next,
        );
        engine.finish_step(step_end, 0);
        let mut done = Vec::new();
        for (&rid, o) in open.iter_mut() {
            let evs: Vec<Ev> = o.rec.0.borrow_mut().drain(..).collect();
            let n = evs.iter().filter(|e| matches!(e, Ev::Token { .. })).count() as u64;
            let seen = step_end + jitter(&mut rng);
            if n > 0 {
                o.tokens += n;
                if o.stream {
                    o.first.get_or_insert(seen);
                    meter.send(T0 + seen, rid, Call::Tokens(n));
                    o.curve.push(T0 + seen, n);
                }
            }
            if evs.iter().any(|e| matches!(e, Ev::Done(_))) {
                done.push((rid, seen + 100_000));
            }
        }
        done.sort_by_key(|d| d.1);
        for (rid, fin) in done {
            let o = open.remove(&rid).unwrap();
            let ms = |ns: u64| ns as f64 / 1e6;
            let mut r = record(
                T0 + o.arrival,
                ms(fin - o.arrival),
                o.first.map(|f| ms(f - o.arrival)),
                Some(o.tokens),
                Some(o.prompt),
                o.stream,
            );
            r.token_curve = o.curve.finish();
            meter.send(T0 + fin, rid, Call::Finish(Box::new(r.clone())));
            records.push(r);
            let think = rng.gen_range(think_ms.0..=think_ms.1) * MS;
            next[o.agent] = Some(fin + think);
        }
        t = step_end;
        // Nothing made from here on is earlier than the step's end.
        meter.flush_before(T0 + t);
    }
    meter.flush_before(u64::MAX);
    (meter.meter, records)
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

/// `analyze` on `records` written as a log.
fn analyze(records: &[tokenmeter::record::RequestRecord]) -> tokenmeter::analyze::Report {
    let dir = crate::common::TempDir::new("levels-log");
    let log = dir.0.join("access.jsonl");
    let text: Vec<u8> = records
        .iter()
        .flat_map(tokenmeter::record::RequestRecord::to_json_line)
        .collect();
    std::fs::write(&log, text).unwrap();
    tokenmeter::analyze::analyze(&[log], &Default::default()).unwrap()
}

#[test]
fn analyze_of_the_log_gives_the_meter_s_curve_on_the_demo_s_traffic() {
    // The demo's agents: think 0.2-3 s, a third of the requests non-streamed, 20-300 output
    // tokens (prompts of 20-3000 tokens): arrivals are frequent and most time is guarded.
    let (mut m, mut records) = run_traffic(&Traffic {
        agents: 16,
        duration_s: 900,
        think_ms: (200, 3000),
        out: (20, 300),
        stream_share: 0.7,
        ordered: true,
        seed: 34,
    });
    let live = m
        .snapshot(T0 + 1_600 * 1_000_000_000, &SnapshotQuery::default())
        .unwrap()
        .capacity_production;
    let offline = analyze(&records);
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
    let spread = analyze(&records);
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
