//! Agent-like traffic through the simulator's engine core on a controlled clock, reported to the
//! meter as the proxy would report it: the engine (a pure state machine) runs closed-loop agents
//! with think time, varied prompts and lengths, a share of them non-streamed; its events reach
//! the meter with a little delivery jitter. Each finished request's record is judged against
//! `[slo]` as the tracker judges it, and carries the token curve the tracker would log. Beside
//! them, the engine's own per-request timings (its ground truth).

use std::collections::HashMap;
use std::sync::Arc;

use rand::{rngs::SmallRng, Rng, SeedableRng};
use tokenmeter::clock::UnixNanos;
use tokenmeter::meter::{Meter, MeterConfig};
use tokenmeter::record::RequestRecord;
use tokenmeter::sim::engine::{Engine, Ev, Job, Timings};
use tokenmeter::sim::metrics::Stats;
use tokenmeter::sim::SimConfig;
use tokenmeter::slo::SloConfig;
use tokenmeter::token_curve::TokenCurveBuilder;

use crate::meter_support::{record, Rec, T0};

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
    timings: Option<Timings>,
}

/// The traffic of one run.
pub struct Traffic {
    pub agents: usize,
    pub duration_s: u64,
    pub think_ms: (u64, u64),
    /// Prompt tokens, uniform in `[lo, hi)`.
    pub prompt: (u64, u64),
    /// Output tokens, uniform in `[lo, hi)`.
    pub out: (u64, u64),
    /// Share of the requests streamed (1: every one).
    pub stream_share: f64,
    /// The meter hears of events in time order; else as the harness makes them (an arrival
    /// after the previous step's tokens, a finish after its step's tokens: up to 0.7 ms late,
    /// which the meter applies at the later time).
    pub ordered: bool,
    pub seed: u64,
    /// The engine (its `stop_probability_per_token` is not used: outputs run to their length).
    pub sim: SimConfig,
    /// The service level the records are judged against and the meter reads.
    pub slo: SloConfig,
}

impl Traffic {
    /// `agents` agents for `duration_s`, prompts of 20..3000 tokens, all streamed, delivered as
    /// made, the default engine and service level.
    pub fn new(
        agents: usize,
        duration_s: u64,
        think_ms: (u64, u64),
        out: (u64, u64),
        seed: u64,
    ) -> Traffic {
        Traffic {
            agents,
            duration_s,
            think_ms,
            prompt: (20, 3000),
            out,
            stream_share: 1.0,
            ordered: false,
            seed,
            sim: SimConfig::default(),
            slo: SloConfig::default(),
        }
    }
}

/// One request as the engine saw it: its own timings (arrival on the meter's timeline).
#[derive(Debug, Clone, Copy)]
pub struct SimRequest {
    /// Arrival, Unix ns on the meter's timeline (the engine's time + `T0`).
    pub arrival: UnixNanos,
    pub timings: Timings,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub stream: bool,
}

/// What one run gives: the meter, every record as the proxy would log it, and the engine's own
/// account of every request.
pub struct RunOut {
    pub meter: Meter,
    pub records: Vec<RequestRecord>,
    pub truth: Vec<SimRequest>,
}

/// One call to the meter.
enum Call {
    Start(String),
    Tokens(u64),
    Finish(Box<RequestRecord>),
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

/// Runs `t`: its agents for `duration_s` simulated seconds, then until every request ended.
pub fn run_traffic(t: &Traffic) -> RunOut {
    let &Traffic {
        agents,
        duration_s,
        think_ms,
        prompt: prompt_range,
        out,
        stream_share,
        ordered,
        seed,
        ref sim,
        slo,
    } = t;
    const MS: u64 = 1_000_000;
    let mut records = Vec::new();
    let mut truth = Vec::new();
    let cfg = SimConfig {
        stop_probability_per_token: 0.0,
        ..sim.clone()
    };
    let mut engine: Engine<Rec> = Engine::new(cfg, Arc::new(Stats::new(3600)));
    let mut meter = Delivery {
        meter: Meter::new(
            MeterConfig {
                slo,
                ..MeterConfig::default()
            },
            T0,
        ),
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
            let prompt = rng.gen_range(prompt_range.0..prompt_range.1);
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
                    timings: None,
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
        // In request order, so the jitter each one draws (and the run) is the same every time.
        let mut ids: Vec<u64> = open.keys().copied().collect();
        ids.sort_unstable();
        for rid in ids {
            let o = open.get_mut(&rid).unwrap();
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
            for e in &evs {
                if let Ev::Done(timings) = e {
                    o.timings = Some(*timings);
                    done.push((rid, seen + 100_000));
                }
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
            let timings = o.timings.unwrap();
            r.cached_prompt_tokens = Some(timings.cached_tokens);
            r.token_curve = o.curve.finish();
            // As the tracker does when the request finishes.
            r.judge(&slo);
            meter.send(T0 + fin, rid, Call::Finish(Box::new(r.clone())));
            records.push(r);
            truth.push(SimRequest {
                arrival: T0 + o.arrival,
                timings,
                prompt_tokens: o.prompt,
                completion_tokens: o.tokens,
                stream: o.stream,
            });
            let think = rng.gen_range(think_ms.0..=think_ms.1) * MS;
            next[o.agent] = Some(fin + think);
        }
        t = step_end;
        // Nothing made from here on is earlier than the step's end.
        meter.flush_before(T0 + t);
    }
    meter.flush_before(u64::MAX);
    RunOut {
        meter: meter.meter,
        records,
        truth,
    }
}

/// `analyze` on `records` written as a log, against `slo`.
pub fn analyze(records: &[RequestRecord], slo: SloConfig) -> tokenmeter::analyze::Report {
    let dir = crate::common::TempDir::new("levels-log");
    let log = dir.0.join("access.jsonl");
    let text: Vec<u8> = records
        .iter()
        .flat_map(RequestRecord::to_json_line)
        .collect();
    std::fs::write(&log, text).unwrap();
    let opts = tokenmeter::analyze::AnalyzeOptions {
        slo,
        ..Default::default()
    };
    tokenmeter::analyze::analyze(&[log], &opts).unwrap()
}
