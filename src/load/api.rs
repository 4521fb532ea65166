//! A load run speaking each generation API (`--api`) from the API's own facts
//! ([`crate::dialect::ApiSpec`]: the route, where a request puts its prompt, limit and user, how
//! its clients send their key), and reading the answers with the proxy's own dialect layer
//! ([`crate::dialect`]), so load and the proxy read every API alike. Nothing here is per API.
//!
//! Per API, what load takes from it (see [`read_event`]):
//!
//! | API | TTFT event | usage |
//! |---|---|---|
//! | chat, completions | first event with non-empty `choices` (as `vllm bench serve`) | the final `usage` (`stream_options.include_usage` is sent) |
//! | responses | first event with generated output (`response.output_text.delta`, reasoning or function-call argument deltas) | `response.completed`'s `response.usage` |
//! | messages | first `content_block_delta` with output | `message_start`'s `input_tokens`, the last `message_delta`'s `output_tokens` |

pub use crate::dialect::Api;
use crate::dialect::{KeyHeader, PromptField, StreamUsage};

use super::event::{error_text, Usage};

/// `--api`'s parser: an API by its name.
pub fn parse_api(s: &str) -> Result<Api, String> {
    Api::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Api::ALL.iter().map(|a| a.as_str()).collect();
        format!("unknown API {s:?}: {} (or mix)", names.join(", "))
    })
}

/// The agents' mix of `--api mix`: a team whose agents differ (a chat client, a Codex-style
/// Responses agent, a Claude-Code-style Messages agent, a completions tool).
pub const MIX: [Api; 4] = [Api::Chat, Api::Responses, Api::Messages, Api::Completions];

/// The APIs of `--api`: one, several, each in turn (agent i speaks the (i mod n)-th).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiList(pub Vec<Api>);

/// `--api`'s parser: a name, a comma-separated list of names, or `mix` ([`MIX`]).
pub fn parse_api_list(s: &str) -> Result<ApiList, String> {
    if s == "mix" {
        return Ok(ApiList(MIX.to_vec()));
    }
    let apis = s
        .split(',')
        .map(|n| parse_api(n.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ApiList(apis))
}

/// The route requests of `api` go to.
pub fn path(api: Api) -> &'static str {
    api.path()
}

/// How clients of `api` send their key.
pub fn key_header(api: Api) -> KeyHeader {
    api.spec().client.key
}

/// The JSON body of one request: `prompt` where the API takes it, the output limit under the
/// API's name, streamed or not. Streams of an API that gives usage only when asked ask for it.
pub fn body(
    api: Api,
    model: &str,
    prompt: &str,
    max_tokens: u32,
    stream: bool,
    ignore_eos: bool,
    user: Option<&str>,
) -> Vec<u8> {
    let shape = api.spec().client;
    let mut body = serde_json::json!({ "model": model });
    match shape.prompt {
        PromptField::UserMessage => {
            body["messages"] = serde_json::json!([{"role": "user", "content": prompt}]);
        }
        PromptField::Text(member) => body[member] = serde_json::Value::from(prompt),
    }
    body[shape.max_tokens] = serde_json::Value::from(max_tokens);
    body["stream"] = serde_json::Value::Bool(stream);
    if stream && api.dialect().stream_usage() == StreamUsage::IncludeUsageOption {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    if let (Some(u), Some((last, parents))) = (user, shape.user.split_last()) {
        let mut at = &mut body;
        for p in parents {
            at = &mut at[*p];
        }
        at[*last] = serde_json::Value::from(u);
    }
    if ignore_eos {
        body["ignore_eos"] = serde_json::Value::Bool(true);
    }
    serde_json::to_vec(&body).unwrap_or_default()
}

/// What one streamed event says, in any API.
#[derive(Debug, Default, PartialEq)]
pub struct EventRead {
    /// This event starts TTFT (see the module table).
    pub ttft: bool,
    /// Pieces of generated output in it.
    pub output: u32,
    /// Prompt tokens it reports.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens it reports (cumulative where the API sends them so).
    pub completion_tokens: Option<u64>,
    /// The message of an error it carries.
    pub error: Option<String>,
}

impl EventRead {
    /// Its tokens as a usage update of `usage` (fields it does not report are kept).
    pub fn merge_into(&self, usage: &mut Option<Usage>) {
        if self.prompt_tokens.is_none() && self.completion_tokens.is_none() {
            return;
        }
        let u = usage.get_or_insert_with(Usage::default);
        if self.prompt_tokens.is_some() {
            u.prompt_tokens = self.prompt_tokens;
        }
        if self.completion_tokens.is_some() {
            u.completion_tokens = self.completion_tokens;
        }
    }
}

/// Reads one event's `data` payload of an `api` stream.
pub fn read_event(api: Api, data: &[u8]) -> EventRead {
    let data = data.trim_ascii();
    let Some(s) = api.dialect().event(data) else {
        return EventRead::default();
    };
    EventRead {
        // `choices` is counted by the OpenAI-style APIs only, where output implies it.
        ttft: s.choices > 0 || s.output > 0,
        output: s.output,
        prompt_tokens: s.usage.and_then(|u| u.input),
        completion_tokens: s.usage.and_then(|u| u.output),
        error: s.error.then(|| error_message(data)),
    }
}

/// The message of an error event (rare: the tree is built only here): chat's and Anthropic's
/// `error.message`, a Responses `error` event's `message`, `response.failed`'s
/// `response.error.message`.
fn error_message(data: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
    match v.get("response").map(|r| &r["error"]) {
        Some(e) if !e.is_null() => error_text(e),
        _ => error_text(&v),
    }
}

/// The usage of a non-streamed `api` answer.
pub fn body_usage(api: Api, body: &[u8]) -> Option<Usage> {
    let u = api.dialect().body(body)?.usage?;
    Some(Usage {
        prompt_tokens: u.input,
        completion_tokens: u.output,
        ..Usage::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_events() {
        let created = br#"{"response":{"id":"r","usage":null},"sequence_number":0,"type":"response.created"}"#;
        assert_eq!(read_event(Api::Responses, created), EventRead::default());
        let delta = br#"{"content_index":0,"delta":"x","sequence_number":4,"type":"response.output_text.delta"}"#;
        let r = read_event(Api::Responses, delta);
        assert!(r.ttft && r.output == 1);
        let done = br#"{"response":{"usage":{"input_tokens":12,"output_tokens":8,"total_tokens":20}},"type":"response.completed"}"#;
        let r = read_event(Api::Responses, done);
        assert_eq!((r.prompt_tokens, r.completion_tokens), (Some(12), Some(8)));
        let failed = br#"{"type":"error","code":"x","message":"boom","sequence_number":3}"#;
        assert_eq!(
            read_event(Api::Responses, failed).error.as_deref(),
            Some("boom")
        );
        let failed = br#"{"type":"response.failed","response":{"status":"failed","error":{"code":"c","message":"gone"}}}"#;
        assert_eq!(
            read_event(Api::Responses, failed).error.as_deref(),
            Some("gone")
        );
    }

    #[test]
    fn messages_events_merge_into_usage() {
        let mut usage = None;
        let start = br#"{"type":"message_start","message":{"usage":{"input_tokens":12,"output_tokens":0}}}"#;
        read_event(Api::Messages, start).merge_into(&mut usage);
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: Some(12),
                ..Usage::default()
            })
        );
        let block = br#"{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}"#;
        assert!(!read_event(Api::Messages, block).ttft);
        let delta =
            br#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"a"},"index":0}"#;
        assert!(read_event(Api::Messages, delta).ttft);
        let end = br#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":12,"output_tokens":8}}"#;
        read_event(Api::Messages, end).merge_into(&mut usage);
        assert_eq!(usage.unwrap().completion_tokens, Some(8));
        let err = br#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#;
        assert_eq!(
            read_event(Api::Messages, err).error.as_deref(),
            Some("busy")
        );
    }

    #[test]
    fn chat_role_event_starts_ttft_without_output() {
        let role = br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        let r = read_event(Api::Chat, role);
        assert!(r.ttft && r.output == 0);
        let err = br#"{"error":{"message":"boom","type":"x"}}"#;
        assert_eq!(read_event(Api::Chat, err).error.as_deref(), Some("boom"));
    }

    #[test]
    fn bodies_name_the_limit_per_api() {
        let v = |api: Api| -> serde_json::Value {
            serde_json::from_slice(&body(api, "m", "p", 7, true, false, Some("u"))).unwrap()
        };
        assert_eq!(v(Api::Chat)["stream_options"]["include_usage"], true);
        assert_eq!(v(Api::Responses)["max_output_tokens"], 7);
        assert!(v(Api::Responses).get("stream_options").is_none());
        assert_eq!(v(Api::Messages)["max_tokens"], 7);
        assert_eq!(v(Api::Messages)["metadata"]["user_id"], "u");
        assert_eq!(v(Api::Completions)["prompt"], "p");
        assert_eq!(parse_api("messages"), Ok(Api::Messages));
        assert!(parse_api("grpc").is_err());
    }

    #[test]
    fn non_streamed_usage_per_api() {
        let b = br#"{"id":"x","type":"message","content":[{"type":"text","text":"a"}],"usage":{"input_tokens":3,"output_tokens":4}}"#;
        assert_eq!(
            body_usage(Api::Messages, b),
            Some(Usage {
                prompt_tokens: Some(3),
                completion_tokens: Some(4),
                ..Usage::default()
            })
        );
        let c = br#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        assert_eq!(body_usage(Api::Chat, c).unwrap().completion_tokens, Some(4));
    }
}
