//! OpenAI Responses (`/v1/responses`): `event: <type>` + `data: {json}` pairs whose data repeats
//! the type in its `type` member (read from there, so the SSE scanner need not keep event names),
//! no `[DONE]`; usage arrives unasked in the final `response.*` event.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    carries, Api, ApiSpec, ClientShape, Dialect, EventSummary, KeyHeader, PromptField,
    StreamReader, StreamUsage, TokenUsage,
};

/// The Responses reader.
pub struct Responses;

/// The Responses API's facts.
pub const SPEC: ApiSpec = ApiSpec {
    api: Api::Responses,
    name: "responses",
    path: "/v1/responses",
    otel_operation: "chat",
    dialect: &Responses,
    client: ClientShape {
        prompt: PromptField::Text("input"),
        max_tokens: "max_output_tokens",
        user: &["user"],
        key: KeyHeader::Bearer,
    },
    error_shape: crate::error::ErrorShape::OpenAi,
};

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    response: Option<Response<'a>>,
    #[serde(default, borrow)]
    item: Option<Item<'a>>,
}

/// An output item, as `response.output_item.added` announces it: only its type is read.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Cow<'a, str>>,
}

impl Item<'_> {
    /// A tool call's item (`function_call`, `custom_tool_call`, the built-in tools' `*_call`):
    /// its start is generated output (the model chose the tool), even when no argument delta
    /// follows. A `message` or `reasoning` item starts empty: its deltas are the output.
    fn is_tool_call(&self) -> bool {
        self.kind.as_deref().is_some_and(|k| k.ends_with("_call"))
    }
}

/// The response object: in `response.completed` and its siblings, or a whole non-streamed body.
#[derive(Deserialize)]
struct Response<'a> {
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    incomplete_details: Option<Incomplete<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, borrow)]
    output: Option<&'a RawValue>,
    #[serde(default)]
    error: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct Incomplete<'a> {
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl From<Usage> for TokenUsage {
    fn from(u: Usage) -> Self {
        TokenUsage {
            input: u.input_tokens,
            output: u.output_tokens,
            cached_input: u.input_tokens_details.and_then(|d| d.cached_tokens),
            reasoning: u.output_tokens_details.and_then(|d| d.reasoning_tokens),
        }
    }
}

impl<'a> Response<'a> {
    /// `incomplete_details.reason` when the response stopped early, else its `status`.
    fn finish(&mut self) -> Option<Cow<'a, str>> {
        self.incomplete_details
            .take()
            .and_then(|d| d.reason)
            .or_else(|| self.status.take())
    }
}

/// Its events say all they mean on their own: a stream's reader keeps nothing.
impl StreamReader for Responses {
    fn next_event<'a>(&mut self, data: &'a [u8]) -> Option<EventSummary<'a>> {
        self.event(data)
    }
}

impl Dialect for Responses {
    fn api(&self) -> Api {
        Api::Responses
    }

    fn matches(&self, path: &str) -> bool {
        path.ends_with("/v1/responses")
    }

    fn stream_usage(&self) -> StreamUsage {
        StreamUsage::Always
    }

    fn stream_reader(&self) -> Box<dyn StreamReader> {
        Box::new(Responses)
    }

    fn event<'a>(&self, data: &'a [u8]) -> Option<EventSummary<'a>> {
        let ev: Event<'a> = serde_json::from_slice(data).ok()?;
        let mut s = EventSummary::default();
        match ev.kind.as_ref() {
            // The terminal events; `response.incomplete` counts as an error, as `failed` does.
            "response.completed" | "response.failed" | "response.incomplete" => {
                s.end = true;
                s.error = ev.kind != "response.completed";
                if let Some(mut r) = ev.response {
                    s.error |= r.error.is_some() && ev.kind != "response.completed";
                    s.usage = r.usage.take().map(TokenUsage::from);
                    s.finish_reason = r.finish();
                }
            }
            "error" => {
                s.error = true;
                s.end = true;
            }
            // A tool call's start is output (vLLM may send no argument delta after it).
            "response.output_item.added" => {
                s.output = ev.item.is_some_and(|i| i.is_tool_call()) as u32;
            }
            // `response.created`, `in_progress`, a message's `output_item.added`,
            // `content_part.added`, the `.done` events: bookkeeping, no new output.
            // Every `response.*.delta` event (text, reasoning, refusal, tool-call arguments) has
            // its payload in `delta`.
            kind if kind.ends_with(".delta") => s.output = carries(ev.delta) as u32,
            _ => {}
        }
        Some(s)
    }

    fn body<'a>(&self, body: &'a [u8]) -> Option<EventSummary<'a>> {
        let mut r: Response<'a> = serde_json::from_slice(body).ok()?;
        let output = r
            .output
            .is_some_and(|o| o.get() != "[]" && o.get() != "null");
        Some(EventSummary {
            output: output as u32,
            usage: r.usage.take().map(TokenUsage::from),
            error: r.error.is_some(),
            finish_reason: r.finish(),
            end: true,
            ..EventSummary::default()
        })
    }

    fn as_stream(
        &self,
        body: &[u8],
    ) -> Result<Option<crate::fold::AsStream>, crate::fold::Unfoldable> {
        crate::fold::responses::as_stream(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(name: &str) -> Vec<String> {
        let raw = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/vllm/agents")
                .join(name),
        )
        .unwrap();
        raw.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn recorded_text_stream() {
        let evs = events("r02_responses_stream.http");
        let sums: Vec<_> = evs
            .iter()
            .map(|e| Responses.event(e.as_bytes()).unwrap())
            .collect();
        let outputs: Vec<u32> = sums.iter().map(|s| s.output).collect();
        // created, in_progress, output_item.added, content_part.added, 2 deltas, 3 .done, completed
        assert_eq!(outputs, [0, 0, 0, 0, 1, 1, 0, 0, 0, 0]);
        let last = sums.last().unwrap();
        assert!(last.end && !last.error);
        assert_eq!(
            last.usage,
            Some(TokenUsage {
                input: Some(12),
                output: Some(8),
                cached_input: Some(0),
                reasoning: Some(0)
            })
        );
        assert_eq!(last.finish_reason.as_deref(), Some("max_output_tokens"));
        assert!(sums[..sums.len() - 1]
            .iter()
            .all(|s| !s.end && s.usage.is_none()));
    }

    #[test]
    fn recorded_tool_stream_and_body() {
        let evs = events("r04_responses_stream_tool_required.http");
        let out: u32 = evs
            .iter()
            .map(|e| Responses.event(e.as_bytes()).unwrap().output)
            .sum();
        assert_eq!(
            out, 18,
            "the function_call item's start and one per function_call_arguments.delta"
        );
        let raw = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/vllm/agents/r05_responses_nonstream_tool_required.http"),
        )
        .unwrap();
        let body = raw.split("\r\n\r\n").nth(1).unwrap();
        let s = Responses.body(body.as_bytes()).unwrap();
        assert_eq!((s.output, s.end, s.error), (1, true, false));
        assert_eq!(s.usage.unwrap().input, Some(11));
        assert_eq!(s.usage.unwrap().output, Some(40));
    }

    #[test]
    fn recorded_tool_only_stream() {
        // The function_call item's start is the only output; the arguments arrive empty.
        let evs = events("toolonly/t02_responses_stream_required_tool_empty_args.http");
        let sums: Vec<_> = evs
            .iter()
            .map(|e| Responses.event(e.as_bytes()).unwrap())
            .collect();
        let outputs: Vec<u32> = sums.iter().map(|s| s.output).collect();
        // created, in_progress, output_item.added, arguments.done, output_item.done, completed
        assert_eq!(outputs, [0, 0, 1, 0, 0, 0]);
        assert_eq!(sums[5].usage.unwrap().output, Some(24));
        let message_start = Responses
            .event(
                br#"{"type":"response.output_item.added","item":{"type":"message","content":[]}}"#,
            )
            .unwrap();
        assert_eq!(message_start.output, 0);
    }

    #[test]
    fn errors_and_empty_deltas() {
        let f = Responses
            .event(br#"{"type":"response.failed","response":{"status":"failed","error":{"code":"server_error","message":"x"},"usage":null}}"#)
            .unwrap();
        assert!(f.end && f.error);
        let e = Responses
            .event(br#"{"type":"error","code":"x","message":"boom","sequence_number":3}"#)
            .unwrap();
        assert!(e.end && e.error);
        let i = Responses
            .event(br#"{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":3,"output_tokens":2}}}"#)
            .unwrap();
        assert!(i.end && i.error);
        assert_eq!(i.usage.unwrap().output, Some(2));
        let empty = Responses
            .event(br#"{"type":"response.output_text.delta","delta":""}"#)
            .unwrap();
        assert_eq!(empty.output, 0);
        let reasoning = Responses
            .event(br#"{"type":"response.reasoning_text.delta","delta":"hm"}"#)
            .unwrap();
        assert_eq!(reasoning.output, 1);
        assert!(Responses.event(b"[DONE]").is_none());
        let err_body = Responses
            .body(br#"{"error":{"message":"nope","type":"NotFoundError","code":404}}"#)
            .unwrap();
        assert!(err_body.error);
    }
}
