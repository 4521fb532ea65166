//! The saturation state against the simulator's engine in simulated time, with and without a
//! scrape: closed-loop agents at the engine's `max_num_seqs` for 30 minutes (every request is
//! admitted at the next step: a plateau just below queueing), one long prompt among them, then
//! four agents more (requests wait for a slot). The meter hears the proxy's events (arrival,
//! each token with its ITL gap, the end) at the engine's step ends; with a scrape, it also gets
//! vLLM's `num_requests_waiting` and `num_preemptions_total` as the engine published them at
//! its last step, once a second. The state must stay `ok` over the plateau (the long prompt
//! included) and turn `queueing` within two 10 s windows of the engine's first queueing.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use rand::{rngs::SmallRng, Rng, SeedableRng};
use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::itl::{Gap, Gaps};
use tokenmeter::meter::saturation::SaturationState;
use tokenmeter::meter::{Meter, MeterConfig, SnapshotQuery};
use tokenmeter::scrape::{ServerSample, VllmValues};
use tokenmeter::sim::engine::{Engine, Ev, Job};
use tokenmeter::sim::metrics::Stats;
use tokenmeter::sim::SimConfig;

use crate::meter_support::{record, Rec, T0};

struct Open {
    rec: Rec,
    arrival: u64,
    first: Option<u64>,
    last: Option<u64>,
    tokens: u64,
    prompt: u64,
    agent: usize,
    /// The one long prompt.
    long: bool,
}

const S: u64 = NANOS_PER_SEC;
const MS: u64 = 1_000_000;
const PLATEAU_S: u64 = 1800;
const SLOTS: usize = 16;
const LONG_PROMPT_AT_S: u64 = 900;

/// What one run saw.
struct Run {
    /// The state over the 10 s window at each second (index = second).
    states: Vec<Option<SaturationState>>,
    /// The engine's first step that left a request waiting for a slot, ns.
    first_queueing_ns: Option<u64>,
    /// The long prompt's TTFT, ns.
    long_ttft_ns: Option<u64>,
    meter: Meter,
}

fn run(scrape: bool) -> Run {
    let cfg = SimConfig {
        max_num_seqs: SLOTS as u32,
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    };
    let stats = Arc::new(Stats::new(3600));
    let mut engine: Engine<Rec> = Engine::new(cfg, stats.clone());
    let mut meter = Meter::new(
        MeterConfig {
            windows_s: vec![10, 60],
            ..MeterConfig::default()
        },
        T0,
    );
    if scrape {
        meter.enable_server(10.0);
    }
    let mut rng = SmallRng::seed_from_u64(36);
    let end_ns = (PLATEAU_S + 60) * S;
    // Agents 0..16 from the start; 16..20 join when the plateau ends.
    let mut next: Vec<Option<u64>> = (0..SLOTS + 4)
        .map(|a| {
            let from = if a < SLOTS { 0 } else { PLATEAU_S * S };
            Some(from + rng.gen_range(0..2000) * MS)
        })
        .collect();
    let mut long_pending = true;
    let mut open: HashMap<u64, Open> = HashMap::new();
    let (mut id, mut t, mut next_sec) = (0u64, 0u64, 1u64);
    let mut waiting_published = 0u64;
    let mut out = Run {
        states: vec![None],
        first_queueing_ns: None,
        long_ttft_ns: None,
        meter: Meter::new(MeterConfig::default(), T0),
    };
    // Every second boundary up to `to`: the scrape (what the engine last published), then the
    // state over the window ending there.
    let mut seconds_until = |to: u64, meter: &mut Meter, waiting: u64, out: &mut Run| {
        while next_sec * S <= to {
            let at = T0 + next_sec * S;
            if scrape {
                let mut values = VllmValues {
                    waiting: Some(waiting as f64),
                    running: Some(stats.running.load(Relaxed) as f64),
                    ..VllmValues::default()
                };
                values.kv.preemptions_total = Some(stats.preemptions.load(Relaxed) as f64);
                meter.server_sample(ServerSample {
                    ts_ns: at - 1,
                    values,
                    proxy_in_flight: None,
                    scrape_ms: 1.0,
                });
            }
            out.states.push(meter.saturation_now(at));
            next_sec += 1;
        }
    };
    // Submits the arrivals before `$bound`, in time order.
    macro_rules! arrivals_before {
        ($bound:expr) => {
            loop {
                let (agent, at) = match next
                    .iter()
                    .enumerate()
                    .filter_map(|(i, n)| n.map(|n| (i, n)))
                    .min_by_key(|&(_, n)| n)
                {
                    Some((a, at)) if at < $bound => (a, at),
                    _ => break,
                };
                seconds_until(at, &mut meter, waiting_published, &mut out);
                next[agent] = None;
                // Agent 0's first turn after LONG_PROMPT_AT_S carries the one long prompt.
                let long = agent == 0 && long_pending && at >= LONG_PROMPT_AT_S * S;
                long_pending &= !long;
                let (prompt, max_tokens) = if long {
                    (40_000, 20)
                } else {
                    (rng.gen_range(20..1000), rng.gen_range(100..300))
                };
                id += 1;
                let rec = Rec::default();
                engine.submit(Job {
                    n: 1,
                    prompt_tokens: prompt,
                    max_tokens,
                    stop_after: vec![None],
                    arrival_ns: at,
                    prompt_ids: Vec::new(),
                    sink: rec.clone(),
                });
                meter.request_started(T0 + at, id, "agent", Some("m"));
                open.insert(
                    id,
                    Open {
                        rec,
                        arrival: at,
                        first: None,
                        last: None,
                        tokens: 0,
                        prompt,
                        agent,
                        long,
                    },
                );
            }
        };
    }
    while t < end_ns {
        arrivals_before!(t + 1);
        let Some(dur) = engine.begin_step(t) else {
            t = next
                .iter()
                .flatten()
                .min()
                .copied()
                .unwrap_or(end_ns)
                .max(t + 1);
            continue;
        };
        waiting_published = engine.waiting_len() as u64;
        if t >= PLATEAU_S * S && waiting_published > 0 && out.first_queueing_ns.is_none() {
            out.first_queueing_ns = Some(t);
        }
        assert!(
            t >= PLATEAU_S * S || waiting_published == 0,
            "the plateau queued at {t} ns"
        );
        let step_end = t + dur;
        // Arrivals during the step wait for the next one.
        arrivals_before!(step_end);
        engine.finish_step(step_end, 0);
        let seen = step_end + 100_000;
        seconds_until(seen, &mut meter, waiting_published, &mut out);
        let mut ids: Vec<u64> = open.keys().copied().collect();
        ids.sort_unstable();
        for rid in ids {
            let o = open.get_mut(&rid).unwrap();
            let evs: Vec<Ev> = o.rec.0.borrow_mut().drain(..).collect();
            let n = evs.iter().filter(|e| matches!(e, Ev::Token { .. })).count() as u64;
            if n > 0 {
                let gaps = Gaps::of(o.last.map(|l| Gap::of(seen - l)));
                meter.tokens_with_gaps(T0 + seen, rid, n, gaps);
                o.tokens += n;
                o.first.get_or_insert(seen);
                o.last = Some(seen);
            }
            if evs.iter().any(|e| matches!(e, Ev::Done(_))) {
                let o = open.remove(&rid).unwrap();
                let ms = |ns: u64| ns as f64 / 1e6;
                let r = record(
                    T0 + o.arrival,
                    ms(seen - o.arrival),
                    o.first.map(|f| ms(f - o.arrival)),
                    Some(o.tokens),
                    Some(o.prompt),
                    true,
                );
                meter.request_finished_id(T0 + seen, Some(rid), &r);
                next[o.agent] = Some(seen + rng.gen_range(0..1000) * MS);
                if o.long {
                    out.long_ttft_ns = o.first.map(|f| f - o.arrival);
                }
            }
        }
        t = step_end;
    }
    out.meter = meter;
    out
}

fn check(scrape: bool) {
    let mut r = run(scrape);
    let source = if scrape { "scrape" } else { "first_token" };
    // The long prompt took seconds to prefill: the others waited behind it.
    let long = r.long_ttft_ns.expect("the long prompt finished");
    assert!(long > 4 * S, "long prompt's TTFT {long} ns");
    for (s, state) in r.states.iter().enumerate().take(PLATEAU_S as usize + 1) {
        if s >= 20 {
            assert_eq!(
                *state,
                Some(SaturationState::Ok),
                "{source}: second {s} of the plateau"
            );
        }
    }
    let q = r.first_queueing_ns.expect("the engine never queued");
    let on = (PLATEAU_S as usize..r.states.len())
        .find(|&s| r.states[s] == Some(SaturationState::Queueing))
        .unwrap_or_else(|| panic!("{source}: never queueing"));
    let after = on as f64 - q as f64 / 1e9;
    eprintln!(
        "{source}: engine's first queueing at {:.3} s, state queueing at {on} s ({after:.1} s after); long prompt TTFT {:.2} s",
        q as f64 / 1e9,
        long as f64 / 1e9
    );
    assert!(
        after <= 20.0,
        "{source}: on {after} s after the first queueing"
    );
    let snap = r
        .meter
        .snapshot(T0 + (PLATEAU_S + 61) * S, &SnapshotQuery::default())
        .unwrap();
    let w = snap.windows.get("10s").unwrap().saturation.clone().unwrap();
    assert_eq!(w.source, Some(source), "{w:?}");
    assert_eq!(w.state, Some(SaturationState::Queueing), "{w:?}");
    let ft = w.first_token.unwrap();
    assert!(ft.judged >= 3 && ft.queued_share >= Some(0.5), "{ft:?}");
}

#[test]
fn without_a_scrape_first_tokens_name_queueing_within_two_windows_and_not_the_plateau() {
    check(false);
}

#[test]
fn with_a_scrape_the_waiting_gauge_names_queueing_within_two_windows_and_not_the_plateau() {
    check(true);
}
