//! Meter costs: `MeterHandle::tokens` per chunk (alone and with two threads contending) and a
//! `/stats` snapshot with 1,000 users.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use tokenmeter::clock::NANOS_PER_SEC;
use tokenmeter::meter::live::spawn_meter_at;
use tokenmeter::meter::{Meter, MeterConfig, MeterHandle, SnapshotQuery};
use tokenmeter::record::RequestRecord;

const T0: u64 = 1_795_975_200 * NANOS_PER_SEC;

/// A finished streamed request `id` of `user` for model `m`.
fn record(id: u64, user: &str, start: u64, e2e_ms: f64) -> RequestRecord {
    RequestRecord {
        request_id: format!("tm-1-{id:x}"),
        model: Some("m".into()),
        prompt_tokens: Some(100),
        ..tokenmeter::analyze::synth::record(start, e2e_ms, Some(150.0), 200, true, user)
    }
}

/// Waits until the meter task has drained everything sent so far (outside timed regions).
fn drain(rt: &tokio::runtime::Runtime, h: &MeterHandle) {
    rt.block_on(h.prometheus(T0));
}

fn bench_tokens(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let h = {
        let _g = rt.enter();
        spawn_meter_at(MeterConfig::default(), T0)
    };
    h.started(1, T0, Arc::from("alice"), Some(Arc::from("m")));
    h.started(2, T0, Arc::from("bob"), Some(Arc::from("m")));
    c.bench_function("handle.tokens per chunk", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for i in 0..iters {
                h.tokens(1, T0 + i, 1);
            }
            let d = start.elapsed();
            drain(&rt, &h);
            d
        });
    });
    c.bench_function("handle.tokens per chunk, 2 threads contending", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for id in [1u64, 2] {
                    let h = h.clone();
                    s.spawn(move || {
                        for i in 0..iters {
                            h.tokens(id, T0 + i, 1);
                        }
                    });
                }
            });
            let d = start.elapsed();
            drain(&rt, &h);
            d
        });
    });
}

fn bench_snapshot(c: &mut Criterion) {
    let mut m = Meter::new(MeterConfig::default(), T0);
    // 1,000 users over 600 s, each with a 10 s request every 30 s streaming 20 chunks.
    let mut id = 0u64;
    let users: Vec<String> = (0..1000).map(|u| format!("user-{u:04}")).collect();
    for round in 0..20u64 {
        for (u, name) in users.iter().enumerate() {
            id += 1;
            let start = T0 + (round * 30) * NANOS_PER_SEC + u as u64 * 7_000_000;
            m.request_started(start, id, name, Some("m"));
            for k in 0..20 {
                m.tokens(start + k * 500_000_000, id, 10);
            }
            m.request_finished(
                start + 10 * NANOS_PER_SEC,
                &record(id, name, start, 10_000.0),
            );
        }
    }
    let now = T0 + 600 * NANOS_PER_SEC;
    let q = SnapshotQuery::default();
    c.bench_function("snapshot, 1000 users", |b| {
        b.iter(|| m.snapshot(now, &q).unwrap());
    });
    c.bench_function("snapshot + JSON, 1000 users", |b| {
        b.iter(|| {
            serde_json::to_vec(&m.snapshot(now, &q).unwrap())
                .unwrap()
                .len()
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench_tokens, bench_snapshot
}
criterion_main!(benches);
