//! The simulator's per-request record (`truth_log`, `sim::request_log`) over real sockets: one
//! line per finished request, with the engine's timings and the tokens its client got, streamed
//! or not; the truth `analyze --sim-truth` computes the service level from.

use std::path::PathBuf;

use tokenmeter::clock::Clock;
use tokenmeter::sim::request_log::{read, service_level_truth};
use tokenmeter::sim::SimConfig;
use tokenmeter::slo::SloConfig;

use crate::sim_support::{cfg, post, start};

#[tokio::test]
async fn every_finished_request_is_recorded_with_what_its_client_got() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sim-truth-log");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("truth.jsonl");
    let sim = start(SimConfig {
        truth_log: Some(path.clone()),
        ..cfg()
    })
    .await;
    let addr = sim.addr();
    let before = Clock::global().now();
    // At once, so they share the batch: two streamed, two answered at their end.
    let wanted = [(true, 7u64), (false, 5), (true, 12), (false, 9)];
    let tasks: Vec<_> = wanted
        .iter()
        .map(|&(stream, n)| {
            let body = format!(
                "{{\"model\":\"sim-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"hello {n}\"}}],\"max_tokens\":{n},\"stream\":{stream}}}"
            );
            tokio::spawn(async move { post(addr, "/v1/chat/completions", &body).await })
        })
        .collect();
    let mut usage = Vec::new();
    for (t, &(stream, _)) in tasks.into_iter().zip(&wanted) {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        if !stream {
            usage.push(r.json()["usage"]["completion_tokens"].as_u64().unwrap());
        }
    }
    let after = Clock::global().now();
    sim.shutdown().await;
    let mut records = read(&path).unwrap();
    assert_eq!(records.len(), wanted.len(), "{records:?}");
    records.sort_by_key(|r| r.completion_tokens);
    let mut expected: Vec<(bool, u64)> = wanted.to_vec();
    expected.sort_by_key(|w| w.1);
    let got: Vec<(bool, u64)> = records
        .iter()
        .map(|r| (r.stream, r.completion_tokens))
        .collect();
    assert_eq!(got, expected);
    // The non-streamed answers' usage is the record's count.
    usage.sort_unstable();
    let recorded: Vec<u64> = records
        .iter()
        .filter(|r| !r.stream)
        .map(|r| r.completion_tokens)
        .collect();
    assert_eq!(usage, recorded);
    let step_ns = ((cfg().step_base_ms + cfg().step_per_seq_ms) * 1e6) as u64;
    for r in &records {
        assert!(
            r.arrival_ns >= before && r.arrival_ns + r.e2e_ns <= after,
            "{r:?}"
        );
        assert!(r.queue_ns <= r.ttft_ns && r.ttft_ns <= r.e2e_ns, "{r:?}");
        // One token a step after the first: at least a step of the smallest batch each.
        assert!(
            r.e2e_ns - r.ttft_ns >= (r.completion_tokens - 1) * step_ns,
            "{r:?}"
        );
    }
    // The truth from them: every request judged, at its level (four at once: 2 to 4).
    let truth = service_level_truth(&SloConfig::default(), &records, false);
    let judged: u64 = truth.levels.iter().map(|l| l.requests).sum();
    assert_eq!(judged, 4, "{truth:?}");
    assert!(
        truth
            .levels
            .iter()
            .all(|l| l.requests == 0 || (2..=4).contains(&l.in_flight)),
        "{truth:?}"
    );
}
