//! `analyze`'s KV-cache figures: the synthetic three-phase log with `server_sample` lines that
//! carry the recorded vLLM 0.32 cache (8192 blocks of 128 tokens), requests waiting in the
//! samples of one minute and one preemption later; contexts against the records themselves.

use crate::analyze_support::*;
use crate::common::assert_schema;
use tokenmeter::analyze::{analyze, synth, AnalyzeOptions};
use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::meter::kv::ContextView;
use tokenmeter::scrape::prom_text::{extract, parse};
use tokenmeter::scrape::ServerSample;

const S: u64 = NANOS_PER_SEC;

#[test]
fn contexts_table_and_saturation_from_the_log() {
    let records = synth::steady_phases();
    let mut bytes = lines_of(&records);
    let recorded = extract(&parse(include_str!(
        "../fixtures/vllm/agents/metrics_after.txt"
    )));
    // A sample every 2 s for 360 s: requests wait from 100 s to 160 s, one preemption at 300 s.
    for k in 0..180u64 {
        let t = 2 * k;
        let mut values = recorded.clone();
        values.waiting = Some(if (100..160).contains(&t) { 3.0 } else { 0.0 });
        values.kv.preemptions_total = Some(if t >= 300 { 1.0 } else { 0.0 });
        let s = ServerSample {
            ts_ns: synth::T0 + t * S,
            values,
            proxy_in_flight: None,
            scrape_ms: 1.0,
        };
        bytes.extend_from_slice(&s.to_json_line());
    }
    let dir = TempDir::new("kv");
    let path = write(&dir.path("a.jsonl"), &bytes);
    let r = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    assert_schema("analyze.schema.json", &serde_json::to_value(&r).unwrap());

    let mut contexts: Vec<u64> = records
        .iter()
        .filter(|r| r.is_generation())
        .filter_map(|r| Some(r.prompt_tokens? + r.completion_tokens?))
        .collect();
    assert!(!contexts.is_empty());
    let max = contexts.iter().copied().max();
    let want = ContextView::of(&mut contexts, max);
    assert_eq!(r.kv.contexts, want);
    let cache = r.kv.cache.unwrap();
    assert_eq!(
        (cache.num_gpu_blocks, cache.block_size),
        (Some(8192), Some(128))
    );
    for row in &r.kv.table {
        let c = row.context_tokens.unwrap();
        assert_eq!(row.kv_sequences, Some(8192 / c.div_ceil(128)), "{row:?}");
        assert_eq!(row.max_num_seqs, None);
    }
    let sat = r.kv.saturation.unwrap();
    // Windows of 10 s from the first sample: [100, 160) is six queueing windows; the counter
    // rose between the scrapes at 298 s and 300 s, so the window [300, 310) preempts (its
    // increase is taken from the last scrape before it).
    assert_eq!(sat.window_s, 10);
    assert_eq!(sat.windows, 36);
    assert_eq!(sat.queueing, 6);
    assert_eq!(sat.preempting, 1);
    assert_eq!(
        sat.first_saturated.as_deref(),
        Some("2026-11-29T18:01:40.000000Z")
    );
    let users_max = r.users.iter().filter_map(|u| u.contexts.max).max();
    assert_eq!(users_max, want.max);
}
