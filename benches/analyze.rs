//! `analyze` over a deterministic synthetic log (100,000 lines, about 74 MB); the 1M-line timing
//! is the ignored test `analyze_timing`.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::io::BufWriter;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tokenmeter::analyze::{analyze, synth, AnalyzeOptions};

fn bench_analyze(c: &mut Criterion) {
    let path = std::env::temp_dir().join(format!(
        "tokenmeter-bench-analyze-{}.jsonl",
        std::process::id()
    ));
    let bytes = {
        let mut w = BufWriter::new(std::fs::File::create(&path).expect("create bench log"));
        synth::write_load_log(&mut w, 100_000, 11).expect("write bench log")
    };
    let mut g = c.benchmark_group("analyze");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(bytes));
    let inputs = [path.clone()];
    g.bench_function("100k_lines", |b| {
        b.iter(|| analyze(&inputs, &AnalyzeOptions::default()).expect("analyze"));
    });
    g.finish();
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, bench_analyze);
criterion_main!(benches);
