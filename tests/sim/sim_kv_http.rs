//! The KV cache over real sockets: `vllm:cache_config_info` carries vLLM 0.32's label names,
//! each API reports the prefix cache's hits in its own usage field, and a KV-starved simulator
//! queues and preempts, with `/sim/truth` agreeing with `/metrics`.

use serde_json::{json, Value};

use crate::sim_support::*;
use tokenmeter::exposition::vllm::CACHE_CONFIG_LABELS;
use tokenmeter::sim::SimConfig;

/// The label names of `metric`'s first sample in Prometheus `text`.
fn label_names(text: &str, metric: &str) -> Vec<String> {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{metric}{{")))
        .unwrap_or_else(|| panic!("no {metric} in\n{text}"));
    let inner = &line[metric.len() + 1..line.rfind('}').unwrap()];
    inner
        .split("\",")
        .map(|p| p.split_once("=\"").unwrap().0.to_string())
        .collect()
}

/// The value of the sample `series` (name with its labels, or a name without labels).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (s, v) = l.rsplit_once(' ')?;
            (s == series || s.split('{').next() == Some(series)).then(|| v.parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {series}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_config_info_has_vllms_recorded_label_names() {
    let recorded = std::fs::read_to_string(format!(
        "{}/tests/fixtures/vllm/agents/metrics_after.txt",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let want = label_names(&recorded, "vllm:cache_config_info");
    assert_eq!(
        want, CACHE_CONFIG_LABELS,
        "the declaration is the recording's"
    );
    let sim = start(SimConfig {
        num_gpu_blocks: 1000,
        block_size: 32,
        max_model_len: 4096,
        ..cfg()
    })
    .await;
    let text = request(sim.addr(), "GET", "/metrics", None, "").await.body;
    assert_eq!(label_names(&text, "vllm:cache_config_info"), want);
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))
        .unwrap();
    for part in [
        "block_size=\"32\"",
        "num_gpu_blocks=\"1000\"",
        "kv_cache_size_tokens=\"32000\"",
        "kv_cache_max_concurrency=\"7.8125\"",
        "enable_prefix_caching=\"True\"",
    ] {
        assert!(line.contains(part), "{part} in {line}");
    }
    assert!(line.ends_with("} 1.0"), "{line}");
    sim.shutdown().await;
}

/// A long system prompt (over 100 tokens, its own per API) so that whole blocks are cached.
fn system(api: &str) -> String {
    format!("{api:>12}{}", "abcd".repeat(100))
}

/// The text of a non-streamed answer of `api`.
fn answer_text(api: &str, v: &Value) -> String {
    let t = match api {
        "chat" => &v["choices"][0]["message"]["content"],
        "responses" => &v["output"][0]["content"][0]["text"],
        _ => &v["content"][0]["text"],
    };
    t.as_str().unwrap().to_string()
}

/// The call of `api` carrying `turns` (user, assistant, user, …), non-streamed.
fn body(api: &str, turns: &[String], stream: bool) -> (String, String) {
    let role = |i: usize| if i % 2 == 0 { "user" } else { "assistant" };
    let msgs: Vec<Value> = turns
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"role": role(i), "content": t}))
        .collect();
    let (path, b) = match api {
        "chat" => {
            let mut all = vec![json!({"role": "system", "content": system(api)})];
            all.extend(msgs);
            let mut b =
                json!({"messages": all, "max_tokens": 20, "ignore_eos": true, "stream": stream});
            if stream {
                b["stream_options"] = json!({"include_usage": true});
            }
            ("/v1/chat/completions", b)
        }
        "responses" => {
            let items: Vec<Value> = turns
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    if i % 2 == 0 {
                        json!({"role": "user", "content": [{"type": "input_text", "text": t}]})
                    } else {
                        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t}]})
                    }
                })
                .collect();
            (
                "/v1/responses",
                json!({"instructions": system(api), "input": items, "max_output_tokens": 20, "ignore_eos": true, "stream": stream}),
            )
        }
        _ => (
            "/v1/messages",
            // Claude Code's form: the system as a block list with cache_control.
            json!({"system": [{"type": "text", "text": system(api), "cache_control": {"type": "ephemeral"}}],
                   "messages": msgs, "max_tokens": 20, "ignore_eos": true, "stream": stream}),
        ),
    };
    (path.to_string(), b.to_string())
}

/// The `data:` payloads of a typed or plain SSE body.
fn data_lines(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// The cached tokens `api`'s usage reports (`None` when the field is absent or null).
fn reported_cached(api: &str, usage: &Value) -> Option<u64> {
    match api {
        "chat" => usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        "responses" => usage["input_tokens_details"]["cached_tokens"].as_u64(),
        _ => usage["cache_read_input_tokens"].as_u64(),
    }
}

/// The usage of a streamed answer of `api`: chat's last usage event, Responses'
/// `response.completed`, Messages' `message_delta`.
fn stream_usage(api: &str, body: &str) -> Value {
    let events = data_lines(body);
    let found = match api {
        "chat" => events
            .iter()
            .rev()
            .find(|e| !e["usage"].is_null())
            .map(|e| e["usage"].clone()),
        "responses" => events
            .iter()
            .find(|e| e["type"] == "response.completed")
            .map(|e| e["response"]["usage"].clone()),
        _ => events
            .iter()
            .find(|e| e["type"] == "message_delta")
            .map(|e| e["usage"].clone()),
    };
    found.unwrap_or_else(|| panic!("no usage in {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_api_reports_the_cached_prefix_in_its_own_usage_field() {
    for details in [true, false] {
        let sim = start(SimConfig {
            enable_prompt_tokens_details: details,
            step_base_ms: 1.0,
            step_per_seq_ms: 0.0,
            ..cfg()
        })
        .await;
        for api in ["chat", "responses", "messages"] {
            let first = vec![format!("{api}: list the files, then say done.")];
            let (path, b) = body(api, &first, false);
            let r = post(sim.addr(), &path, &b).await;
            assert_eq!(r.status, 200, "{}", r.body);
            let v = r.json();
            let p1 = v["usage"]["prompt_tokens"]
                .as_u64()
                .or(v["usage"]["input_tokens"].as_u64())
                .unwrap();
            let first_cached = reported_cached(api, &v["usage"]);
            // Nothing of this API's conversation was cached before (its text differs).
            // Responses always reports; the others only some hits, and there are none yet.
            let zero = (api == "responses").then_some(0);
            assert_eq!(first_cached, zero, "{api} first call, details {details}");
            let mut next = first.clone();
            next.push(answer_text(api, &v));
            next.push("README.md hello.py".into());
            let want = (p1 + 20) / 16 * 16;
            for stream in [false, true] {
                let (path, b) = body(api, &next, stream);
                let r = post(sim.addr(), &path, &b).await;
                assert_eq!(r.status, 200, "{}", r.body);
                let usage = if stream {
                    stream_usage(api, &r.body)
                } else {
                    r.json()["usage"].clone()
                };
                // The second (streamed) call finds the non-streamed one's whole prompt but its
                // last block: more than the first call's.
                let reported = reported_cached(api, &usage);
                if api == "responses" || details {
                    let got = reported.unwrap_or_else(|| panic!("{api}: {usage}"));
                    if stream {
                        assert!(got >= want, "{api} stream {got} < {want}");
                    } else {
                        assert_eq!(got, want, "{api}: previous prompt + answer in whole blocks");
                    }
                } else {
                    assert_eq!(reported, None, "{api} without details: {usage}");
                    if api == "chat" && !stream {
                        assert!(usage["prompt_tokens_details"].is_null());
                    }
                }
            }
        }
        let truth = sim.kv_truth();
        assert!(truth.prefix_cache_hits > 0);
        assert_eq!(truth.prefix_cache_hits, truth.prompt_tokens_cached);
        sim.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_starved_sim_queues_and_preempts_and_its_truth_agrees_with_metrics() {
    // 40 usable blocks of 16 tokens (640 tokens); each request's prompt is ~110 tokens and it
    // grows to ~230: eight at once cannot all run, nor all grow.
    let sim = start(SimConfig {
        num_gpu_blocks: 41,
        block_size: 16,
        max_model_len: 640,
        enable_prefix_caching: false,
        step_base_ms: 2.0,
        step_per_seq_ms: 0.0,
        ..cfg()
    })
    .await;
    let addr = sim.addr();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let content = format!("{i:03}{}", "word".repeat(100));
        let b = json!({"messages": [{"role": "user", "content": content}], "max_tokens": 120,
                       "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})
        .to_string();
        tasks.push(tokio::spawn(async move {
            post(addr, "/v1/chat/completions", &b).await
        }));
    }
    let (mut saw_waiting, mut max_running) = (false, 0);
    loop {
        let text = request(addr, "GET", "/metrics", None, "").await.body;
        let truth: Value = request(addr, "GET", "/sim/truth", None, "").await.json();
        let running = truth["running"].as_u64().unwrap();
        max_running = max_running.max(running);
        if value(&text, "vllm:num_requests_waiting") > 0.0 && running > 0 {
            saw_waiting = true;
        }
        let blocks: u64 = truth["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["blocks"].as_u64().unwrap())
            .sum();
        assert_eq!(blocks, truth["blocks_held"].as_u64().unwrap(), "{truth}");
        assert!(truth["blocks_in_use"].as_u64() <= Some(40), "{truth}");
        if tasks.iter().all(tokio::task::JoinHandle::is_finished) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        let usage = stream_usage("chat", &r.body);
        assert_eq!(
            usage["completion_tokens"], 120,
            "preempted requests still finish"
        );
    }
    assert!(saw_waiting, "requests waited for blocks");
    assert!(
        (1..=5).contains(&max_running),
        "7 blocks each to start: at most 5 of 8 run at once, saw {max_running}"
    );
    let text = request(addr, "GET", "/metrics", None, "").await.body;
    let truth = sim.kv_truth();
    assert!(truth.preemptions > 0, "{truth:?}");
    assert_eq!(
        value(&text, "vllm:num_preemptions_total"),
        truth.preemptions as f64
    );
    assert_eq!(truth.blocks_in_use, 0);
    assert_eq!(truth.blocks_held, 0);
    assert_eq!(value(&text, "vllm:kv_cache_usage_perc"), 0.0);
    assert_eq!(value(&text, "vllm:prefix_cache_queries_total"), 0.0);
    assert_eq!(sim.counters().generation_tokens_total, 8 * 120);
    sim.shutdown().await;
}
