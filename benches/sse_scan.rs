//! SSE scanning and event summarizing on recorded vLLM streams, and access-log line encoding.
//! Run: cargo bench --bench sse_scan

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokenmeter::dialect::Api;
use tokenmeter::openai::summarize;
use tokenmeter::record::RequestRecord;
use tokenmeter::sse::SseScanner;

fn fixture_body(name: &str) -> Vec<u8> {
    let raw = std::fs::read(format!(
        "{}/tests/fixtures/vllm/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let start = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    raw[start..].to_vec()
}

/// One recorded stream repeated to ~256 KiB, cut the way vLLM sends it: one event per frame.
fn frames(name: &str) -> (Vec<Vec<u8>>, usize) {
    let body = fixture_body(name);
    let text = String::from_utf8(body).unwrap();
    let events: Vec<Vec<u8>> = text
        .split_inclusive("\n\n")
        .map(|e| e.as_bytes().to_vec())
        .collect();
    let mut out = Vec::new();
    let mut bytes = 0;
    while bytes < 256 * 1024 {
        for e in &events {
            bytes += e.len();
            out.push(e.clone());
        }
    }
    (out, bytes)
}

fn scan(c: &mut Criterion) {
    let mut g = c.benchmark_group("sse_scan");
    for name in [
        "03_chat_stream_usage.http",
        "04_chat_stream_usage_continuous.http",
    ] {
        let (frames, bytes) = frames(name);
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::new("scan_only", name), &frames, |b, frames| {
            b.iter(|| {
                let mut s = SseScanner::default();
                let mut n = 0usize;
                for f in frames {
                    s.feed(f, |e| n += e.data.len());
                }
                n
            });
        });
        g.bench_with_input(
            BenchmarkId::new("scan_and_summarize", name),
            &frames,
            |b, frames| {
                b.iter(|| {
                    let mut s = SseScanner::default();
                    let mut tokens = 0u64;
                    for f in frames {
                        s.feed(f, |e| {
                            if let Some(sum) = summarize(e.data) {
                                tokens += sum.content_choices as u64;
                            }
                        });
                    }
                    tokens
                });
            },
        );
        g.throughput(Throughput::Elements(frames.len() as u64));
        // What the proxy runs per event since #13: the chat dialect over the same skimmer.
        g.bench_with_input(
            BenchmarkId::new("dialect_events", name),
            &frames,
            |b, frames| {
                let dialect = Api::Chat.dialect();
                b.iter(|| {
                    let mut s = SseScanner::default();
                    let mut tokens = 0u64;
                    for f in frames {
                        s.feed(f, |e| {
                            if let Some(sum) = dialect.event(e.data) {
                                tokens += sum.output as u64;
                            }
                        });
                    }
                    tokens
                });
            },
        );
        // What the proxy runs per event since the dialects have stream readers: one reader per
        // response (made here, once per stream), keeping the skimmer's memo between events.
        g.bench_with_input(
            BenchmarkId::new("stream_reader_events", name),
            &frames,
            |b, frames| {
                let dialect = Api::Chat.dialect();
                b.iter(|| {
                    let mut s = SseScanner::default();
                    let mut reader = dialect.stream_reader();
                    let mut tokens = 0u64;
                    for f in frames {
                        s.feed(f, |e| {
                            if let Some(sum) = reader.next_event(e.data) {
                                tokens += sum.output as u64;
                            }
                        });
                    }
                    tokens
                });
            },
        );
        // The skimmer with its memo called directly (no reader, no dynamic call): the floor
        // `stream_reader_events` is held to.
        g.bench_with_input(
            BenchmarkId::new("memo_events", name),
            &frames,
            |b, frames| {
                b.iter(|| {
                    let mut s = SseScanner::default();
                    let mut memo = tokenmeter::openai::EventMemo::default();
                    let mut tokens = 0u64;
                    for f in frames {
                        s.feed(f, |e| {
                            if e.data != b"[DONE]" {
                                if let Some(sum) =
                                    tokenmeter::openai::summarize_in_stream(e.data, &mut memo)
                                {
                                    tokens += sum.content_choices as u64;
                                }
                            }
                        });
                    }
                    tokens
                });
            },
        );
        g.bench_with_input(BenchmarkId::new("events", name), &frames, |b, frames| {
            b.iter(|| {
                let mut s = SseScanner::default();
                let mut tokens = 0u64;
                for f in frames {
                    s.feed(f, |e| {
                        if let Some(sum) = summarize(e.data) {
                            tokens += sum.content_choices as u64;
                        }
                    });
                }
                tokens
            });
        });
    }
    g.finish();
}

/// One summary per event of a recorded stream: the fast path against serde's reading.
fn summary(c: &mut Criterion) {
    let body = fixture_body("03_chat_stream_usage.http");
    let text = String::from_utf8(body).unwrap();
    let events: Vec<&[u8]> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| d.starts_with('{'))
        .map(str::as_bytes)
        .collect();
    let mut g = c.benchmark_group("summarize");
    g.throughput(Throughput::Elements(events.len() as u64));
    type Reader = for<'a> fn(&'a [u8]) -> Option<tokenmeter::openai::Summary<'a>>;
    let readers: [(&str, Reader); 2] = [
        ("fast_path", summarize),
        ("serde_reference", tokenmeter::openai::summarize_reference),
    ];
    for (name, read) in readers {
        g.bench_function(name, |b| {
            b.iter(|| {
                events
                    .iter()
                    .filter_map(|e| read(e))
                    .map(|s| s.content_choices)
                    .sum::<u32>()
            });
        });
    }
    g.finish();
}

fn encode(c: &mut Criterion) {
    let line = std::fs::read_to_string(format!(
        "{}/tests/fixtures/access_log_line.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let record: RequestRecord = serde_json::from_str(&line).unwrap();
    c.bench_function("access_log_line_encode", |b| {
        b.iter(|| record.to_json_line());
    });
}

criterion_group!(benches, scan, summary, encode);
criterion_main!(benches);
