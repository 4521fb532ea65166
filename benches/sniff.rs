//! The request-head sniffer's cost per request: a typical agent request (head and JSON body) in
//! one read, and the same split into 1,460-byte reads. Run: cargo bench --bench sniff

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tokenmeter::proxy::sniff::{Sniffed, Verdict};

fn request() -> Vec<u8> {
    let body = format!(
        r#"{{"model":"qwen","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "word ".repeat(800)
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gpu-box:8080\r\nuser-agent: OpenAI/Python 1.54.0\r\n\
         accept: application/json\r\naccept-encoding: gzip, deflate\r\ncontent-type: application/json\r\n\
         authorization: Bearer sk-0123456789abcdef0123456789abcdef\r\nx-stainless-lang: python\r\n\
         x-stainless-package-version: 1.54.0\r\nx-request-id: run-42/step-7\r\nconnection: keep-alive\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    [head.into_bytes(), body.into_bytes()].concat()
}

fn sniff(c: &mut Criterion) {
    let req = request();
    let mut g = c.benchmark_group("sniff");
    g.throughput(Throughput::Elements(1));
    g.bench_function("request_in_one_read", |b| {
        b.iter(|| {
            let mut s = Sniffed::new((), 64 * 1024, Arc::new(Verdict::default()));
            s.feed(std::hint::black_box(&req));
            s
        });
    });
    g.bench_function("request_in_1460_byte_reads", |b| {
        b.iter(|| {
            let mut s = Sniffed::new((), 64 * 1024, Arc::new(Verdict::default()));
            for piece in std::hint::black_box(&req).chunks(1460) {
                s.feed(piece);
            }
            s
        });
    });
    g.finish();
}

criterion_group!(benches, sniff);
criterion_main!(benches);
