//! One timed run over 1,000,000 synthetic lines (release mode: the target is under 5 s).
//! Ignored by default: `cargo test --release --test analyze -- --ignored --nocapture
//! analyze_timing::`. The filter also keeps it alone in its process, whose CPU time it prints.

use std::io::BufWriter;
use std::time::Instant;

use crate::analyze_support::TempDir;
use tokenmeter::analyze::{analyze, synth, AnalyzeOptions};

/// User + system CPU seconds of this process so far (Linux `/proc`; 0 elsewhere), assuming the
/// usual 100 clock ticks per second.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of the line are the 12th and 13th after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

#[test]
#[ignore = "slow: 1M lines, run in release mode"]
fn one_million_lines() {
    let dir = TempDir::new("timing");
    let path = dir.path("big.jsonl");
    let mut w = BufWriter::new(std::fs::File::create(&path).unwrap());
    let bytes = synth::write_load_log(&mut w, 1_000_000, 7).unwrap();
    drop(w);
    let (started, cpu0) = (Instant::now(), cpu_seconds());
    let report = analyze(&[path], &AnalyzeOptions::default()).unwrap();
    let took = started.elapsed();
    let cpu = cpu_seconds() - cpu0;
    println!(
        "analyze: 1,000,000 lines ({:.0} MB) in {:.2} s wall, {cpu:.2} s CPU; {} requests, {} capacity rows, {} active s",
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
