//! Decode rate per concurrency level, measured by the client over real sockets, against the step
//! formula `1000 / (step_base_ms + step_per_seq_ms × N)` tok/s per stream. Alone in its binary so
//! that other tests do not compete with it for the two cores.

// Test and bench code: a failed unwrap fails the run loudly, and its items need no docs.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

mod sim_support;

use std::time::Instant;

use sim_support::*;

fn stream_body(content: &str, max_tokens: u64) -> String {
    format!(
        r#"{{"messages":[{{"role":"user","content":"{content}"}}],"max_tokens":{max_tokens},"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}}}}"#
    )
}

/// Arrival times of the content (token) events of a streamed response.
fn token_times(r: &Resp) -> Vec<Instant> {
    r.chunks
        .iter()
        .filter(|(_, c)| c.contains("\"delta\":{\"content\""))
        .map(|(t, _)| *t)
        .collect()
}

/// Per-stream decode rate (tokens/s) seen by the client: (tokens − 1) / (last − first token).
fn decode_rate(r: &Resp) -> f64 {
    let t = token_times(r);
    (t.len() - 1) as f64 / t[t.len() - 1].duration_since(t[0]).as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_rate_per_level_matches_the_step_formula() {
    let c = cfg();
    let (base, per) = (c.step_base_ms, c.step_per_seq_ms);
    let sim = start(c).await;
    for n in [1usize, 4, 16] {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let a = sim.addr();
                tokio::spawn(async move {
                    post(
                        a,
                        "/v1/chat/completions",
                        &stream_body(&format!("level {i}"), 40),
                    )
                    .await
                })
            })
            .collect();
        let mut rates = Vec::new();
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(token_times(&r).len(), 40);
            rates.push(decode_rate(&r));
        }
        let want = 1000.0 / (base + per * n as f64);
        let mean = rates.iter().sum::<f64>() / n as f64;
        eprintln!("level {n}: mean per-stream decode rate {mean:.2} tok/s, formula {want:.2} tok/s, rates {rates:.1?}");
        assert!(
            (mean / want - 1.0).abs() < 0.05,
            "level {n}: {mean} vs {want}"
        );
    }
    let lag = sim.step_lag();
    eprintln!("step lag: {lag:?}");
    sim.shutdown().await;
}
