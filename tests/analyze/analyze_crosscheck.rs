//! `analyze` beside vLLM's own count: the synthetic three-phase log (70, 150, 350 tok/s through
//! the proxy) with `server_sample` lines every 10 s whose counter matches the proxy in the first
//! two phases and runs 10 % ahead in the third (traffic bypassing the proxy).

use crate::analyze_support::*;
use crate::common::assert_schema;
use tokenmeter::analyze::{analyze, synth, AnalyzeOptions};
use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::scrape::{ServerSample, VllmValues};

const S: u64 = NANOS_PER_SEC;

/// vLLM's counter at `t` seconds after T0: 70/s, then 150/s from 120 s, then 385/s from 240 s.
fn server_count(t: f64) -> f64 {
    70.0 * t.min(120.0) + 150.0 * (t.min(240.0) - 120.0).max(0.0) + 385.0 * (t - 240.0).max(0.0)
}

fn log(with_samples: bool) -> Vec<u8> {
    let mut bytes = lines_of(&synth::steady_phases());
    if with_samples {
        for k in 0..36u64 {
            let t = 5 + 10 * k;
            let s = ServerSample {
                ts_ns: synth::T0 + t * S,
                values: VllmValues {
                    running: Some(1.0),
                    waiting: Some(0.0),
                    generation_tokens_total: Some(server_count(t as f64)),
                    prompt_tokens_total: Some(0.0),
                    kv_cache_usage: None,
                    ttft: None,
                    ..Default::default()
                },
                proxy_in_flight: None,
                scrape_ms: 1.0,
            };
            bytes.extend_from_slice(&s.to_json_line());
        }
    }
    bytes
}

fn run(with_samples: bool, opts: &AnalyzeOptions) -> tokenmeter::analyze::Report {
    let dir = TempDir::new("xcheck");
    let path = write(&dir.path("a.jsonl"), &log(with_samples));
    analyze(&[path], opts).unwrap()
}

#[test]
fn proxy_window_vs_server_window() {
    let r = run(true, &AnalyzeOptions::default());
    let v = serde_json::to_value(&r).unwrap();
    assert_schema("analyze.schema.json", &v);
    assert_eq!(
        r.inputs.other_lines, 36,
        "sample lines are still skipped as requests"
    );
    let c = r.crosscheck.as_ref().unwrap();
    assert_eq!(c.samples, 36);
    let rows: Vec<_> = c
        .steady_windows
        .iter()
        .map(|w| (w.n, w.server.interval_s, w.server.disagreement))
        .collect();
    assert_eq!(
        rows,
        [
            (Some(1), Some(110.0), Some(false)),
            (Some(4), Some(110.0), Some(false)),
            (Some(16), Some(110.0), Some(true)),
        ]
    );
    for (w, rate) in c.steady_windows.iter().zip([70.0, 150.0, 350.0]) {
        assert!(close(w.server.proxy_gen_tok_s.unwrap(), rate), "{w:?}");
    }
    assert!(close(c.steady_windows[0].server.gen_tok_s.unwrap(), 70.0));
    assert!(close(c.steady_windows[1].server.gen_tok_s.unwrap(), 150.0));
    assert!(close(c.steady_windows[2].server.gen_tok_s.unwrap(), 385.0));
    let pct = c.steady_windows[2].server.disagreement_pct.unwrap();
    assert!(
        (pct - 100.0 * (350.0 - 385.0) / 385.0).abs() < 1e-6,
        "{pct}"
    );
    // Overall over [5 s, 355 s]: proxy 66,300 tokens, server 70,325.
    let o = c.overall.as_ref().unwrap();
    assert_eq!(o.server.interval_s, Some(350.0));
    assert!(close(o.server.proxy_gen_tok_s.unwrap() * 350.0, 66_300.0));
    assert!(close(o.server.gen_tok_s.unwrap() * 350.0, 70_325.0));
    assert_eq!(o.server.disagreement, Some(true));
    let text = tokenmeter::analyze::tables::render(&r);
    assert!(
        text.contains("Proxy window vs server window (36 vLLM samples"),
        "{text}"
    );
    assert!(
        text.contains("DISAGREE") && text.contains("-9.09"),
        "{text}"
    );
}

#[test]
fn the_threshold_is_an_option() {
    let opts = AnalyzeOptions {
        disagreement_threshold_pct: 10.0,
        ..AnalyzeOptions::default()
    };
    let c = run(true, &opts).crosscheck.unwrap();
    assert_eq!(c.threshold_pct, 10.0);
    assert_eq!(c.steady_windows[2].server.disagreement, Some(false));
}

#[test]
fn no_samples_or_a_user_filter_mean_no_crosscheck() {
    let r = run(false, &AnalyzeOptions::default());
    assert!(r.crosscheck.is_none());
    let v = serde_json::to_value(&r).unwrap();
    assert!(v["crosscheck"].is_null());
    assert_schema("analyze.schema.json", &v);
    assert!(!tokenmeter::analyze::tables::render(&r).contains("Proxy window vs server window"));
    let mut opts = AnalyzeOptions::default();
    opts.filter.users = vec!["lane-0".into()];
    assert!(run(true, &opts).crosscheck.is_none());
    // A time filter keeps the samples inside it.
    let mut opts = AnalyzeOptions::default();
    opts.filter.from = Some(synth::T0 + 240 * S);
    let c = run(true, &opts).crosscheck.unwrap();
    assert_eq!(c.samples, 12);
}
