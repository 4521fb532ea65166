//! The simulator speaks the APIs coding agents use — the OpenAI Responses API, the Anthropic
//! Messages API and chat with forced tool calls — in vLLM 0.32's wire format. Every answer is
//! compared with the recorded samples in `tests/fixtures/vllm/agents/`: event names and order, field
//! order and types (ids, numbers and texts aside), usage placement, error bodies byte for byte. The
//! usage each answer reports is the engine's own count (`vllm:generation_tokens_total`).

use crate::sim_support::*;
use serde_json::Value;
use tokenmeter::sim::SimConfig;

/// Same served name and context length as the recorded server, fast steps, no stop rule.
fn wire_cfg() -> SimConfig {
    SimConfig {
        served_model_name: "tiny-llama".into(),
        max_model_len: 2048,
        step_base_ms: 1.0,
        step_per_seq_ms: 0.1,
        ..cfg()
    }
}

/// The `(event name, data)` pairs of a typed-event SSE body (`event: X\ndata: {json}\n\n`).
fn typed_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (name, data) = e
                .strip_prefix("event: ")
                .and_then(|r| r.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("bad event {e:?}"));
            (name.to_string(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

/// Event name + data shape, with runs of identical entries collapsed to one: vLLM sometimes
/// merges several tokens into one delta event, the simulator always writes one per token.
fn collapsed_shapes(events: &[(String, Value)]) -> Vec<String> {
    let mut out: Vec<String> = events
        .iter()
        .map(|(n, v)| format!("{n} {}", shape(v)))
        .collect();
    out.dedup();
    out
}

/// Streams `req` to `path` and checks it against sample `name`; returns the simulator's events.
async fn check_typed_stream(
    addr: std::net::SocketAddr,
    path: &str,
    req: &str,
    name: &str,
) -> Vec<(String, Value)> {
    let r = post(addr, path, req).await;
    let (status, headers, body) = fixture(&format!("agents/{name}"));
    assert_eq!(r.status, status, "{name}: {}", r.body);
    let want_ct = &headers.iter().find(|(k, _)| k == "content-type").unwrap().1;
    assert_eq!(r.header("content-type"), Some(want_ct.as_str()), "{name}");
    assert_eq!(r.header("transfer-encoding"), Some("chunked"), "{name}");
    let got = typed_events(&r.body);
    assert_eq!(r.chunks.len(), got.len(), "{name}: one event per chunk");
    for (n, v) in &got {
        assert_eq!(
            v["type"].as_str(),
            Some(n.as_str()),
            "{name}: type names the event"
        );
    }
    assert!(!r.body.contains("[DONE]"), "{name}: no [DONE] line");
    assert_eq!(
        collapsed_shapes(&got),
        collapsed_shapes(&typed_events(&body)),
        "{name}: events differ"
    );
    got
}

/// A non-streamed answer against sample `name` (same field order and types).
async fn check_full(addr: std::net::SocketAddr, path: &str, req: &str, name: &str) -> Value {
    let r = post(addr, path, req).await;
    let (status, _, body) = fixture(&format!("agents/{name}"));
    assert_eq!(r.status, status, "{name}: {}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let want: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(shape(&r.json()), shape(&want), "{name}: shape differs");
    r.json()
}

/// The request line of sample `name` in INDEX.txt: the exact body vLLM was sent.
fn recorded_request(name: &str) -> String {
    let index = std::fs::read_to_string(format!(
        "{}/tests/fixtures/vllm/agents/INDEX.txt",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let mut lines = index.lines();
    while let Some(l) = lines.next() {
        if l.split_whitespace().next() == Some(name) {
            let req = lines.next().unwrap().trim();
            return req.strip_prefix("request: ").unwrap().to_string();
        }
    }
    panic!("{name} not in INDEX.txt")
}

fn tokens_generated(sim: &tokenmeter::sim::SimHandle) -> u64 {
    sim.counters().generation_tokens_total
}

#[tokio::test]
async fn responses_streams_match_the_samples() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();
    let mut reported = 0;
    for (name, max) in [
        ("r02_responses_stream", 8),
        ("r03_responses_stream_instructions_items", 6),
        ("r06_responses_stream_max_1", 1),
    ] {
        let ev = check_typed_stream(a, "/v1/responses", &recorded_request(name), name).await;
        let seq: Vec<u64> = ev
            .iter()
            .map(|(_, v)| v["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seq, (0..ev.len() as u64).collect::<Vec<_>>(), "{name}");
        let deltas: Vec<&str> = ev
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .map(|(_, v)| v["delta"].as_str().unwrap())
            .collect();
        assert_eq!(deltas.len(), max, "{name}: one delta per token");
        let (last, done) = ev.last().unwrap();
        assert_eq!(last, "response.completed");
        let r = &done["response"];
        assert_eq!(r["usage"]["output_tokens"].as_u64(), Some(max as u64));
        assert_eq!(
            r["usage"]["total_tokens"].as_u64(),
            Some(r["usage"]["input_tokens"].as_u64().unwrap() + max as u64)
        );
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
        assert_eq!(r["output"][0]["content"][0]["text"], deltas.concat());
        reported += max as u64;
    }
    let r03 = recorded_request("r03_responses_stream_instructions_items");
    let ev = check_typed_stream(
        a,
        "/v1/responses",
        &r03,
        "r03_responses_stream_instructions_items",
    )
    .await;
    assert_eq!(
        ev[0].1["response"]["instructions"],
        "You are a coding agent."
    );
    reported += 6;
    assert_eq!(
        tokens_generated(&sim),
        reported,
        "usage is the engine's count"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn responses_created_leaves_before_the_first_token() {
    // A 1,600-character prompt (407 tokens) at 2,000 tok/s: about 200 ms of prefill.
    let sim = start(SimConfig {
        prefill_tok_s: 2000.0,
        ..wire_cfg()
    })
    .await;
    let body = format!(
        r#"{{"input":"{}","max_output_tokens":2,"stream":true}}"#,
        "abcd".repeat(400)
    );
    let r = post(sim.addr(), "/v1/responses", &body).await;
    let at = |i: usize| r.chunks[i].0.duration_since(r.sent_at).as_secs_f64() * 1e3;
    assert!(r.chunks[0].1.starts_with("event: response.created\n"));
    assert!(r.chunks[1].1.starts_with("event: response.in_progress\n"));
    assert!(r.chunks[2]
        .1
        .starts_with("event: response.output_item.added\n"));
    assert!(at(1) < 100.0, "in_progress after {} ms", at(1));
    assert!(at(2) > 190.0, "first output item after {} ms", at(2));
    sim.shutdown().await;
}

#[tokio::test]
async fn messages_streams_match_the_samples() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();
    let mut reported = 0;
    for (name, max) in [
        ("m02_messages_stream", 8),
        ("m03_messages_stream_system_blocks", 6),
        ("m06_messages_stream_max_1", 1),
    ] {
        let ev = check_typed_stream(a, "/v1/messages", &recorded_request(name), name).await;
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names[..2], ["message_start", "content_block_start"]);
        assert_eq!(
            names[names.len() - 3..],
            ["content_block_stop", "message_delta", "message_stop"]
        );
        assert_eq!(
            ev[0].1["message"]["usage"]["output_tokens"].as_u64(),
            Some(0)
        );
        let delta = &ev[ev.len() - 2].1;
        assert_eq!(delta["usage"]["output_tokens"].as_u64(), Some(max));
        assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
        assert_eq!(
            ev.iter()
                .filter(|(n, _)| n == "content_block_delta")
                .count() as u64,
            max
        );
        reported += max;
    }
    assert_eq!(
        tokens_generated(&sim),
        reported,
        "usage is the engine's count"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn non_streamed_answers_match_the_samples() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();
    let v = check_full(
        a,
        "/v1/responses",
        &recorded_request("r01_responses_nonstream"),
        "r01_responses_nonstream",
    )
    .await;
    assert_eq!(v["usage"]["output_tokens"].as_u64(), Some(16));
    assert_eq!(
        v["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        16,
        "one word per token"
    );
    let v = check_full(
        a,
        "/v1/messages",
        &recorded_request("m01_messages_nonstream"),
        "m01_messages_nonstream",
    )
    .await;
    assert_eq!(v["usage"]["output_tokens"].as_u64(), Some(16));
    assert_eq!(v["stop_reason"], "max_tokens");
    let v = check_full(
        a,
        "/v1/messages/count_tokens",
        &recorded_request("m09_messages_count_tokens"),
        "m09_messages_count_tokens",
    )
    .await;
    // "def hello():" as one chat message: ceil(12/4) + 4 + 3.
    assert_eq!(v["input_tokens"].as_u64(), Some(10));
    assert_eq!(
        v["context_management"]["original_input_tokens"].as_u64(),
        Some(10)
    );
    assert_eq!(tokens_generated(&sim), 32, "count_tokens generates nothing");
    sim.shutdown().await;
}

#[tokio::test]
async fn forced_tool_calls_match_the_samples() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();

    let name = "r04_responses_stream_tool_required";
    let ev = check_typed_stream(a, "/v1/responses", &recorded_request(name), name).await;
    let args: String = ev
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap().to_string())
        .collect();
    let done = &ev.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["arguments"], args.as_str());
    assert_eq!(done["output"][0]["name"], "read_file");
    assert!(
        serde_json::from_str::<Value>(&args).unwrap()["path"].is_string(),
        "{args}"
    );
    assert_eq!(done["usage"]["output_tokens"].as_u64(), Some(40));

    let name = "m04_messages_stream_tool_any";
    let ev = check_typed_stream(a, "/v1/messages", &recorded_request(name), name).await;
    assert_eq!(ev[1].1["content_block"]["name"], "read_file");
    let args: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, v)| v["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    assert!(
        serde_json::from_str::<Value>(&args).unwrap()["path"].is_string(),
        "{args}"
    );
    assert_eq!(
        ev[ev.len() - 2].1["usage"]["output_tokens"].as_u64(),
        Some(40)
    );

    // Chat, named and "required", with and without stream_options: `data:` events as today.
    for (name, usage) in [
        ("c01_chat_stream_tool_named", true),
        ("c02_chat_stream_tool_required_plain", false),
    ] {
        let r = post(a, "/v1/chat/completions", &recorded_request(name)).await;
        let got = r.events();
        let (_, _, body) = fixture(&format!("agents/{name}"));
        let shapes = |ev: &[String]| {
            let mut s: Vec<String> = ev
                .iter()
                .map(|e| match serde_json::from_str::<Value>(e) {
                    Ok(v) => shape(&v),
                    Err(_) => e.clone(),
                })
                .collect();
            s.dedup();
            s
        };
        assert_eq!(shapes(&got), shapes(&sse_events(&body)), "{name}");
        let calls: Vec<Value> = got[1..]
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["tool_calls"][0]
                    .as_object()
                    .cloned()
                    .map(Value::Object)
            })
            .collect();
        assert_eq!(calls.len(), 40, "{name}: one event per token");
        assert_eq!(calls[0]["function"]["name"], "read_file");
        let args: String = calls[1..]
            .iter()
            .map(|c| c["function"]["arguments"].as_str().unwrap().to_string())
            .collect();
        assert!(
            serde_json::from_str::<Value>(&args).is_ok(),
            "{name}: {args}"
        );
        assert_eq!(r.body.contains("\"usage\""), usage, "{name}");
    }

    // Non-streamed: the recorded vLLM answers were cut by the limit and kept the unparsed
    // `<tool_call>` text; the simulator always answers with the parsed call.
    let v = post(
        a,
        "/v1/responses",
        &recorded_request("r05_responses_nonstream_tool_required"),
    )
    .await
    .json();
    assert_eq!(v["output"][0]["type"], "function_call");
    assert_eq!(v["usage"]["output_tokens"].as_u64(), Some(40));
    let v = post(
        a,
        "/v1/messages",
        &recorded_request("m05_messages_nonstream_tool_any"),
    )
    .await
    .json();
    assert_eq!(v["content"][0]["type"], "tool_use");
    assert!(v["content"][0]["input"]["path"].is_string(), "{v}");
    let v = post(
        a,
        "/v1/chat/completions",
        &recorded_request("c03_chat_nonstream_tool_named"),
    )
    .await
    .json();
    let call = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "read_file");
    assert!(serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).is_ok());
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(40));
    assert_eq!(
        tokens_generated(&sim),
        40 * 7,
        "usage is the engine's count"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn tool_choice_auto_answers_with_text() {
    let sim = start(wire_cfg()).await;
    let req = recorded_request("r05_responses_nonstream_tool_required")
        .replace(r#""tool_choice":"required""#, r#""tool_choice":"auto""#);
    let v = post(sim.addr(), "/v1/responses", &req).await.json();
    assert_eq!(v["output"][0]["type"], "message");
    sim.shutdown().await;
}

#[tokio::test]
async fn errors_match_the_samples_exactly() {
    let sim = start(wire_cfg()).await;
    let a = sim.addr();
    for (name, path) in [
        ("r07_responses_unknown_model", "/v1/responses"),
        ("r08_responses_stream_too_long", "/v1/responses"),
        ("m07_messages_unknown_model", "/v1/messages"),
        ("m08_messages_stream_too_long", "/v1/messages"),
    ] {
        let r = post(a, path, &recorded_request(name)).await;
        let (status, _, want) = fixture(&format!("agents/{name}"));
        assert_eq!(
            (r.status, r.body.as_str()),
            (status, want.as_str()),
            "{name}"
        );
        assert_eq!(r.header("content-type"), Some("application/json"), "{name}");
    }
    // Not recorded: the Anthropic shape holds for every Messages error.
    let r = post(a, "/v1/messages", r#"{"model":"tiny-llama","messages":[]}"#).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["type"], "error");
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_tokens"));
    let r = post(
        a,
        "/v1/messages/count_tokens",
        r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"]["type"].as_str()),
        (404, Some("NotFoundError"))
    );
    let r = post(a, "/v1/responses", r#"{"model":"tiny-llama"}"#).await;
    assert_eq!(
        (r.status, r.json()["error"]["param"].as_str()),
        (400, Some("body.input"))
    );
    let r = request(a, "GET", "/v1/responses", None, "").await;
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    assert_eq!(
        tokens_generated(&sim),
        0,
        "rejected requests generate nothing"
    );
    sim.shutdown().await;
}
