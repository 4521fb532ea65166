//! Decode rate per concurrency level, measured by the client over real sockets, against the step
//! formula `1000 / (step_base_ms + step_per_seq_ms × N)` tok/s per stream. Alone in its binary so
//! that other tests do not compete with it for the two cores.
//!
//! A loaded machine wakes the engine late; the simulator then re-anchors its schedule and reports
//! the time lost as slip (see `sim::scheduler`). The check allows exactly that reported slip and
//! nothing more: never faster than the formula, never slower than the formula plus the slip.

use std::time::Instant;

use crate::sim_support::*;

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

/// Per-stream decode time seen by the client: last − first token, seconds.
fn decode_secs(r: &Resp) -> f64 {
    let t = token_times(r);
    t[t.len() - 1].duration_since(t[0]).as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_rate_per_level_matches_the_step_formula() {
    let c = cfg();
    let (base, per) = (c.step_base_ms, c.step_per_seq_ms);
    let sim = start(c).await;
    for n in [1usize, 4, 16] {
        let slip_before = sim.step_lag().slip_ns;
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
        let mut secs = Vec::new();
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(token_times(&r).len(), 40);
            secs.push(decode_secs(&r));
        }
        let slip_s = (sim.step_lag().slip_ns - slip_before) as f64 / 1e9;
        let want = 1000.0 / (base + per * n as f64);
        // 39 gaps of one step each, by the formula; the slip the engine reported in this level
        // can only lengthen them (and at most by all of it).
        let formula_s = 39.0 / want;
        let mean = secs.iter().sum::<f64>() / n as f64;
        eprintln!(
            "level {n}: mean decode {:.1} ms, formula {:.1} ms, engine slip {:.1} ms; rate {:.2} tok/s vs {want:.2}",
            mean * 1e3,
            formula_s * 1e3,
            slip_s * 1e3,
            39.0 / mean
        );
        assert!(
            mean > formula_s * 0.95 && mean < (formula_s + slip_s) * 1.05,
            "level {n}: decode {mean} s vs formula {formula_s} s plus slip {slip_s} s"
        );
    }
    let lag = sim.step_lag();
    eprintln!("step lag: {lag:?}");
    sim.shutdown().await;
}
