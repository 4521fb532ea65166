//! KV-cache figures against known truths: the recorded vLLM 0.32 exposition for the cache's
//! size and the table's formula, hand-built requests for contexts and the live estimate, and
//! scrape samples on the controlled clock for saturation and headroom.

use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::itl::{Gap, Gaps};
use tokenmeter::meter::kv::{binds_first, KvCache};
use tokenmeter::meter::saturation::SaturationState;
use tokenmeter::meter::{Meter, MeterConfig, SnapshotQuery};
use tokenmeter::scrape::prom_text::{extract, parse};
use tokenmeter::scrape::{KvValues, ServerSample, VllmValues};

use crate::meter_support::{at, close, record, T0};

const AFTER: &str = include_str!("../fixtures/vllm/agents/metrics_after.txt");

fn recorded() -> VllmValues {
    extract(&parse(AFTER))
}

#[test]
fn recorded_cache_config_reads_blocks_block_size_and_tokens() {
    let v = recorded();
    assert_eq!(
        v.kv,
        KvValues {
            num_gpu_blocks: Some(8192),
            block_size: Some(128),
            kv_cache_size_tokens: Some(1_048_576),
            enable_prefix_caching: Some(true),
            preemptions_total: Some(0.0),
        }
    );
    // vLLM 0.32 does not export --max-num-seqs: no series or label names it.
    assert!(!AFTER.contains("max_num_seqs"));
}

#[test]
fn sequences_fit_is_blocks_over_blocks_per_sequence_on_the_recorded_cache() {
    let cache = KvCache::of(&recorded().kv);
    assert_eq!(cache.basis, Some("blocks"));
    for context in [
        1u64, 127, 128, 129, 4096, 4097, 8192, 16_384, 100_000, 131_072,
    ] {
        let want = 8192 / context.div_ceil(128);
        assert_eq!(
            cache.sequences_fit(context),
            Some(want),
            "context {context}"
        );
    }
    // Block rounding: one token past a block boundary costs a whole block.
    assert_eq!(cache.sequences_fit(4096), Some(256));
    assert_eq!(cache.sequences_fit(4097), Some(248));
    // Without blocks, the size in tokens (no rounding), stated as such.
    let tokens_only = KvCache::of(&KvValues {
        kv_cache_size_tokens: Some(1_048_576),
        ..Default::default()
    });
    assert_eq!(tokens_only.basis, Some("tokens"));
    assert_eq!(tokens_only.sequences_fit(4097), Some(1_048_576 / 4097));
    let unknown = KvCache::of(&KvValues::default());
    assert_eq!(unknown.basis, None);
    assert_eq!(unknown.sequences_fit(4096), None);
}

#[test]
fn the_lowest_known_limit_binds_first() {
    assert_eq!(binds_first(Some(8), Some(10), None), Some("kv_cache"));
    assert_eq!(
        binds_first(Some(256), Some(10), Some(64)),
        Some("service_level")
    );
    assert_eq!(binds_first(Some(256), None, Some(64)), Some("max_num_seqs"));
    assert_eq!(binds_first(None, None, None), None);
}

fn sample(ts_ns: u64, waiting: f64, preemptions: f64, usage: f64) -> ServerSample {
    let mut values = recorded();
    values.waiting = Some(waiting);
    values.kv.preemptions_total = Some(preemptions);
    values.kv_cache_usage = Some(usage);
    ServerSample {
        ts_ns,
        values,
        proxy_in_flight: None,
        scrape_ms: 1.0,
    }
}

fn meter() -> Meter {
    let mut m = Meter::new(
        MeterConfig {
            windows_s: vec![10, 60],
            max_num_seqs: Some(64),
            ..Default::default()
        },
        T0,
    );
    m.enable_server(10.0);
    m
}

#[test]
fn contexts_table_and_estimate_from_requests_beside_the_recorded_cache() {
    let mut m = meter();
    // Ten finished requests of user alice: contexts 1000, 2000, ... 10000 tokens.
    for (i, k) in (1..=10u64).enumerate() {
        let start = at(i as f64);
        m.request_started(start, k, "alice", Some("m"));
        let r = record(
            start,
            500.0,
            Some(100.0),
            Some(k * 100),
            Some(k * 900),
            true,
        );
        m.request_finished_id(start + NANOS_PER_SEC / 2, Some(k), &r);
    }
    // Three in flight: prompts 1000, 129, unknown; generated 28, 0, 5 so far.
    for (id, prompt, gen) in [
        (100u64, Some(1000u64), 28u64),
        (101, Some(129), 0),
        (102, None, 5),
    ] {
        m.request_started(at(11.0), id, "bob", Some("m"));
        if let Some(p) = prompt {
            m.prompt_tokens(id, p);
        }
        if gen > 0 {
            m.tokens(at(11.5), id, gen);
        }
    }
    m.server_sample(sample(at(11.6), 0.0, 0.0, 0.5));
    let s = m.snapshot(at(12.0), &SnapshotQuery::default()).unwrap();
    let kv = &s.kv;
    assert_eq!(kv.contexts.requests, 10);
    assert_eq!(kv.contexts.p50, Some(5000));
    assert_eq!(kv.contexts.p90, Some(9000));
    assert_eq!(kv.contexts.p99, Some(10000));
    assert_eq!(kv.contexts.max, Some(10000));
    assert_eq!(s.users["alice"].contexts.max_since_start, Some(10000));
    assert_eq!(s.users["bob"].contexts.requests, 0);
    assert_eq!(s.models["m"].contexts.p90, Some(9000));
    // The 10 s window [2 s, 12 s) holds the eight that finished at 2.5 s .. 9.5 s.
    let w = s.windows.get("10s").unwrap().context_tokens;
    assert_eq!((w.requests, w.p50, w.max), (8, Some(6000), Some(10000)));
    let rows: Vec<(u64, u64)> = kv
        .table
        .iter()
        .map(|r| (r.context_tokens.unwrap(), r.kv_sequences.unwrap()))
        .collect();
    assert_eq!(
        rows,
        vec![
            (5000, 8192 / 5000u64.div_ceil(128)),
            (9000, 8192 / 9000u64.div_ceil(128)),
            (10000, 8192 / 10000u64.div_ceil(128)),
        ]
    );
    assert!(kv.table.iter().all(|r| r.max_num_seqs == Some(64)));
    // 8192 / 71 = 115 and 8192 / 79 = 103 sequences: --max-num-seqs (64) binds first.
    assert!(kv
        .table
        .iter()
        .all(|r| r.binds_first == Some("max_num_seqs")));
    // Estimate: ceil(1028/128) + ceil(129/128) + ceil(5/128) = 9 + 2 + 1.
    assert_eq!(kv.estimate.in_flight, 3);
    assert_eq!(kv.estimate.prompt_unknown, 1);
    assert_eq!(kv.estimate.tokens, 1028 + 129 + 5);
    assert_eq!(kv.estimate.blocks, Some(12));
    // vLLM's usage is over its 8191 usable blocks (one is its null block).
    assert_eq!(kv.estimate.server_blocks, Some(4095.5));
    assert_eq!(kv.estimate.diff_blocks, Some(4095.5 - 12.0));
    // Headroom: floor(8191 − 4095.5) free blocks / ceil(9000/128) blocks per p90 sequence.
    assert_eq!(kv.headroom.used_blocks, Some(4095.5));
    assert_eq!(kv.headroom.sequences_p90, Some(4095 / 71));
    assert_eq!(kv.headroom.warning, Some(false));
}

#[test]
fn without_a_scrape_the_cache_figures_are_null_with_reasons() {
    let mut m = Meter::new(MeterConfig::default(), T0);
    m.request_started(at(0.0), 1, "alice", None);
    let r = record(at(0.0), 500.0, Some(100.0), Some(10), Some(90), true);
    m.request_finished_id(at(0.5), Some(1), &r);
    let s = m.snapshot(at(2.0), &SnapshotQuery::default()).unwrap();
    assert_eq!(s.kv.cache, None);
    assert!(s.kv.cache_reason.is_some());
    assert_eq!(s.kv.contexts.p50, Some(100));
    assert_eq!(s.kv.table[0].kv_sequences, None);
    assert_eq!(s.kv.estimate.blocks, None);
    assert_eq!(s.kv.headroom.sequences_p90, None);
    assert!(s.kv.headroom.reason.is_some());
    // Without a scrape the first tokens would name the state; one request alone is not judged.
    let w = s.windows.get("10s").unwrap().saturation.clone().unwrap();
    assert_eq!((w.state, w.source), (None, None));
    assert!(w.reason.unwrap().contains("first tokens"));
    assert_eq!(m.saturation_now(at(2.0)), None);
}

const MS: u64 = 1_000_000;

/// A stream (id 1) passing a token every 50 ms from 100 ms to 9.95 s, but none in
/// `[stall_from, stall_to)` ms (one long step: its gap reported at `stall_to`), and requests
/// `(arrival ms, first token ms)` behind it, each ended right after its first token.
fn first_token_meter(stall: Option<(u64, u64)>, behind: &[(u64, u64)]) -> Meter {
    let mut m = Meter::new(
        MeterConfig {
            windows_s: vec![10, 60],
            ..Default::default()
        },
        T0,
    );
    let mut events: Vec<(u64, u64, bool)> = Vec::new(); // (ms, id, first token?)
    let mut t = 100;
    while t < 9950 {
        match stall {
            Some((from, to)) if (from..to).contains(&t) => t = to,
            _ => {}
        }
        events.push((t, 1, false));
        t += 50;
    }
    for (i, &(_, first)) in behind.iter().enumerate() {
        events.push((first, 2 + i as u64, true));
    }
    let mut starts: Vec<(u64, u64)> = behind
        .iter()
        .enumerate()
        .map(|(i, &(a, _))| (a, 2 + i as u64))
        .collect();
    starts.push((0, 1));
    events.sort();
    starts.sort();
    let mut last = None;
    let mut si = 0;
    for (ms, id, _first) in events {
        while si < starts.len() && starts[si].0 <= ms {
            m.request_started(T0 + starts[si].0 * MS, starts[si].1, "a", Some("m"));
            si += 1;
        }
        let now = T0 + ms * MS;
        if id == 1 {
            let gaps = Gaps::of(last.map(|l| Gap::of(now - l)));
            m.tokens_with_gaps(now, 1, 1, gaps);
            last = Some(now);
        } else {
            m.tokens(now, id, 1);
            let (a, _) = behind[(id - 2) as usize];
            let r = record(
                T0 + a * MS,
                (ms - a) as f64 + 1.0,
                Some((ms - a) as f64),
                Some(1),
                Some(10),
                true,
            );
            m.request_finished_id(now + MS, Some(id), &r);
        }
    }
    m
}

#[test]
fn first_tokens_beyond_the_longest_gap_by_two_paces_are_queued() {
    // TTFTs of 600, 100 and 1000 ms behind a 50 ms pace: excess 550, 50, 950 ms.
    let mut m = first_token_meter(None, &[(1000, 1600), (2000, 2100), (3000, 4000)]);
    let s = m.snapshot(at(11.0), &SnapshotQuery::default()).unwrap();
    let w = s.windows.get("10s").unwrap().saturation.clone().unwrap();
    let ft = w.first_token.unwrap();
    assert_eq!((ft.judged, ft.queued, ft.unjudged), (3, 2, 0));
    assert!(close(ft.queued_share.unwrap(), 2.0 / 3.0));
    assert!(close(ft.ttft_queueing_share.unwrap(), 1550.0 / 1700.0));
    assert!(close(ft.pace_ms.unwrap(), 50.0));
    assert_eq!(w.state, Some(SaturationState::Queueing));
    assert_eq!(w.source, Some("first_token"));
    // The stream itself arrived alone: not judged, and not in this window (its first token at 0.1 s).
    assert_eq!(m.saturation_now(at(11.0)), Some(SaturationState::Queueing));
    let text = m.prometheus(at(11.0));
    assert!(text.contains("\ntokenmeter_saturation_state 1\n"), "{text}");
    // The timeline's line: the state of the window ending with each second (seconds 1..=10),
    // as the meter knows it now. The windows ending at 2 s to 4 s hold the first tokens of
    // seconds 1 and 2 only (two judged: unknown); from the one ending at 5 s on, all three.
    let t = m.timeline(at(11.0), 10);
    assert_eq!(t.from_s, T0 / NANOS_PER_SEC + 1);
    assert_eq!(t.saturation[..3], [None, None, None]);
    assert_eq!(t.saturation[3..], [Some(1); 7]);
}

#[test]
fn a_long_prefill_the_others_saw_as_one_gap_queues_nobody() {
    // A 1000 ms step (a long prompt's prefill) from 3.0 s: the long prompt's first token at its
    // end, a request that arrived during it right after; two ordinary ones.
    let behind = [(1000, 1100), (2990, 4000), (3500, 4050), (6000, 6100)];
    let mut m = first_token_meter(Some((3000, 4000)), &behind);
    let s = m.snapshot(at(11.0), &SnapshotQuery::default()).unwrap();
    let w = s.windows.get("10s").unwrap().saturation.clone().unwrap();
    let ft = w.first_token.unwrap();
    assert_eq!((ft.judged, ft.queued), (4, 0), "{ft:?}");
    assert_eq!(w.state, Some(SaturationState::Ok));
    // Without the stall the same TTFTs would be queued (the rule can fail).
    let mut m = first_token_meter(None, &behind);
    let s = m.snapshot(at(11.0), &SnapshotQuery::default()).unwrap();
    let ft = s
        .windows
        .get("10s")
        .unwrap()
        .saturation
        .clone()
        .unwrap()
        .first_token
        .unwrap();
    assert_eq!((ft.judged, ft.queued), (4, 2), "{ft:?}");
}

/// Scrapes every second from `from_s` to `to_s` with `waiting(t)` requests waiting.
fn scrape_seconds(m: &mut Meter, from_s: u64, to_s: u64, waiting: impl Fn(u64) -> f64) {
    for t in from_s..to_s {
        m.server_sample(sample(
            T0 + t * NANOS_PER_SEC + NANOS_PER_SEC / 2,
            waiting(t),
            0.0,
            0.9,
        ));
    }
}

#[test]
fn saturation_stays_off_over_a_plateau_and_turns_on_within_two_windows_of_queueing() {
    let mut m = meter();
    // A 30-minute plateau just below saturation: a request waits in one scrape of ten.
    let plateau = 1800;
    scrape_seconds(&mut m, 0, plateau, |t| if t % 10 == 3 { 1.0 } else { 0.0 });
    let mut s = 10;
    while s <= plateau {
        m.server_sample(sample(T0 + s * NANOS_PER_SEC - 1, 0.0, 0.0, 0.9));
        assert_eq!(
            m.saturation_now(T0 + s * NANOS_PER_SEC),
            Some(SaturationState::Ok),
            "at {s} s"
        );
        s += 10;
    }
    // Queueing starts at `plateau` and lasts: on within two 10 s windows.
    scrape_seconds(&mut m, plateau, plateau + 30, |_| 2.0);
    let on = (plateau + 1..=plateau + 30)
        .find(|t| m.saturation_now(T0 + t * NANOS_PER_SEC) == Some(SaturationState::Queueing))
        .unwrap();
    assert!(
        on - plateau <= 20,
        "turned on {} s after queueing began",
        on - plateau
    );
    let snap = m
        .snapshot(
            T0 + (plateau + 30) * NANOS_PER_SEC,
            &SnapshotQuery::default(),
        )
        .unwrap();
    let w = snap.windows.get("10s").unwrap().saturation.clone().unwrap();
    assert_eq!(w.state, Some(SaturationState::Queueing));
    assert_eq!(w.waiting_share, Some(1.0));
    assert_eq!(w.waiting_max, Some(2.0));
}

#[test]
fn a_preemption_names_the_window_preempting() {
    let mut m = meter();
    for t in 0..20u64 {
        let p = if t < 15 { 3.0 } else { 4.0 };
        m.server_sample(sample(T0 + t * NANOS_PER_SEC + 1, 0.0, p, 0.99));
    }
    assert_eq!(
        m.saturation_now(T0 + 20 * NANOS_PER_SEC),
        Some(SaturationState::Preempting)
    );
    assert_eq!(m.saturation_now(T0 + 31 * NANOS_PER_SEC), None);
}

#[test]
fn headroom_extrapolates_the_estimates_growth_to_the_time_until_full() {
    let mut m = meter();
    // The recorded cache: 8191 usable blocks of 128 tokens; vLLM's usage 0 (the estimate rules).
    m.server_sample(sample(at(10.5), 0.0, 0.0, 0.0));
    // One request a second from 11 s to 20 s, each holding 1279 + 1 tokens: 10 blocks.
    for k in 11..=20u64 {
        m.request_started(at(k as f64), k, "agent", Some("m"));
        m.prompt_tokens(k, 1279);
        m.tokens(at(k as f64 + 0.1), k, 1);
    }
    let s = m.snapshot(at(21.5), &SnapshotQuery::default()).unwrap();
    let h = &s.kv.headroom;
    assert_eq!(s.kv.estimate.blocks, Some(100));
    // The 10 s window: 0 blocks at second 11's first event, 100 at second 21.
    assert_eq!(h.growth_blocks_per_s, Some(10.0));
    assert_eq!(h.seconds_to_full, Some((8191.0 - 100.0) / 10.0));
    let text = m.prometheus(at(21.5));
    assert!(
        text.contains("\ntokenmeter_kv_growth_blocks_per_second 10\n"),
        "{text}"
    );
    assert!(
        text.contains("\ntokenmeter_kv_time_to_full_seconds 809.1\n"),
        "{text}"
    );
    // No growth over the next window (nothing new): not filling, no time to full.
    let s = m.snapshot(at(40.5), &SnapshotQuery::default()).unwrap();
    assert_eq!(s.kv.headroom.growth_blocks_per_s, Some(0.0));
    assert_eq!(s.kv.headroom.seconds_to_full, None);
    // Not filling: the time to full is absent, not 0.
    let text = m.prometheus(at(40.5));
    assert!(
        !text.contains("\ntokenmeter_kv_time_to_full_seconds "),
        "{text}"
    );
    assert!(
        text.contains("\ntokenmeter_kv_growth_blocks_per_second 0\n"),
        "{text}"
    );
}
