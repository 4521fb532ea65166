//! The recorded stream/non-stream pairs (the same request sent both ways to vLLM 0.32 at
//! temperature 0): replaying each recorded stream through its API's fold must give the recorded
//! non-streamed body byte for byte, but for the ids and timestamps of the other request; the
//! forced-tool pairs must be refused before sending (their answers differ).

mod common;

use common::{fixture, Fixture};
use serde_json::Value;
use tokenmeter::fold::{Api, Fold, Folded, Unfoldable};

/// The request of each pair, as `pairs/INDEX.txt` lists it (non-streamed form).
const PAIRS: &[(&str, &str, &str)] = &[
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

const FORCED_TOOL: &[&str] = &[
    "p03_chat_tool_named",
    "p09_messages_tool_any",
    "p12_responses_tool_required",
];

fn pair(name: &str) -> (Fixture, Fixture) {
    (
        fixture(&format!("agents/pairs/{name}.stream.http")),
        fixture(&format!("agents/pairs/{name}.nonstream.http")),
    )
}

/// The data of each SSE event of a recorded stream.
fn event_data(f: &Fixture) -> Vec<Vec<u8>> {
    let mut scanner = tokenmeter::sse::SseScanner::default();
    let mut out = Vec::new();
    scanner.feed(&f.body, |ev| out.push(ev.data.to_vec()));
    out
}

fn replay(fold: &mut dyn Fold, stream: &Fixture) -> Result<Folded, Unfoldable> {
    for data in event_data(stream) {
        fold.feed(&data)?;
    }
    fold.finish()
}

/// The values that differ between two requests: ids and creation times (top level, and the ids
/// of Responses output items), as (non-streamed, streamed) JSON texts.
fn request_specific(nonstream: &Value, completed: &Value) -> Vec<(String, String)> {
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

#[test]
fn every_pair_rebuilds_the_recorded_non_streamed_body_or_is_refused() {
    for (name, path, request) in PAIRS {
        let api = Api::from_path(path).unwrap();
        let (stream, nonstream) = pair(name);
        assert_eq!((stream.status(), nonstream.status()), (200, 200), "{name}");
        let upgraded = api.upgrade(request.as_bytes());
        if FORCED_TOOL.contains(name) {
            let Err(Unfoldable(why)) = upgraded else {
                panic!("{name}: a request with tools must pass through");
            };
            assert!(why.contains("tool"), "{name}: {why}");
            continue;
        }
        let up = upgraded
            .unwrap_or_else(|e| panic!("{name}: {e:?}"))
            .unwrap();
        let (body, mut fold) = (up.body, up.fold);
        let sent: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(sent["stream"], true, "{name}");
        let Folded::Answer(rebuilt) =
            replay(fold.as_mut(), &stream).unwrap_or_else(|e| panic!("{name}: {e:?}"))
        else {
            panic!("{name}: not an answer");
        };
        let rebuilt = String::from_utf8(rebuilt).unwrap();
        let recorded = String::from_utf8(nonstream.body.clone()).unwrap();
        // Byte for byte, once the other request's ids and times are swapped for the stream's.
        let got: Value =
            serde_json::from_str(&rebuilt).unwrap_or_else(|e| panic!("{name}: {e}\n{rebuilt}"));
        let want_ids: Value = serde_json::from_str(&recorded).unwrap();
        let mut expected = recorded.clone();
        for (from, to) in request_specific(&want_ids, &got) {
            assert!(expected.contains(&from), "{name}: {from}");
            expected = expected.replacen(&from, &to, 1);
        }
        assert_eq!(rebuilt, expected, "{name}");
        let declared = nonstream
            .headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .unwrap();
        assert_eq!(
            declared.1,
            recorded.len().to_string(),
            "{name}: the recording is whole"
        );
    }
}

#[test]
fn the_forced_tool_streams_would_not_fold_into_the_recorded_answers() {
    // Had the rule let them through, the folds would still have stopped at the tool call.
    let reqs = [
        (
            "p03_chat_tool_named",
            Api::Chat,
            r#"{"model":"tiny-llama","messages":[],"max_tokens":40}"#,
        ),
        (
            "p09_messages_tool_any",
            Api::Messages,
            r#"{"model":"tiny-llama","messages":[],"max_tokens":40}"#,
        ),
        (
            "p12_responses_tool_required",
            Api::Responses,
            r#"{"model":"tiny-llama","input":"x"}"#,
        ),
    ];
    for (name, api, req) in reqs {
        let (stream, _) = pair(name);
        let mut fold = api.upgrade(req.as_bytes()).unwrap().unwrap().fold;
        let err = replay(fold.as_mut(), &stream).unwrap_err();
        assert!(
            err.0.contains("tool") || err.0.contains("non-text") || err.0.contains("other than"),
            "{name}: {err:?}"
        );
    }
}

#[test]
fn every_recorded_pair_is_covered() {
    let dir = common::fixture_path("agents/pairs");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".nonstream.http").map(str::to_string))
        .collect();
    names.sort();
    let listed: Vec<String> = PAIRS.iter().map(|p| p.0.to_string()).collect();
    assert_eq!(names, listed);
}
