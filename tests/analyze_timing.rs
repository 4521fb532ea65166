//! One timed run over 1,000,000 synthetic lines (release mode: the target is under 5 s).
//! Ignored by default: `cargo test --release --test analyze_timing -- --ignored --nocapture`.

mod analyze_support;

use std::io::BufWriter;
use std::time::Instant;

use analyze_support::TempDir;
use tokenmeter::analyze::{analyze, synth, AnalyzeOptions};

#[test]
#[ignore = "slow: 1M lines, run in release mode"]
fn one_million_lines() {
    let dir = TempDir::new("timing");
    let path = dir.path("big.jsonl");
    let mut w = BufWriter::new(std::fs::File::create(&path).unwrap());
    let bytes = synth::write_load_log(&mut w, 1_000_000, 7).unwrap();
    drop(w);
    let started = Instant::now();
    let report = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    let took = started.elapsed();
    println!(
        "analyze: 1,000,000 lines ({:.0} MB) in {:.2} s; {} requests, {} capacity rows, {} active s",
        bytes as f64 / 1e6,
        took.as_secs_f64(),
        report.summary.requests,
        report.capacity.len(),
        report.timeline.active_seconds
    );
    assert_eq!(report.inputs.lines, 1_000_000);
    assert_eq!(report.inputs.bad_lines, 0);
    assert_eq!(report.inputs.other_lines, 2000);
    assert!(report.capacity.len() >= 10, "{}", report.capacity.len());
    for row in report.capacity.iter().take(8) {
        println!(
            "  N={:>2} {:>5} s  {:>6.1} ± {:>5.1} tok/s  per-request {:?}",
            row.in_flight,
            row.seconds,
            row.gen_tok_s.mean,
            row.gen_tok_s.stdev.unwrap_or(0.0),
            row.per_request_tok_s
        );
    }
}
