//! CPU cost of one engine step (plan + finish) with a full batch, without timers or sockets.
//!
//! `cargo bench --bench sim_engine_step` — the time per iteration is the engine's own work for one
//! decode step of N running sequences (token delivery into bounded channels included).

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tokenmeter::sim::engine::{Engine, Ev, Job};
use tokenmeter::sim::metrics::Stats;
use tokenmeter::sim::SimConfig;
use tokio::sync::mpsc;

fn bench_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_step");
    for n in [16usize, 256, 2000] {
        let cfg = SimConfig {
            max_num_seqs: n as u32,
            stop_probability_per_token: 0.0,
            ..SimConfig::default()
        };
        let stats = Arc::new(Stats::new(60));
        let mut engine: Engine<mpsc::Sender<Ev>> = Engine::new(cfg, Arc::clone(&stats));
        let mut receivers = Vec::with_capacity(n);
        for _ in 0..n {
            // Long enough never to finish during the bench; receivers drained every iteration.
            let (tx, rx) = mpsc::channel(1 << 20);
            receivers.push(rx);
            engine.submit(Job {
                n: 1,
                prompt_tokens: 8,
                max_tokens: u64::MAX,
                stop_after: vec![None],
                arrival_ns: 0,
                prompt_ids: Vec::new(),
                sink: tx,
            });
        }
        let mut t = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let d = engine.begin_step(t).unwrap_or(1);
                t += d;
                engine.finish_step(t, t / 1_000_000_000);
                for rx in receivers.iter_mut() {
                    while rx.try_recv().is_ok() {}
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench_step);
criterion_main!(benches);
