//! `/metrics` parses as Prometheus text with vLLM's names and bucket bounds; counters are monotonic and exact.

use crate::sim_support::*;
use tokenmeter::sim::SimConfig;

fn stream_body(content: &str, max_tokens: u64) -> String {
    format!(
        r#"{{"messages":[{{"role":"user","content":"{content}"}}],"max_tokens":{max_tokens},"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}}}}"#
    )
}

/// Parses Prometheus text: every sample line is `name{labels} value`; returns (series, value).
fn parse_prom(text: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            assert!(
                line.is_empty() || line.starts_with("# HELP ") || line.starts_with("# TYPE "),
                "{line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line}"));
        let name_end = series
            .find('{')
            .unwrap_or_else(|| panic!("no labels: {line}"));
        assert!(series.ends_with('}'), "{line}");
        assert!(
            series[..name_end]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{line}"
        );
        for pair in series[name_end + 1..series.len() - 1].split("\",") {
            let (k, v) = pair
                .split_once("=\"")
                .unwrap_or_else(|| panic!("bad label in {line}"));
            assert!(
                !k.is_empty() && !v.contains('"') || v.ends_with('"'),
                "{line}"
            );
        }
        out.push((
            series.to_string(),
            value.parse().unwrap_or_else(|_| panic!("bad value {line}")),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_text_parses_and_counters_are_monotonic() {
    let sim = start(SimConfig {
        step_base_ms: 2.0,
        step_per_seq_ms: 0.2,
        ..cfg()
    })
    .await;
    let a = sim.addr();
    post(a, "/v1/chat/completions", &stream_body("m1", 10)).await;
    let first = parse_prom(&request(a, "GET", "/metrics", None, "").await.body);
    post(a, "/v1/chat/completions", &stream_body("m2", 7)).await;
    let r = request(a, "GET", "/metrics", None, "").await;
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let second = parse_prom(&r.body);
    let get =
        |s: &[(String, f64)], k: &str| s.iter().find(|(n, _)| n == k).map(|(_, v)| *v).unwrap();
    let gen = "vllm:generation_tokens_total{engine=\"0\",model_name=\"sim-model\"}";
    assert_eq!((get(&first, gen), get(&second, gen)), (10.0, 17.0));
    assert_eq!(
        get(&second, gen) as u64,
        sim.counters().generation_tokens_total
    );
    for (series, v) in &first {
        let cumulative = ["_total{", "_count{", "_sum{", "_bucket{"]
            .iter()
            .any(|s| series.contains(s));
        if cumulative {
            assert!(get(&second, series) >= *v, "{series} went down");
        }
    }
    let ttft_count =
        "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"sim-model\"}";
    assert_eq!(get(&second, ttft_count), 2.0);
    let itl_count = "vllm:inter_token_latency_seconds_count{engine=\"0\",model_name=\"sim-model\"}";
    assert_eq!(get(&second, itl_count), (9 + 6) as f64);
    let length = "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"sim-model\"}";
    assert_eq!(get(&second, length), 2.0);
    let fixture = std::fs::read_to_string(format!(
        "{}/tests/fixtures/vllm/metrics_during_load_c8.txt",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    for name in [
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
    ] {
        let les = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| l.starts_with(&format!("vllm:{name}_bucket{{")))
                .map(|l| {
                    l.split("le=\"")
                        .nth(1)
                        .unwrap()
                        .split('"')
                        .next()
                        .unwrap()
                        .to_string()
                })
                .collect()
        };
        assert_eq!(les(&r.body), les(&fixture), "{name} bucket bounds");
    }
    sim.shutdown().await;
}
