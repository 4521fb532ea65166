//! Anthropic Messages (`/v1/messages`): `event: <type>` + `data: {json}` pairs whose data repeats
//! the type in `type`, ending with `message_stop`; usage arrives unasked, the input in
//! `message_start`, the cumulative output in `message_delta` (the last one counts).

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    carries, Api, ApiSpec, ClientShape, Dialect, EventSummary, KeyHeader, PromptField,
    StreamReader, StreamUsage, TokenUsage,
};

/// The Messages reader.
pub struct Messages;

/// The Messages API's facts. Anthropic clients send their key as `x-api-key` with an
/// `anthropic-version`, and name the end user in `metadata.user_id`.
pub const SPEC: ApiSpec = ApiSpec {
    api: Api::Messages,
    name: "messages",
    path: "/v1/messages",
    otel_operation: "chat",
    dialect: &Messages,
    client: ClientShape {
        prompt: PromptField::UserMessage,
        max_tokens: "max_tokens",
        user: &["metadata", "user_id"],
        key: KeyHeader::XApiKey {
            version: "2023-06-01",
        },
    },
    error_shape: crate::error::ErrorShape::Messages,
};

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    message: Option<Message<'a>>,
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, borrow)]
    content_block: Option<Block<'a>>,
}

/// A content block, as `content_block_start` opens it: only its type is read.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
}

/// The message object: in `message_start`, or a whole non-streamed body.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    text: Option<&'a RawValue>,
    #[serde(default, borrow)]
    partial_json: Option<&'a RawValue>,
    #[serde(default, borrow)]
    thinking: Option<&'a RawValue>,
    #[serde(default, borrow)]
    stop_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

impl From<Usage> for TokenUsage {
    /// Anthropic's `input_tokens` leaves out the cached part: the prompt is all three together.
    fn from(u: Usage) -> Self {
        let cached = u.cache_read_input_tokens;
        TokenUsage {
            input: u.input_tokens.map(|i| {
                i.saturating_add(cached.unwrap_or(0))
                    .saturating_add(u.cache_creation_input_tokens.unwrap_or(0))
            }),
            output: u.output_tokens,
            cached_input: cached,
            reasoning: None,
        }
    }
}

/// Its events say all they mean on their own: a stream's reader keeps nothing.
impl StreamReader for Messages {
    fn next_event<'a>(&mut self, data: &'a [u8]) -> Option<EventSummary<'a>> {
        self.event(data)
    }
}

impl Dialect for Messages {
    fn api(&self) -> Api {
        Api::Messages
    }

    fn matches(&self, path: &str) -> bool {
        path.ends_with("/v1/messages")
    }

    fn stream_usage(&self) -> StreamUsage {
        StreamUsage::Always
    }

    fn stream_reader(&self) -> Box<dyn StreamReader> {
        Box::new(Messages)
    }

    fn event<'a>(&self, data: &'a [u8]) -> Option<EventSummary<'a>> {
        let ev: Event<'a> = serde_json::from_slice(data).ok()?;
        let mut s = EventSummary::default();
        match ev.kind.as_ref() {
            "content_block_delta" => {
                s.output = ev.delta.is_some_and(|d| {
                    carries(d.text) || carries(d.partial_json) || carries(d.thinking)
                }) as u32;
            }
            "message_start" => {
                // `output_tokens` here is the count so far (0 or 1), not a total: input only.
                s.usage = ev.message.and_then(|m| m.usage).map(|u| TokenUsage {
                    output: None,
                    ..TokenUsage::from(u)
                });
            }
            "message_delta" => {
                s.usage = ev.usage.map(TokenUsage::from);
                s.finish_reason = ev.delta.and_then(|d| d.stop_reason);
            }
            "message_stop" => s.end = true,
            // Anthropic ends a stream with an error event; nothing follows it.
            "error" => {
                s.error = true;
                s.end = true;
            }
            // A tool call's start is output: the model chose the tool and named it (vLLM may
            // send no `input_json_delta` after it). A text or thinking block starts empty.
            "content_block_start" => {
                s.output = ev.content_block.is_some_and(|b| {
                    matches!(b.kind.as_deref(), Some("tool_use" | "server_tool_use"))
                }) as u32;
            }
            // `content_block_stop`, `ping`.
            _ => {}
        }
        Some(s)
    }

    fn body<'a>(&self, body: &'a [u8]) -> Option<EventSummary<'a>> {
        let ev: Event<'a> = serde_json::from_slice(body).ok()?;
        if ev.kind == "error" {
            return Some(EventSummary {
                error: true,
                end: true,
                ..EventSummary::default()
            });
        }
        // A non-streamed message has the message's members at the top level.
        let m: Message<'a> = serde_json::from_slice(body).ok()?;
        let output = m
            .content
            .is_some_and(|c| c.get() != "[]" && c.get() != "null");
        Some(EventSummary {
            output: output as u32,
            usage: m.usage.map(TokenUsage::from),
            finish_reason: m.stop_reason,
            end: true,
            ..EventSummary::default()
        })
    }

    fn as_stream(
        &self,
        body: &[u8],
    ) -> Result<Option<crate::fold::AsStream>, crate::fold::Unfoldable> {
        crate::fold::messages::as_stream(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/vllm/agents")
                .join(name),
        )
        .unwrap()
    }

    fn summaries(name: &str) -> Vec<EventSummary<'static>> {
        let text: &'static str = Box::leak(fixture(name).into_boxed_str());
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| Messages.event(d.as_bytes()).unwrap())
            .collect()
    }

    #[test]
    fn recorded_text_stream() {
        let s = summaries("m02_messages_stream.http");
        let outputs: Vec<u32> = s.iter().map(|s| s.output).collect();
        assert_eq!(outputs, [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]);
        assert_eq!(s[0].usage.unwrap().input, Some(12));
        assert_eq!(s[0].usage.unwrap().output, None);
        let delta = &s[s.len() - 2];
        assert_eq!(delta.usage.unwrap().output, Some(8));
        assert_eq!(delta.finish_reason.as_deref(), Some("max_tokens"));
        assert!(s.last().unwrap().end);
        assert!(s[..s.len() - 1].iter().all(|s| !s.end));
    }

    #[test]
    fn recorded_tool_stream_and_bodies() {
        let s = summaries("m04_messages_stream_tool_any.http");
        assert_eq!(
            s[1].output, 1,
            "content_block_start opening the tool_use block"
        );
        assert!(s.iter().map(|s| s.output).sum::<u32>() > 0);
        let raw = fixture("m05_messages_nonstream_tool_any.http");
        let body = raw.split("\r\n\r\n").nth(1).unwrap();
        let b = Messages.body(body.as_bytes()).unwrap();
        assert_eq!((b.output, b.end, b.error), (1, true, false));
        assert_eq!(b.usage.unwrap().input, Some(11));
        assert_eq!(b.usage.unwrap().output, Some(40));
        assert_eq!(b.finish_reason.as_deref(), Some("max_tokens"));
        let raw = fixture("m07_messages_unknown_model.http");
        let body = raw.split("\r\n\r\n").nth(1).unwrap();
        assert!(Messages.body(body.as_bytes()).unwrap().error);
    }

    #[test]
    fn recorded_tool_only_streams() {
        // The tool_use block's start is the stream's only output.
        let s = summaries("toolonly/t04_messages_stream_any_tool_use_no_input_delta.http");
        let outputs: Vec<u32> = s.iter().map(|s| s.output).collect();
        assert_eq!(outputs, [0, 1, 0, 0, 0]);
        // No content block at all: no output event; the end is `message_delta`'s stop reason
        // and usage (24 tokens), then `message_stop`.
        let s = summaries("toolonly/t03_messages_stream_any_tool_no_block.http");
        assert!(s.iter().all(|s| s.output == 0));
        assert_eq!(s[1].usage.unwrap().output, Some(24));
        assert!(s[1].finish_reason.is_some() && s[2].end);
        let text_start = Messages
            .event(br#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#)
            .unwrap();
        assert_eq!(text_start.output, 0);
    }

    #[test]
    fn cache_counts_and_errors() {
        let start = Messages
            .event(br#"{"type":"message_start","message":{"usage":{"input_tokens":5,"cache_read_input_tokens":100,"cache_creation_input_tokens":7,"output_tokens":1}}}"#)
            .unwrap();
        let u = start.usage.unwrap();
        assert_eq!(
            (u.input, u.cached_input, u.output),
            (Some(112), Some(100), None)
        );
        let e = Messages
            .event(
                br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            )
            .unwrap();
        assert!(e.error && e.end);
        let ping = Messages.event(br#"{"type": "ping"}"#).unwrap();
        assert_eq!(ping, EventSummary::default());
        let empty_json = Messages
            .event(br#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}"#)
            .unwrap();
        assert_eq!(empty_json.output, 0);
        let thinking = Messages
            .event(br#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#)
            .unwrap();
        assert_eq!(thinking.output, 1);
    }
}
