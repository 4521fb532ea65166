//! The engine core as a pure state machine with injected times: step durations, prefill, cold
//! start, FIFO admission, aborts, the stop rule and n > 1, all against hand-computed truths.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokenmeter::sim::engine::{Engine, Ev, Finish, Job, Sink};
use tokenmeter::sim::metrics::Stats;
use tokenmeter::sim::SimConfig;

#[derive(Debug, Clone, Default)]
struct Rec {
    evs: Rc<RefCell<Vec<Ev>>>,
    closed: Rc<Cell<bool>>,
}

impl Sink for Rec {
    fn is_closed(&self) -> bool {
        self.closed.get()
    }
    fn deliver(&mut self, ev: Ev) -> bool {
        self.evs.borrow_mut().push(ev);
        true
    }
}

impl Rec {
    fn tokens(&self) -> usize {
        self.evs
            .borrow()
            .iter()
            .filter(|e| matches!(e, Ev::Token { .. }))
            .count()
    }
    fn done(&self) -> Option<tokenmeter::sim::engine::Timings> {
        self.evs
            .borrow()
            .iter()
            .find_map(|e| if let Ev::Done(t) = e { Some(*t) } else { None })
    }
}

const MS: u64 = 1_000_000;

fn cfg() -> SimConfig {
    SimConfig {
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    }
}

fn job(prompt: u64, max: u64, n: u32, arrival_ns: u64) -> (Job<Rec>, Rec) {
    let r = Rec::default();
    let j = Job {
        n,
        prompt_tokens: prompt,
        max_tokens: max,
        stop_after: vec![None; n as usize],
        arrival_ns,
        prompt_ids: Vec::new(),
        sink: r.clone(),
    };
    (j, r)
}

fn new_engine(c: SimConfig) -> (Engine<Rec>, Arc<Stats>) {
    let stats = Arc::new(Stats::new(60));
    (Engine::new(c, Arc::clone(&stats)), stats)
}

/// Runs steps back to back from `t`, returning the end time when idle (bounded).
fn run_until_idle(e: &mut Engine<Rec>, mut t: u64) -> u64 {
    for _ in 0..100_000 {
        let Some(d) = e.begin_step(t) else { return t };
        t += d;
        e.finish_step(t, t / 1_000_000_000);
    }
    panic!("engine never went idle");
}

#[test]
fn step_durations_follow_the_formula() {
    let (mut e, stats) = new_engine(cfg());
    let (j, r) = job(80, 3, 1, 0);
    e.submit(j);
    // Prefill step: 12.2 + 2.1×1 ms + 80 tokens / 8000 tok/s = 24.3 ms.
    assert_eq!(e.begin_step(0), Some(24_300_000));
    e.finish_step(24_300_000, 0);
    assert_eq!(r.tokens(), 1, "first token at the end of the prefill step");
    assert_eq!(
        stats.kv_tokens.load(Relaxed),
        80 + 1,
        "KV holds prompt + generated tokens"
    );
    assert_eq!(e.begin_step(24_300_000), Some(14_300_000));
    // Four more requests join: the step costs 5 running + their prefill (4 × 80 tokens = 40 ms).
    let rs: Vec<Rec> = (0..4)
        .map(|_| {
            let (j, r) = job(80, 3, 1, 24_300_000);
            e.submit(j);
            r
        })
        .collect();
    e.finish_step(38_600_000, 0);
    assert_eq!(
        e.begin_step(38_600_000),
        Some(12_200_000 + 5 * 2_100_000 + 40 * MS)
    );
    e.finish_step(38_600_000 + 62_700_000, 0);
    assert_eq!(r.tokens(), 3);
    assert!(r.done().is_some());
    assert!(rs.iter().all(|r| r.tokens() == 1));
    assert_eq!(stats.generation_tokens_total.load(Relaxed), 7);
    assert_eq!(stats.prompt_tokens_total.load(Relaxed), 5 * 80);
    let end = run_until_idle(&mut e, 101_300_000);
    assert_eq!(
        end,
        101_300_000 + 2 * 20_600_000,
        "two more steps of 4 running sequences"
    );
    assert_eq!(stats.generation_tokens_total.load(Relaxed), 15);
    assert_eq!(stats.finished.load(Relaxed), 5);
}

#[test]
fn cold_start_applies_after_start_and_after_long_idle() {
    let (mut e, _) = new_engine(SimConfig {
        cold_start_ms: 1000.0,
        idle_reset_s: 60.0,
        prefill_tok_s: 1e12,
        ..cfg()
    });
    let (j, _) = job(1, 1, 1, 0);
    e.submit(j);
    assert_eq!(e.begin_step(0), Some(1000 * MS + 14_300_000));
    let t = 1000 * MS + 14_300_000;
    e.finish_step(t, 0);
    assert_eq!(e.begin_step(t), None, "idle from here");
    let (j, _) = job(1, 1, 1, t + 10_000 * MS);
    e.submit(j);
    assert_eq!(
        e.begin_step(t + 10_000 * MS),
        Some(14_300_000),
        "10 s idle: warm"
    );
    e.finish_step(t + 10_000 * MS + 14_300_000, 0);
    let t2 = t + 10_000 * MS + 14_300_000;
    assert_eq!(e.begin_step(t2), None);
    let (j, _) = job(1, 1, 1, t2 + 61_000 * MS);
    e.submit(j);
    assert_eq!(
        e.begin_step(t2 + 61_000 * MS),
        Some(1000 * MS + 14_300_000),
        "61 s idle: cold again"
    );
}

#[test]
fn fifo_queueing_waits_for_free_slots() {
    let (mut e, stats) = new_engine(SimConfig {
        max_num_seqs: 2,
        prefill_tok_s: 1e12,
        ..cfg()
    });
    let rs: Vec<Rec> = (0..3)
        .map(|_| {
            let (j, r) = job(4, 2, 1, 0);
            e.submit(j);
            r
        })
        .collect();
    let d = e.begin_step(0).unwrap();
    assert_eq!(d, 12_200_000 + 2 * 2_100_000);
    assert_eq!(
        (stats.running.load(Relaxed), stats.waiting.load(Relaxed)),
        (2, 1)
    );
    e.finish_step(d, 0);
    let d2 = e.begin_step(d).unwrap();
    e.finish_step(d + d2, 0);
    assert!(rs[0].done().is_some() && rs[1].done().is_some() && rs[2].tokens() == 0);
    let t = run_until_idle(&mut e, d + d2);
    let third = rs[2].done().unwrap();
    assert_eq!(
        third.queue_ns,
        d + d2,
        "admitted at the step boundary after both finished"
    );
    assert_eq!(third.ttft_ns, d + d2 + 14_300_000);
    assert_eq!(third.e2e_ns, t);
    assert_eq!(rs[0].done().unwrap().ttft_ns, d);
    assert_eq!(rs[0].done().unwrap().mean_itl_ns, d2);
}

#[test]
fn abort_frees_the_slot_at_the_next_step_and_keeps_its_tokens() {
    let (mut e, stats) = new_engine(SimConfig {
        prefill_tok_s: 1e12,
        ..cfg()
    });
    let (j, r) = job(4, 100, 1, 0);
    e.submit(j);
    let (j2, r2) = job(4, 3, 1, 0);
    e.submit(j2);
    let mut t = 0;
    for _ in 0..2 {
        t += e.begin_step(t).unwrap();
        e.finish_step(t, 0);
    }
    r.closed.set(true);
    assert_eq!(stats.running.load(Relaxed), 2);
    let d = e.begin_step(t).unwrap();
    assert_eq!(
        d, 14_300_000,
        "the aborted sequence no longer costs step time"
    );
    assert_eq!(
        (stats.running.load(Relaxed), stats.aborted.load(Relaxed)),
        (1, 1)
    );
    e.finish_step(t + d, 0);
    run_until_idle(&mut e, t + d);
    assert_eq!(r.tokens(), 2);
    assert_eq!(r2.tokens(), 3);
    assert_eq!(
        stats.generation_tokens_total.load(Relaxed),
        5,
        "aborted tokens still count"
    );
    assert_eq!(stats.finished.load(Relaxed), 1);
    assert_eq!(stats.lock().finished_by_reason, [0, 1, 1, 0, 0]);
}

#[test]
fn stop_rule_and_n_choices() {
    let (mut e, stats) = new_engine(SimConfig {
        prefill_tok_s: 1e12,
        ..cfg()
    });
    let r = Rec::default();
    e.submit(Job {
        n: 2,
        prompt_tokens: 10,
        max_tokens: 6,
        stop_after: vec![Some(3), None],
        arrival_ns: 0,
        prompt_ids: Vec::new(),
        sink: r.clone(),
    });
    assert_eq!(
        e.begin_step(0),
        Some(12_200_000 + 2 * 2_100_000),
        "n = 2 takes two slots"
    );
    let end = {
        e.finish_step(16_400_000, 0);
        run_until_idle(&mut e, 16_400_000)
    };
    let evs = r.evs.borrow().clone();
    let per = |c: u32| {
        evs.iter()
            .filter(|e| matches!(e, Ev::Token { choice, .. } if *choice == c))
            .count()
    };
    assert_eq!((per(0), per(1)), (3, 6));
    assert!(evs.contains(&Ev::Token {
        choice: 0,
        finish: Some(Finish::Stop)
    }));
    assert!(evs.contains(&Ev::Token {
        choice: 1,
        finish: Some(Finish::Length)
    }));
    assert_eq!(stats.generation_tokens_total.load(Relaxed), 9);
    assert_eq!(
        stats.prompt_tokens_total.load(Relaxed),
        10,
        "prompt prefilled once for both choices"
    );
    // 3 steps with 2 sequences, then 3 with one.
    assert_eq!(end, 3 * 16_400_000 + 3 * 14_300_000);
}

#[test]
fn a_request_abandoned_while_queued_is_aborted_without_tokens() {
    let (mut e, stats) = new_engine(SimConfig {
        max_num_seqs: 1,
        prefill_tok_s: 1e12,
        ..cfg()
    });
    let (j1, r1) = job(4, 3, 1, 0);
    let (j2, r2) = job(4, 3, 1, 0);
    e.submit(j1);
    e.submit(j2);
    let mut t = e.begin_step(0).unwrap();
    assert_eq!(stats.waiting.load(Relaxed), 1);
    r2.closed.set(true);
    e.finish_step(t, 0);
    t += e.begin_step(t).unwrap();
    assert_eq!(
        (stats.waiting.load(Relaxed), stats.aborted.load(Relaxed)),
        (0, 1)
    );
    e.finish_step(t, 0);
    run_until_idle(&mut e, t);
    assert_eq!((r1.tokens(), r2.tokens()), (3, 0));
    assert_eq!(stats.generation_tokens_total.load(Relaxed), 3);
    assert_eq!(
        stats.prompt_tokens_total.load(Relaxed),
        4,
        "never prefilled"
    );
}
