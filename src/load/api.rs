//! The generation API a load run speaks (`--api`): its route, its request body, how a client of it
//! sends its key, and how its answers say what was generated.
//!
//! Per API, what counts (see [`read_event`] and [`body_usage`]):
//!
//! | API | TTFT event | output events | usage |
//! |---|---|---|---|
//! | chat, completions | first event with non-empty `choices` (as `vllm bench serve`) | choices with text, reasoning or tool calls | the final `usage` (`stream_options.include_usage` is sent) |
//! | responses | first `response.output_text.delta`, `response.reasoning_text.delta` or `response.function_call_arguments.delta` | the same events | `response.completed`'s `response.usage` (`input_tokens`, `output_tokens`) |
//! | messages | first `content_block_delta` | the same events | `message_start`'s `message.usage.input_tokens`, the last `message_delta`'s `usage.output_tokens` |
//!
//! Errors inside a 200 stream: an `error` object (chat, completions), `error` / `response.failed`
//! events (Responses), an `error` event (Messages).

use serde::Deserialize;

use super::event::{error_text, parse_event, StreamEvent, Usage};

/// Which generation API a load run speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `POST /v1/chat/completions`.
    #[default]
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/responses` (OpenAI Responses API).
    Responses,
    /// `POST /v1/messages` (Anthropic Messages API).
    Messages,
}

impl Api {
    /// The route requests go to.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
        }
    }

    /// The name `--api` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Responses => "responses",
            Api::Messages => "messages",
        }
    }

    /// Anthropic clients send their key as `x-api-key` (with `anthropic-version`); the others as
    /// `Authorization: Bearer`.
    pub fn key_in_x_api_key(self) -> bool {
        self == Api::Messages
    }

    /// The JSON body of one request: one user message (or prompt) of `prompt`, the output limit
    /// under this API's name, streamed or not. Chat and completions streams ask for usage.
    pub fn body(
        self,
        model: &str,
        prompt: &str,
        max_tokens: u32,
        stream: bool,
        ignore_eos: bool,
        user: Option<&str>,
    ) -> Vec<u8> {
        let mut body = match self {
            Api::Chat => serde_json::json!({
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
            }),
            Api::Completions => serde_json::json!({
                "model": model, "prompt": prompt, "max_tokens": max_tokens,
            }),
            Api::Responses => serde_json::json!({
                "model": model, "input": prompt, "max_output_tokens": max_tokens,
            }),
            Api::Messages => serde_json::json!({
                "model": model,
                "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": prompt}],
            }),
        };
        body["stream"] = serde_json::Value::Bool(stream);
        if stream && matches!(self, Api::Chat | Api::Completions) {
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        if let Some(u) = user {
            // Anthropic's field for an end-user id is `metadata.user_id`.
            match self {
                Api::Messages => body["metadata"] = serde_json::json!({"user_id": u}),
                _ => body["user"] = serde_json::Value::from(u),
            }
        }
        if ignore_eos {
            body["ignore_eos"] = serde_json::Value::Bool(true);
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// What one streamed event says, in any API.
#[derive(Debug, Default, PartialEq)]
pub struct EventRead {
    /// This event starts TTFT (see the module table).
    pub ttft: bool,
    /// Output-carrying items in it (choices with output, or 1 for a delta event).
    pub output: u32,
    /// Prompt tokens it reports.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens it reports (cumulative where the API sends them so).
    pub completion_tokens: Option<u64>,
    /// An error it carries.
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

#[derive(Deserialize)]
struct TypedUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Holder {
    #[serde(default)]
    usage: Option<TypedUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// The fields of a Responses or Messages event that load reads; the rest is skipped.
#[derive(Deserialize)]
struct TypedEvent<'a> {
    #[serde(borrow, rename = "type")]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default)]
    response: Option<Holder>,
    /// Messages' `message` object (`message_start`), or a Responses `error` event's text.
    #[serde(default)]
    message: Option<serde_json::Value>,
    #[serde(default)]
    usage: Option<TypedUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// Reads one event's `data` payload of an `api` stream.
pub fn read_event(api: Api, data: &[u8]) -> EventRead {
    match api {
        Api::Chat | Api::Completions => match parse_event(data) {
            StreamEvent::Chunk {
                has_choices,
                content_choices,
                usage,
            } => EventRead {
                ttft: has_choices,
                output: content_choices,
                prompt_tokens: usage.and_then(|u| u.prompt_tokens),
                completion_tokens: usage.and_then(|u| u.completion_tokens),
                error: None,
            },
            StreamEvent::Error(e) => EventRead {
                error: Some(e),
                ..EventRead::default()
            },
            StreamEvent::Done | StreamEvent::Unparsable => EventRead::default(),
        },
        Api::Responses | Api::Messages => {
            let Ok(mut ev) = serde_json::from_slice::<TypedEvent<'_>>(data.trim_ascii()) else {
                return EventRead::default();
            };
            let mut r = EventRead::default();
            match ev.kind.as_ref() {
                "response.output_text.delta"
                | "response.reasoning_text.delta"
                | "response.function_call_arguments.delta"
                | "content_block_delta" => {
                    r.ttft = true;
                    r.output = 1;
                }
                "error" | "response.failed" => {
                    // `error` carries it; `response.failed` holds it in `response.error`.
                    let inner = ev.response.as_mut().and_then(|h| h.error.take());
                    let v = ev
                        .error
                        .take()
                        .or(inner)
                        .or_else(|| ev.message.take().filter(serde_json::Value::is_string))
                        .unwrap_or_else(|| serde_json::Value::from(ev.kind.as_ref()));
                    r.error = Some(error_text(&v));
                }
                _ => {}
            }
            let from_message =
                ev.message
                    .as_ref()
                    .and_then(|m| m.get("usage"))
                    .map(|u| TypedUsage {
                        input_tokens: u.get("input_tokens").and_then(serde_json::Value::as_u64),
                        output_tokens: u.get("output_tokens").and_then(serde_json::Value::as_u64),
                    });
            let usage = ev
                .response
                .and_then(|h| h.usage)
                .or(from_message)
                .or(ev.usage);
            if let Some(u) = usage {
                r.prompt_tokens = u.input_tokens;
                // message_start's output_tokens (0) is no count yet; message_delta's is.
                if ev.kind != "message_start" {
                    r.completion_tokens = u.output_tokens;
                }
            }
            r
        }
    }
}

/// The usage of a non-streamed `api` answer.
pub fn body_usage(api: Api, body: &serde_json::Value) -> Option<Usage> {
    let u = body.get("usage")?;
    match api {
        Api::Chat | Api::Completions => serde_json::from_value(u.clone()).ok(),
        Api::Responses | Api::Messages => Some(Usage {
            prompt_tokens: u.get("input_tokens").and_then(serde_json::Value::as_u64),
            completion_tokens: u.get("output_tokens").and_then(serde_json::Value::as_u64),
        }),
    }
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
        let failed =
            br#"{"type":"response.failed","response":{"error":{"code":"c","message":"gone"}}}"#;
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
                completion_tokens: None
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
    fn bodies_name_the_limit_per_api() {
        let v = |api: Api| -> serde_json::Value {
            serde_json::from_slice(&api.body("m", "p", 7, true, false, Some("u"))).unwrap()
        };
        assert_eq!(v(Api::Chat)["stream_options"]["include_usage"], true);
        assert_eq!(v(Api::Responses)["max_output_tokens"], 7);
        assert!(v(Api::Responses).get("stream_options").is_none());
        assert_eq!(v(Api::Messages)["max_tokens"], 7);
        assert_eq!(v(Api::Messages)["metadata"]["user_id"], "u");
        assert_eq!(v(Api::Completions)["prompt"], "p");
    }

    #[test]
    fn non_streamed_usage_per_api() {
        let b: serde_json::Value =
            serde_json::from_str(r#"{"usage":{"input_tokens":3,"output_tokens":4}}"#).unwrap();
        assert_eq!(
            body_usage(Api::Messages, &b),
            Some(Usage {
                prompt_tokens: Some(3),
                completion_tokens: Some(4)
            })
        );
        let c: serde_json::Value =
            serde_json::from_str(r#"{"usage":{"prompt_tokens":3,"completion_tokens":4}}"#).unwrap();
        assert_eq!(
            body_usage(Api::Chat, &c).unwrap().completion_tokens,
            Some(4)
        );
    }
}
