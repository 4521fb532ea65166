//! Scale: 2,000 concurrent streams against one simulator on this machine.
//!
//! Run it (ignored by default, it takes a few seconds and most of the CPU):
//! `cargo test --release --test sim -- --ignored --nocapture sim_scale::`
//! It prints the engine's step lag (actual wake − scheduled deadline): max and mean.

use std::time::Instant;

use crate::sim_support::*;
use tokenmeter::sim::SimConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "scale run: 2,000 streams, several seconds of full CPU"]
async fn two_thousand_concurrent_streams_keep_the_schedule() {
    const STREAMS: usize = 2000;
    const TOKENS: u64 = 40;
    let cfg = SimConfig {
        max_num_seqs: 2048,
        step_base_ms: 12.2,
        step_per_seq_ms: 0.02,
        ..cfg()
    };
    let step_ms = cfg.step_base_ms + cfg.step_per_seq_ms * STREAMS as f64;
    let sim = start(cfg).await;
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..STREAMS)
        .map(|i| {
            let a = sim.addr();
            tokio::spawn(async move {
                let body = format!(
                    r#"{{"messages":[{{"role":"user","content":"s{i}"}}],"max_tokens":{TOKENS},"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}}}}"#
                );
                post(a, "/v1/chat/completions", &body).await
            })
        })
        .collect();
    let mut rates = Vec::with_capacity(STREAMS);
    for t in tasks {
        let r = t.await.unwrap();
        let times: Vec<Instant> = r
            .chunks
            .iter()
            .filter(|(_, c)| c.contains("\"delta\":{\"content\""))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(times.len() as u64, TOKENS);
        rates.push(
            (TOKENS - 1) as f64
                / times[times.len() - 1]
                    .duration_since(times[0])
                    .as_secs_f64(),
        );
    }
    let wall = t0.elapsed();
    let c = sim.counters();
    let lag = sim.step_lag();
    let mean_rate = rates.iter().sum::<f64>() / rates.len() as f64;
    eprintln!(
        "{STREAMS} streams × {TOKENS} tokens in {:.2} s: {} tokens generated, {} steps, step lag max {:.3} ms mean {:.3} ms, {} resyncs, slip {:.1} ms; \
         per-stream decode rate mean {mean_rate:.2} tok/s (formula at full batch {:.2})",
        wall.as_secs_f64(),
        c.generation_tokens_total,
        lag.steps,
        lag.max_ns as f64 / 1e6,
        lag.mean_ns as f64 / 1e6,
        lag.resyncs,
        lag.slip_ns as f64 / 1e6,
        1000.0 / step_ms
    );
    assert_eq!(c.generation_tokens_total, STREAMS as u64 * TOKENS);
    assert_eq!(c.requests_finished, STREAMS as u64);
    sim.shutdown().await;
}
