//! The recorded stream/non-stream pairs (`tests/fixtures/vllm/agents/pairs/`): their requests,
//! and how a rebuilt answer is compared with the recorded one.

use serde_json::Value;

use crate::common::{fixture, Fixture};

/// The request of each pair, as `pairs/INDEX.txt` lists it (non-streamed form).
pub const PAIRS: &[(&str, &str, &str)] = &[
    (
        "p01_chat",
        "/v1/chat/completions",
        r#"{"model": "tiny-llama", "messages": [{"role": "user", "content": "def hello():"}], "max_tokens": 16, "temperature": 0}"#,
    ),
    (
        "p02_chat_ignore_eos_seed",
        "/v1/chat/completions",
        r#"{"model": "tiny-llama", "messages": [{"role": "user", "content": "def hello():"}], "max_tokens": 24, "temperature": 0, "ignore_eos": true, "seed": 3}"#,
    ),
    (
        "p03_chat_tool_named",
        "/v1/chat/completions",
        r#"{"model": "tiny-llama", "messages": [{"role": "user", "content": "read main.py"}], "tools": [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}], "tool_choice": {"type": "function", "function": {"name": "read_file"}}, "max_tokens": 40, "temperature": 0}"#,
    ),
    (
        "p04_chat_logprobs",
        "/v1/chat/completions",
        r#"{"model": "tiny-llama", "messages": [{"role": "user", "content": "def hello():"}], "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2}"#,
    ),
    (
        "p05_chat_n2_seed",
        "/v1/chat/completions",
        r#"{"model": "tiny-llama", "messages": [{"role": "user", "content": "def hello():"}], "max_tokens": 6, "temperature": 0.8, "seed": 11, "n": 2}"#,
    ),
    (
        "p06_chat_stop",
        "/v1/chat/completions",
        r#"{"model": "tiny-llama", "messages": [{"role": "user", "content": "def hello():"}], "max_tokens": 32, "temperature": 0, "stop": ["&"]}"#,
    ),
    (
        "p07_completions",
        "/v1/completions",
        r#"{"model": "tiny-llama", "prompt": "def hello():", "max_tokens": 12, "temperature": 0}"#,
    ),
    (
        "p08_messages",
        "/v1/messages",
        r#"{"model": "tiny-llama", "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": "def hello():"}]}"#,
    ),
    (
        "p09_messages_tool_any",
        "/v1/messages",
        r#"{"model": "tiny-llama", "max_tokens": 40, "temperature": 0, "tools": [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}], "tool_choice": {"type": "any"}, "messages": [{"role": "user", "content": "read main.py"}]}"#,
    ),
    (
        "p10_messages_system_stop",
        "/v1/messages",
        r#"{"model": "tiny-llama", "max_tokens": 32, "temperature": 0, "system": "You are terse.", "stop_sequences": ["&"], "messages": [{"role": "user", "content": "def hello():"}]}"#,
    ),
    (
        "p11_responses",
        "/v1/responses",
        r#"{"model": "tiny-llama", "input": "def hello():", "max_output_tokens": 16, "temperature": 0}"#,
    ),
    (
        "p12_responses_tool_required",
        "/v1/responses",
        r#"{"model": "tiny-llama", "input": "read main.py", "tools": [{"type": "function", "name": "read_file", "description": "Read a file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}], "tool_choice": "required", "max_output_tokens": 40, "temperature": 0}"#,
    ),
    (
        "p13_responses_instructions",
        "/v1/responses",
        r#"{"model": "tiny-llama", "instructions": "You are terse.", "input": [{"role": "user", "content": "def hello():"}], "max_output_tokens": 12, "temperature": 0}"#,
    ),
];

pub const FORCED_TOOL: &[&str] = &[
    "p03_chat_tool_named",
    "p09_messages_tool_any",
    "p12_responses_tool_required",
];

pub fn pair(name: &str) -> (Fixture, Fixture) {
    (
        fixture(&format!("agents/pairs/{name}.stream.http")),
        fixture(&format!("agents/pairs/{name}.nonstream.http")),
    )
}

/// The values that differ between two requests: ids and creation times (top level, and the ids
/// of Responses output items), as (non-streamed, streamed) JSON texts.
pub fn request_specific(nonstream: &Value, completed: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for key in ["id", "created", "created_at"] {
        if let (Some(a), Some(b)) = (nonstream.get(key), completed.get(key)) {
            out.push((format!("\"{key}\":{a}"), format!("\"{key}\":{b}")));
        }
    }
    if let (Some(Value::Array(a)), Some(Value::Array(b))) =
        (nonstream.get("output"), completed.get("output"))
    {
        for (x, y) in a.iter().zip(b) {
            out.push((x["id"].to_string(), y["id"].to_string()));
        }
    }
    out
}

/// The recorded non-streamed body of pair `name` with the other request's ids and times swapped
/// for those of `rebuilt` (which must hold them in the same places).
pub fn expected_body(recorded: &str, rebuilt: &str) -> String {
    let got: Value = serde_json::from_str(rebuilt).unwrap_or_else(|e| panic!("{e}\n{rebuilt}"));
    let want: Value = serde_json::from_str(recorded).unwrap();
    let mut expected = recorded.to_string();
    for (from, to) in request_specific(&want, &got) {
        assert!(expected.contains(&from), "{from}");
        expected = expected.replacen(&from, &to, 1);
    }
    expected
}
