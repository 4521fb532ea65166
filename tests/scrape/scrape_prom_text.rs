//! The `/metrics` parser on recorded vLLM expositions, and its tolerance of what real servers do:
//! counter resets, missing and renamed series, garbage.

use tokenmeter::scrape::crosscheck::increase;
use tokenmeter::scrape::prom_text::{extract, parse};
use tokenmeter::scrape::VllmValues;

fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm")
        .join(name);
    std::fs::read_to_string(p).unwrap()
}

fn values(name: &str) -> (VllmValues, u64) {
    let t = parse(&fixture(name));
    (extract(&t), t.garbage)
}

#[test]
fn recorded_before() {
    let (v, garbage) = values("metrics_before.txt");
    assert_eq!(garbage, 0);
    assert_eq!(v.running, Some(0.0));
    assert_eq!(v.waiting, Some(0.0));
    assert_eq!(v.generation_tokens_total, Some(20.0));
    assert_eq!(v.prompt_tokens_total, Some(24.0));
    assert_eq!(v.kv_cache_usage, Some(0.0));
    let h = v.ttft.unwrap();
    assert_eq!(h.count, 2.0);
    assert_eq!(h.sum, 0.031105995178222656);
    assert_eq!(h.buckets.len(), 22, "23 bucket lines minus +Inf");
}

#[test]
fn recorded_during_load_c8() {
    let (v, garbage) = values("metrics_during_load_c8.txt");
    assert_eq!(garbage, 0);
    assert_eq!(v.running, Some(8.0));
    assert_eq!(v.waiting, Some(0.0));
    assert_eq!(v.generation_tokens_total, Some(45234.0));
    assert_eq!(v.prompt_tokens_total, Some(9543.0));
    assert_eq!(v.kv_cache_usage, Some(0.002930045171529727));
    let h = v.ttft.unwrap();
    assert_eq!(h.count, 246.0);
    assert_eq!(h.sum, 4.947733163833618);
    assert_eq!(h.buckets[0], (0.001, 0.0));
    assert_eq!(h.buckets[1], (0.005, 19.0));
    assert_eq!(h.buckets[3], (0.02, 163.0));
    assert_eq!(h.buckets.last(), Some(&(2560.0, 246.0)));
    assert!(h.buckets.windows(2).all(|w| w[0].0 < w[1].0));
}

#[test]
fn recorded_after() {
    let (v, _) = values("metrics_after.txt");
    assert_eq!(v.running, Some(0.0));
    assert_eq!(v.generation_tokens_total, Some(157.0));
    assert_eq!(v.prompt_tokens_total, Some(231.0));
    let h = v.ttft.unwrap();
    assert_eq!((h.count, h.sum), (21.0, 0.13684940338134766));
    assert_eq!(
        &h.buckets[..3],
        &[(0.001, 0.0), (0.005, 10.0), (0.01, 19.0)]
    );
}

#[test]
fn sums_over_engines_and_models() {
    let text = "\
vllm:num_requests_running{engine=\"0\",model_name=\"a\"} 3.0
vllm:num_requests_running{engine=\"1\",model_name=\"a\"} 4.0
vllm:generation_tokens_total{engine=\"0\",model_name=\"a\"} 100.0
vllm:generation_tokens_total{engine=\"1\",model_name=\"b\"} 50.0
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"a\"} 0.2
vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"a\"} 0.4
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.1\",model_name=\"a\"} 1.0
vllm:time_to_first_token_seconds_bucket{engine=\"1\",le=\"0.1\",model_name=\"a\"} 2.0
vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"a\"} 1.0
vllm:time_to_first_token_seconds_bucket{engine=\"1\",le=\"+Inf\",model_name=\"a\"} 5.0
vllm:time_to_first_token_seconds_sum{engine=\"0\",model_name=\"a\"} 0.5
vllm:time_to_first_token_seconds_sum{engine=\"1\",model_name=\"a\"} 1.5
vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"a\"} 1.0
vllm:time_to_first_token_seconds_count{engine=\"1\",model_name=\"a\"} 5.0
";
    let v = extract(&parse(text));
    assert_eq!(v.running, Some(7.0));
    assert_eq!(v.generation_tokens_total, Some(150.0));
    assert!(
        (v.kv_cache_usage.unwrap() - 0.3).abs() < 1e-12,
        "mean, not sum"
    );
    let h = v.ttft.unwrap();
    assert_eq!(h.buckets, vec![(0.1, 3.0)]);
    assert_eq!((h.sum, h.count), (2.0, 6.0));
}

#[test]
fn missing_series_are_none() {
    let v = extract(&parse(
        "vllm:num_requests_running{engine=\"0\"} 2\nother_metric 5\n",
    ));
    assert_eq!(v.running, Some(2.0));
    assert_eq!(v.waiting, None);
    assert_eq!(v.generation_tokens_total, None);
    assert_eq!(v.prompt_tokens_total, None);
    assert_eq!(v.kv_cache_usage, None);
    assert_eq!(v.ttft, None);
    assert_eq!(extract(&parse("")), VllmValues::default());
}

#[test]
fn deprecated_kv_cache_name_is_the_fallback() {
    let old = "vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n";
    assert_eq!(extract(&parse(old)).kv_cache_usage, Some(0.25));
    let both = format!("{old}vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0.5\n");
    assert_eq!(
        extract(&parse(&both)).kv_cache_usage,
        Some(0.5),
        "the new name wins"
    );
}

#[test]
fn garbage_lines_are_skipped_and_counted() {
    let mut text = fixture("metrics_during_load_c8.txt");
    text.insert_str(0, "this is not prometheus\n{}\n\u{0}\u{1} 3\n");
    text.push_str("vllm:generation_tokens_total{engine=\"0\" 7\nvllm:prompt_tokens_total{engine=\"0\",model_name=\"x\"} twelve\n");
    let t = parse(&text);
    assert_eq!(t.garbage, 5);
    let v = extract(&t);
    assert_eq!(v.generation_tokens_total, Some(45234.0));
    assert_eq!(v.prompt_tokens_total, Some(9543.0));
}

#[test]
fn counter_reset_counts_the_new_value() {
    // Recorded before → during → after is the same server; after → before is a restart.
    let seq: Vec<f64> = [
        "metrics_before.txt",
        "metrics_during_load_c8.txt",
        "metrics_after.txt",
    ]
    .iter()
    .map(|f| values(f).0.generation_tokens_total.unwrap())
    .collect();
    assert_eq!(seq, vec![20.0, 45234.0, 157.0]);
    // 20 → 45234: +45214; 45234 → 157: reset, the counter restarted and counted 157 since.
    assert_eq!(increase(&seq), (45214.0 + 157.0, 1));
    assert_eq!(increase(&[5.0, 5.0, 9.0]), (4.0, 0));
    assert_eq!(increase(&[9.0]), (0.0, 0));
}
