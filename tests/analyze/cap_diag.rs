//! Diagnostic for the production-traffic curve (issue 14), not an acceptance: 16 busy agents
//! through the proxy to the simulator, every event the proxy measures recorded by an observer,
//! then replayed offline. The engine's steps are recovered from the proxy's own token events
//! (one event per running sequence per step, delivered together), so for each level the table
//! shows what the engine did in the time the attribution calls clean (tokens per step, step
//! length) beside what the attribution credited. It fails only if the offline replay departs from
//! the live meter's figures (0.5 %).
//!
//! `cargo test --release --test analyze -- --ignored --nocapture cap_diag::` (DIAG_S sets the
//! length).

use std::collections::{BTreeMap, HashMap};

use crate::common::{busy_agents, env_u64, stats_now};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokenmeter::clock::UnixNanos;
use tokenmeter::load::{Arrivals, LoadOptions, NoProgress};
use tokenmeter::meter::levels::{GuardConfig, LevelAttribution};
use tokenmeter::observe::Observer;
use tokenmeter::record::RequestRecord;
use tokenmeter::sim::SimConfig;

#[derive(Debug, Clone, Copy)]
enum Ev {
    Start(u64, UnixNanos),
    Tok(u64, UnixNanos, u64),
    Fin(u64, UnixNanos, Option<u64>),
}

#[derive(Default)]
struct Rec(Mutex<Vec<Ev>>);

impl Observer for Rec {
    fn started(&self, id: u64, now: UnixNanos, _: &Arc<str>, _: Option<&Arc<str>>) {
        self.0.lock().unwrap().push(Ev::Start(id, now));
    }
    fn tokens(&self, id: u64, now: UnixNanos, n: u64, _: tokenmeter::itl::Gaps) {
        self.0.lock().unwrap().push(Ev::Tok(id, now, n));
    }
    fn finished(&self, id: u64, now: UnixNanos, r: &Arc<RequestRecord>, metered: bool) {
        if metered {
            self.0
                .lock()
                .unwrap()
                .push(Ev::Fin(id, now, r.completion_tokens));
        }
    }
}

fn truth(n: u32) -> f64 {
    n as f64 * 1000.0 / (12.2 + 2.1 * n as f64)
}

fn t_of(e: &Ev) -> UnixNanos {
    match *e {
        Ev::Start(_, t) | Ev::Tok(_, t, _) | Ev::Fin(_, t, _) => t,
    }
}

/// The live meter's calls, replayed.
fn replay(evs: &[Ev]) -> BTreeMap<u32, tokenmeter::meter::levels::LevelSums> {
    let mut a = LevelAttribution::new(GuardConfig::default(), t_of(&evs[0]));
    struct Open {
        key: tokenmeter::meter::levels::GuardKey,
        start: UnixNanos,
        last: Option<UnixNanos>,
        first: Option<UnixNanos>,
        seen: u64,
    }
    let mut open: HashMap<u64, Open> = HashMap::new();
    for e in evs {
        match *e {
            Ev::Start(id, t) => {
                let key = a.arrive(t);
                open.insert(
                    id,
                    Open {
                        key,
                        start: t,
                        last: None,
                        first: None,
                        seen: 0,
                    },
                );
            }
            Ev::Tok(id, t, n) => {
                let Some(o) = open.get_mut(&id) else { continue };
                let from = o.last.unwrap_or(o.start);
                if o.first.is_none() {
                    o.first = Some(t);
                    a.first_token(t, o.key);
                } else {
                    a.advance(t);
                }
                a.tokens(o.key, from, t, n as f64);
                o.seen += n;
                o.last = Some(o.last.map_or(t, |l| l.max(t)));
            }
            Ev::Fin(id, t, total) => {
                let Some(o) = open.remove(&id) else { continue };
                // As the meter: the remainder before the departure.
                a.advance(t);
                if let (Some(total), Some(f)) = (total, o.first) {
                    let rest = total as f64 - o.seen as f64;
                    if rest != 0.0 {
                        a.tokens(o.key, f.min(t), t, rest);
                    }
                }
                a.depart(t, o.key);
            }
        }
        let floor = open
            .values()
            .map(|o| o.first.unwrap_or(o.start))
            .min()
            .unwrap_or(t_of(e));
        a.finalize_before(floor);
    }
    a.advance(UnixNanos::MAX / 2);
    a.finalize_before(UnixNanos::MAX);
    a.sums().clone()
}

/// The proxy's view per instant: in-flight level and open guards (arrival to first token).
struct StateLine {
    changes: Vec<(UnixNanos, u32, u32)>,
}

impl StateLine {
    fn of(evs: &[Ev]) -> Self {
        let mut level = 0u32;
        let mut guards = 0u32;
        let mut guarded: HashMap<u64, bool> = HashMap::new();
        let mut changes = Vec::new();
        for e in evs {
            match *e {
                Ev::Start(id, t) => {
                    level += 1;
                    guards += 1;
                    guarded.insert(id, true);
                    changes.push((t, level, guards));
                }
                Ev::Tok(id, t, _) => {
                    if guarded.get(&id) == Some(&true) {
                        guarded.insert(id, false);
                        guards -= 1;
                        changes.push((t, level, guards));
                    }
                }
                Ev::Fin(id, t, _) => {
                    if let Some(g) = guarded.remove(&id) {
                        level -= 1;
                        if g {
                            guards -= 1;
                        }
                        changes.push((t, level, guards));
                    }
                }
            }
        }
        StateLine { changes }
    }

    /// (level, guards) just after `t`'s changes (changes at exactly t included).
    fn at(&self, t: UnixNanos) -> (u32, u32) {
        let i = self.changes.partition_point(|c| c.0 <= t);
        if i == 0 {
            (0, 0)
        } else {
            (self.changes[i - 1].1, self.changes[i - 1].2)
        }
    }

    /// True when no change lies in (a, b).
    fn constant(&self, a: UnixNanos, b: UnixNanos) -> bool {
        let i = self.changes.partition_point(|c| c.0 <= a);
        self.changes.get(i).is_none_or(|c| c.0 >= b)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "diagnostic, a minute of simulated traffic"]
async fn sixteen_agents_steps_in_clean_time() {
    let secs = env_u64("DIAG_S", 60);
    let sim = crate::common::start_sim(SimConfig {
        resync_lag_ms: 100.0,
        ..SimConfig::default()
    })
    .await;
    let rec = Arc::new(Rec::default());
    let config = tokenmeter::config::ServeConfig {
        listen: "127.0.0.1:0".into(),
        upstream: format!("http://{}", sim.addr()),
        ..Default::default()
    };
    let proxy = tokenmeter::app::spawn(config, vec![rec.clone() as Arc<dyn Observer>])
        .await
        .unwrap();
    // The acceptance test's agents, so this replays what it measures.
    let spec = busy_agents();
    let opts = LoadOptions::agents(
        format!("http://{}", proxy.addr()),
        Arrivals::Agents { agents: 16 },
        spec,
        Duration::from_secs(secs),
    );
    tokenmeter::load::run(opts, NoProgress).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let live = stats_now(proxy.meter()).await.capacity_production;
    let lag = sim.step_lag();
    println!(
        "simulator: {} steps, lag mean {:.3} ms, max {:.1} ms, {} resyncs, slip {:.1} ms",
        lag.steps,
        lag.mean_ns as f64 / 1e6,
        lag.max_ns as f64 / 1e6,
        lag.resyncs,
        lag.slip_ns as f64 / 1e6
    );
    proxy.shutdown().await;
    sim.shutdown().await;
    let mut evs = rec.0.lock().unwrap().clone();
    // The observer's order is the serving threads' order; the replay wants time order.
    evs.sort_by_key(t_of);
    let sums = replay(&evs);
    let line = StateLine::of(&evs);
    // Steps: token events within 3 ms of the previous one belong to one step.
    let mut toks: Vec<(UnixNanos, u64)> = evs
        .iter()
        .filter_map(|e| match *e {
            Ev::Tok(_, t, n) => Some((t, n)),
            _ => None,
        })
        .collect();
    toks.sort();
    let mut steps: Vec<(UnixNanos, UnixNanos, u64)> = Vec::new();
    for (t, n) in toks {
        match steps.last_mut() {
            Some(s) if t.saturating_sub(s.1) < 3_000_000 => {
                s.1 = t;
                s.2 += n;
            }
            _ => steps.push((t, t, n)),
        }
    }
    // Per level: steps wholly inside clean time at N (the step's interval from the previous
    // step's first event to its own first event, no change inside, clean at its start).
    #[derive(Default)]
    struct Acc {
        steps: u64,
        ns: u64,
        tokens: u64,
        off_size: u64,
        long: u64,
        long_ns: u64,
        spread_ns: u64,
    }
    let mut acc: BTreeMap<u32, Acc> = BTreeMap::new();
    let mut sizes16: BTreeMap<u64, u64> = BTreeMap::new();
    for w in steps.windows(2) {
        let (a, b) = (w[0].0, w[1].0);
        let (level, guards) = line.at(a);
        if guards > 0 || level == 0 || !line.constant(a, b) {
            continue;
        }
        let e = acc.entry(level).or_default();
        e.steps += 1;
        e.ns += b - a;
        e.tokens += w[1].2;
        e.spread_ns += w[1].1 - w[1].0;
        if w[1].2 != level as u64 {
            e.off_size += 1;
        }
        if level == 16 {
            *sizes16.entry(w[1].2).or_default() += 1;
        }
        let formula_ns = ((12.2 + 2.1 * level as f64) * 1e6) as u64;
        if b - a > formula_ns + formula_ns / 5 {
            e.long += 1;
            e.long_ns += b - a - formula_ns;
        }
    }
    println!(
        "| N | live clean s | live tok/s | replay clean s | replay tok/s | steps inside | step-based tok/s | truth | live % | step % | steps != N tokens | long steps (excess s) | mean spread ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (&n, s) in &sums {
        let clean_s = s.clean_ns as f64 / 1e9;
        if clean_s < 5.0 {
            continue;
        }
        let rate = s.clean_tokens / clean_s;
        let lv = live.iter().find(|r| r.in_flight == n);
        // The offline replay must be the live meter's attribution, or the table explains nothing.
        if let Some(g) = lv.and_then(|r| r.gen_tok_s) {
            assert!(
                (rate / g - 1.0).abs() < 0.005,
                "level {n}: replay {rate} vs live {g}"
            );
        }
        let a = acc.get(&n);
        let step_rate = a.map_or(0.0, |a| a.tokens as f64 / (a.ns as f64 / 1e9));
        println!(
            "| {n} | {:.1} | {} | {clean_s:.1} | {rate:.1} | {} | {step_rate:.1} | {:.1} | {} | {:+.2} | {} | {} ({:.2}) | {:.2} |",
            lv.map_or(0.0, |r| r.seconds),
            lv.and_then(|r| r.gen_tok_s).map_or("—".into(), |g| format!("{g:.1}")),
            a.map_or(0, |a| a.steps),
            truth(n),
            lv.and_then(|r| r.gen_tok_s)
                .map_or("—".into(), |g| format!("{:+.2}", (g / truth(n) - 1.0) * 100.0)),
            (step_rate / truth(n) - 1.0) * 100.0,
            a.map_or(0, |a| a.off_size),
            a.map_or(0, |a| a.long),
            a.map_or(0.0, |a| a.long_ns as f64 / 1e9),
            a.map_or(0.0, |a| a.spread_ns as f64 / a.steps.max(1) as f64 / 1e6),
        );
    }
    println!("token counts of the steps inside clean time at 16: {sizes16:?}");
    // First tokens later than the guard's 1 s cap: the time from the cap to the first token is
    // what a guard closed by the cap alone would have let into clean time, by the level then.
    let mut starts: HashMap<u64, UnixNanos> = HashMap::new();
    let mut late: BTreeMap<u32, (u64, f64)> = BTreeMap::new();
    let mut spans: Vec<(UnixNanos, UnixNanos)> = Vec::new();
    for e in &evs {
        match *e {
            Ev::Start(id, t) => {
                starts.insert(id, t);
            }
            Ev::Tok(id, t, _) => {
                if let Some(s) = starts.remove(&id) {
                    if t - s > 1_000_000_000 {
                        let cap = s + 1_000_000_000;
                        let (level, _) = line.at(cap);
                        let e = late.entry(level).or_default();
                        e.0 += 1;
                        e.1 += (t - cap) as f64 / 1e9;
                        spans.push((cap, t));
                    }
                }
            }
            Ev::Fin(id, _, _) => {
                starts.remove(&id);
            }
        }
    }
    spans.sort();
    let (mut union, mut reach) = (0u64, 0u64);
    for (a, b) in spans {
        let a = a.max(reach);
        if b > a {
            union += b - a;
        }
        reach = reach.max(b);
    }
    println!(
        "first tokens after the 1 s cap, by level at the cap: (requests, seconds after the cap) {late:?}; union {:.2} s",
        union as f64 / 1e9
    );
}
