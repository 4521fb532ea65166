//! The engine's KV cache against hand-computed truths: admission waits for blocks, a sequence
//! that needs a block when none is free preempts the most recently admitted request, the block
//! truth follows vLLM V1's allocation (ceil((prompt + generated) / block_size) per sequence while
//! a step runs, the sampled token without a slot at its end), and the prefix cache finds
//! the previous call of a conversation (prompt + answer, in whole blocks, never the last token),
//! which shortens the prefill.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokenmeter::sim::engine::{Engine, Ev, Job, Sink, Timings};
use tokenmeter::sim::metrics::Stats;
use tokenmeter::sim::prompt::{chat_prompt_ids, token_text};
use tokenmeter::sim::SimConfig;

#[derive(Debug, Clone, Default)]
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

impl Rec {
    fn tokens(&self) -> usize {
        self.0
            .borrow()
            .iter()
            .filter(|e| matches!(e, Ev::Token { .. }))
            .count()
    }
    fn done(&self) -> Option<Timings> {
        self.0
            .borrow()
            .iter()
            .find_map(|e| if let Ev::Done(t) = e { Some(*t) } else { None })
    }
}

/// Blocks of 4 tokens, 8 usable blocks (one more is vLLM's null block), no stops.
fn small(caching: bool) -> SimConfig {
    SimConfig {
        num_gpu_blocks: 9,
        block_size: 4,
        max_model_len: 32,
        enable_prefix_caching: caching,
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    }
}

fn job(prompt: u64, max: u64, ids: Vec<u64>) -> (Job<Rec>, Rec) {
    let r = Rec::default();
    let j = Job {
        n: 1,
        prompt_tokens: prompt,
        max_tokens: max,
        stop_after: vec![None],
        arrival_ns: 0,
        prompt_ids: ids,
        sink: r.clone(),
    };
    (j, r)
}

fn engine(c: SimConfig) -> (Engine<Rec>, Arc<Stats>) {
    let stats = Arc::new(Stats::new(60));
    (Engine::new(c, Arc::clone(&stats)), stats)
}

/// One whole step from `t`; returns its end (panics when idle).
fn step(e: &mut Engine<Rec>, t: u64) -> u64 {
    let d = e.begin_step(t).expect("something to run");
    e.finish_step(t + d, 0);
    t + d
}

fn run_until_idle(e: &mut Engine<Rec>, mut t: u64) -> u64 {
    for _ in 0..10_000 {
        let Some(d) = e.begin_step(t) else { return t };
        t += d;
        e.finish_step(t, 0);
    }
    panic!("never idle");
}

#[test]
fn admission_waits_until_the_prompt_blocks_fit() {
    let (mut e, stats) = engine(small(false));
    // 20 prompt tokens: 5 blocks of 4 (the prefill computes 20 tokens; the token it samples
    // gets its slot when the next step is scheduled). Two such requests need 10 of 8.
    let (a, ra) = job(20, 3, Vec::new());
    let (b, rb) = job(20, 3, Vec::new());
    e.submit(a);
    e.submit(b);
    let t = step(&mut e, 0);
    assert_eq!(e.waiting_len(), 1, "the second waits for blocks, not slots");
    assert_eq!(stats.waiting.load(Relaxed), 1);
    assert_eq!(stats.kv_blocks_held.load(Relaxed), 5, "ceil(20 / 4)");
    assert_eq!(stats.kv_blocks_used.load(Relaxed), 5);
    assert_eq!(stats.kv_blocks_usable.load(Relaxed), 8);
    run_until_idle(&mut e, t);
    assert_eq!((ra.tokens(), rb.tokens()), (3, 3));
    let (qa, qb) = (ra.done().unwrap().queue_ns, rb.done().unwrap().queue_ns);
    assert_eq!(qa, 0);
    assert!(qb > 0, "b was admitted only after a finished");
    assert_eq!(stats.preemptions.load(Relaxed), 0);
    assert_eq!(stats.kv_blocks_used.load(Relaxed), 0, "all given back");
}

#[test]
fn growth_without_a_free_block_preempts_the_latest_admitted() {
    let (mut e, stats) = engine(small(false));
    // 14 prompt tokens: 4 blocks each, all 8 taken by the two prefills.
    let (a, ra) = job(14, 6, Vec::new());
    let (b, rb) = job(14, 6, Vec::new());
    e.submit(a);
    e.submit(b);
    let mut t = step(&mut e, 0);
    assert_eq!(e.running_seqs(), 2);
    assert_eq!(stats.kv_blocks_held.load(Relaxed), 8);
    // The steps computing tokens 15 and 16 still fit 4 blocks.
    t = step(&mut e, t);
    t = step(&mut e, t);
    assert_eq!(stats.preemptions.load(Relaxed), 0);
    assert_eq!((ra.tokens(), rb.tokens()), (3, 3));
    // The step computing token 17 needs a fifth block each: b (admitted last) is preempted for a.
    t = step(&mut e, t);
    assert_eq!(stats.preemptions.load(Relaxed), 1);
    assert_eq!(e.running_seqs(), 1);
    assert_eq!(e.waiting_len(), 1);
    assert_eq!((ra.tokens(), rb.tokens()), (4, 3), "b keeps what it sent");
    assert_eq!(
        stats.kv_blocks_held.load(Relaxed),
        5,
        "only a: ceil(17 / 4); b's blocks are free"
    );
    assert_eq!(stats.waiting.load(Relaxed), 1);
    run_until_idle(&mut e, t);
    assert_eq!(
        (ra.tokens(), rb.tokens()),
        (6, 6),
        "b recomputed and finished"
    );
    assert_eq!(stats.generation_tokens_total.load(Relaxed), 12);
    assert_eq!(stats.finished.load(Relaxed), 2);
}

#[test]
fn truth_blocks_are_prompt_plus_generated_rounded_up_per_sequence() {
    let (mut e, stats) = engine(SimConfig {
        stop_probability_per_token: 0.0,
        enable_prefix_caching: false,
        ..SimConfig::default()
    });
    let (a, _) = job(30, 40, Vec::new());
    let (b, _) = job(17, 40, Vec::new());
    e.submit(a);
    e.submit(b);
    let mut t = step(&mut e, 0);
    let held = |s: &Stats| {
        let per: Vec<u64> = s.lock().kv_requests.iter().map(|r| r.blocks).collect();
        (
            s.kv_blocks_held.load(Relaxed),
            s.kv_blocks_used.load(Relaxed),
            per,
        )
    };
    for g in 1..=20u64 {
        // At the step's end the sampled token g has no slot yet: prompt + g − 1 tokens.
        let per = [(30 + g - 1).div_ceil(16), (17 + g - 1).div_ceil(16)];
        let want = per[0] + per[1];
        assert_eq!(held(&stats), (want, want, per.to_vec()), "after {g} tokens");
        // The next step scheduled (what a client reads while it runs): prompt + g tokens.
        let d = e.begin_step(t).expect("running");
        let per = [(30 + g).div_ceil(16), (17 + g).div_ceil(16)];
        let want = per[0] + per[1];
        assert_eq!(
            held(&stats),
            (want, want, per.to_vec()),
            "while the step after {g} tokens runs; without prefix caching, in use = held"
        );
        t += d;
        e.finish_step(t, 0);
    }
}

/// The texts of a conversation: a system prompt and a user message.
fn conversation() -> Vec<String> {
    vec![
        "You are a careful coding agent. Read the repository before you change it.".into(),
        "List the files in this repository, then say done.".into(),
    ]
}

#[test]
fn an_extended_conversation_finds_its_previous_call_in_whole_blocks() {
    let cfg = SimConfig {
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    };
    let bs = u64::from(cfg.block_size);
    let (mut e, stats) = engine(cfg.clone());
    let first = conversation();
    let ids1 = chat_prompt_ids(&first);
    let p1 = ids1.len() as u64;
    let (j, r1) = job(p1, 7, ids1);
    e.submit(j);
    let t = run_until_idle(&mut e, 0);
    assert_eq!(r1.done().unwrap().cached_tokens, 0, "nothing cached yet");

    // The next call: the conversation, the answer as an assistant message, a tool result.
    let mut second = first.clone();
    second.push((0..7).map(token_text).collect());
    second.push("README.md hello.py".into());
    let ids2 = chat_prompt_ids(&second);
    let p2 = ids2.len() as u64;
    let (j, r2) = job(p2, 5, ids2.clone());
    e.submit(j);
    let d = e.begin_step(t).unwrap();
    let cached = (p1 + 7) / bs * bs;
    assert!(cached > 0 && cached < p2);
    assert_eq!(
        d,
        cfg.decode_step_ns(1) + cfg.prefill_ns(p2 - cached),
        "prefill computes only the uncached tokens"
    );
    e.finish_step(t + d, 0);
    let t = run_until_idle(&mut e, t + d);
    assert_eq!(r2.done().unwrap().cached_tokens, cached);

    // The same prompt again: everything but the block holding the last prompt token.
    let (j, r3) = job(p2, 1, ids2);
    e.submit(j);
    run_until_idle(&mut e, t);
    let c3 = r3.done().unwrap().cached_tokens;
    assert_eq!(c3, (p2 - 1) / bs * bs);
    assert!(c3 < p2, "never the whole prompt");

    assert_eq!(stats.prefix_cache_queries.load(Relaxed), p1 + 2 * p2);
    assert_eq!(stats.prefix_cache_hits.load(Relaxed), cached + c3);
    assert_eq!(stats.prompt_tokens_cached.load(Relaxed), cached + c3);
    assert_eq!(
        stats.prompt_tokens_total.load(Relaxed),
        p1 + 2 * p2,
        "prompt tokens count cached ones too"
    );
}

#[test]
fn without_prefix_caching_nothing_is_found() {
    let (mut e, stats) = engine(SimConfig {
        enable_prefix_caching: false,
        stop_probability_per_token: 0.0,
        ..SimConfig::default()
    });
    let ids = chat_prompt_ids(&conversation());
    let p = ids.len() as u64;
    for _ in 0..2 {
        let (j, r) = job(p, 3, ids.clone());
        e.submit(j);
        run_until_idle(&mut e, 0);
        assert_eq!(r.done().unwrap().cached_tokens, 0);
    }
    assert_eq!(stats.prefix_cache_queries.load(Relaxed), 0);
    assert_eq!(stats.prefix_cache_hits.load(Relaxed), 0);
}
