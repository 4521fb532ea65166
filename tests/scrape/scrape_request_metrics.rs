//! vLLM's per-request `metrics` object (the simulator's `per_request_metrics = true`) reaches the
//! access log as `server_queue_ms`, `server_ttft_ms`, `server_mean_itl_ms` — from non-streamed
//! bodies and from the final usage event of streams — while the client's bytes stay unchanged.

use crate::common::*;
use tokenmeter::sim::SimConfig;

async fn sim(per_request_metrics: bool) -> tokenmeter::sim::SimHandle {
    let cfg = SimConfig {
        per_request_metrics,
        stop_probability_per_token: 0.0,
        ..Default::default()
    };
    crate::common::start_sim(cfg).await
}

fn chat(stream: bool, include_usage: bool) -> String {
    let opts = if include_usage {
        r#","stream_options":{"include_usage":true}"#
    } else {
        ""
    };
    format!(
        r#"{{"model":"sim-model","messages":[{{"role":"user","content":"hello"}}],"max_tokens":5,"stream":{stream}{opts}}}"#
    )
}

/// The `metrics` object of the last event (or of the body) that carries one.
fn metrics_of(body: &str) -> Option<serde_json::Value> {
    let mut found = None;
    for part in std::iter::once(body).chain(body.split("data: ")) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(part.trim()) {
            if v["metrics"].is_object() {
                found = Some(v["metrics"].clone());
            }
        }
    }
    found
}

fn assert_logged(rec: &serde_json::Value, m: &serde_json::Value) {
    assert_schema("record.schema.json", rec);
    for (ours, vllm) in [
        ("server_queue_ms", "queue_time_ms"),
        ("server_ttft_ms", "time_to_first_token_ms"),
        ("server_mean_itl_ms", "mean_itl_ms"),
    ] {
        assert_eq!(rec[ours].as_f64(), m[vllm].as_f64(), "{ours}: {rec}");
    }
    assert!(m["time_to_first_token_ms"].as_f64().unwrap() > 0.0);
    assert!(m["mean_itl_ms"].as_f64().unwrap() > 0.0);
}

#[tokio::test]
async fn non_streamed_and_streamed_with_usage_are_logged_and_unchanged() {
    let sim = sim(true).await;
    let p = TestProxy::start(&format!("http://{}", sim.addr()), |_| {}).await;
    let mut bodies = Vec::new();
    for (stream, usage) in [(false, false), (true, true)] {
        let body = chat(stream, usage);
        let via = raw_request(p.addr, &post("/v1/chat/completions", &body, &[])).await;
        let direct = raw_request(sim.addr(), &post("/v1/chat/completions", &body, &[])).await;
        let via_body = String::from_utf8(via.body.clone()).unwrap();
        // Same request, same deterministic text: only ids, timestamps and timings differ.
        assert_eq!(via.status, 200);
        assert_eq!(
            metrics_of(&via_body).map(|m| keys(&m)),
            metrics_of(&String::from_utf8(direct.body).unwrap()).map(|m| keys(&m)),
        );
        bodies.push(via_body);
    }
    let lines = p.log_lines(2).await;
    for (rec, body) in lines.iter().zip(&bodies) {
        let m = metrics_of(body).expect("the client received the metrics object");
        assert_logged(rec, &m);
    }
    p.stop().await;
    sim.shutdown().await;
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

#[tokio::test]
async fn injected_usage_event_yields_the_timings_and_stays_hidden() {
    let sim = sim(true).await;
    let p = TestProxy::start(&format!("http://{}", sim.addr()), |_| {}).await;
    let via = raw_request(
        p.addr,
        &post("/v1/chat/completions", &chat(true, false), &[]),
    )
    .await;
    let text = String::from_utf8(via.body).unwrap();
    assert!(
        !text.contains("\"usage\""),
        "the injected usage event reached the client: {text}"
    );
    assert!(metrics_of(&text).is_none());
    let rec = &p.log_lines(1).await[0];
    assert_eq!(rec["tokens_source"], "usage");
    let ttft = rec["server_ttft_ms"].as_f64().unwrap();
    assert!(
        ttft > 0.0 && ttft <= rec["ttft_ms"].as_f64().unwrap(),
        "{rec}"
    );
    assert!(rec["server_queue_ms"].as_f64().unwrap() >= 0.0);
    assert!(rec["server_mean_itl_ms"].as_f64().unwrap() > 0.0);
    p.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn without_the_metrics_object_the_fields_are_null() {
    let sim = sim(false).await;
    let p = TestProxy::start(&format!("http://{}", sim.addr()), |_| {}).await;
    for (stream, usage) in [(false, false), (true, true), (true, false)] {
        raw_request(
            p.addr,
            &post("/v1/chat/completions", &chat(stream, usage), &[]),
        )
        .await;
    }
    for rec in p.log_lines(3).await {
        for k in ["server_queue_ms", "server_ttft_ms", "server_mean_itl_ms"] {
            assert!(rec[k].is_null(), "{k}: {rec}");
        }
    }
    p.stop().await;
    sim.shutdown().await;
}
