//! OpenAI chat completions (`/v1/chat/completions`): `data: {json}` events ending with
//! `data: [DONE]`, read by the skimmer in [`crate::openai`] (the fast path for vLLM's events).

use super::{
    Api, ApiSpec, ClientShape, Dialect, EventSummary, KeyHeader, PromptField, StreamReader,
    StreamUsage,
};
use crate::fold::{AsStream, Unfoldable};
use crate::openai::EventMemo;

/// An OpenAI-style API. Chat completions and text completions read the same events and bodies
/// (through [`openai_event`]); they differ only in their path, their [`Api`] and their fold.
pub struct OpenAiStyle {
    api: Api,
    path_suffix: &'static str,
    as_stream: fn(&[u8]) -> Result<Option<AsStream>, Unfoldable>,
}

impl OpenAiStyle {
    /// The reader of `api`, for paths ending in `path_suffix`, folding with `as_stream`.
    pub(super) const fn new(
        api: Api,
        path_suffix: &'static str,
        as_stream: fn(&[u8]) -> Result<Option<AsStream>, Unfoldable>,
    ) -> Self {
        OpenAiStyle {
            api,
            path_suffix,
            as_stream,
        }
    }
}

/// The chat completions reader.
pub const CHAT: OpenAiStyle =
    OpenAiStyle::new(Api::Chat, "/chat/completions", crate::fold::chat::as_stream);

/// Chat completions' facts.
pub const SPEC: ApiSpec = ApiSpec {
    api: Api::Chat,
    name: "chat",
    path: "/v1/chat/completions",
    otel_operation: "chat",
    dialect: &CHAT,
    client: ClientShape {
        prompt: PromptField::UserMessage,
        max_tokens: "max_tokens",
        user: &["user"],
        key: KeyHeader::Bearer,
    },
    error_shape: crate::error::ErrorShape::OpenAi,
};

impl Dialect for OpenAiStyle {
    fn api(&self) -> Api {
        self.api
    }

    fn matches(&self, path: &str) -> bool {
        path.ends_with(self.path_suffix)
    }

    fn stream_usage(&self) -> StreamUsage {
        StreamUsage::IncludeUsageOption
    }

    #[inline]
    fn event<'a>(&self, data: &'a [u8]) -> Option<EventSummary<'a>> {
        openai_event(data)
    }

    fn stream_reader(&self) -> Box<dyn StreamReader> {
        Box::new(OpenAiStream::default())
    }

    fn body<'a>(&self, body: &'a [u8]) -> Option<EventSummary<'a>> {
        openai_body(body)
    }

    fn as_stream(&self, body: &[u8]) -> Result<Option<AsStream>, Unfoldable> {
        (self.as_stream)(body)
    }
}

/// One OpenAI-style stream's reader: the skimmer's memo of what the stream's earlier events
/// repeat ([`EventMemo`]), so it reads only what changes.
#[derive(Debug, Default)]
pub struct OpenAiStream {
    memo: EventMemo,
}

impl StreamReader for OpenAiStream {
    #[inline]
    fn next_event<'a>(&mut self, data: &'a [u8]) -> Option<EventSummary<'a>> {
        if data == b"[DONE]" {
            return Some(done());
        }
        crate::openai::summarize_in_stream(data, &mut self.memo).map(from_summary)
    }
}

/// One event of an OpenAI-style stream (chat and completions share the shape).
#[inline]
pub(super) fn openai_event(data: &[u8]) -> Option<EventSummary<'_>> {
    if data == b"[DONE]" {
        return Some(done());
    }
    crate::openai::summarize(data).map(from_summary)
}

/// `data: [DONE]`.
fn done() -> EventSummary<'static> {
    EventSummary {
        end: true,
        ..EventSummary::default()
    }
}

#[inline]
fn from_summary(s: crate::openai::Summary<'_>) -> EventSummary<'_> {
    EventSummary {
        output: s.content_choices,
        choices: s.choices,
        usage_only: s.choices == 0 && s.usage.is_some() && !s.is_error,
        usage: s.usage.map(tokens),
        finish_reason: s.finish_reason,
        error: s.is_error,
        end: false,
        server_timings: s.server_timings,
    }
}

/// A whole non-streamed OpenAI-style body.
pub(super) fn openai_body(body: &[u8]) -> Option<EventSummary<'_>> {
    let mut s = openai_event(body)?;
    s.usage_only = false;
    s.end = true;
    Some(s)
}

fn tokens(u: crate::openai::Usage) -> super::TokenUsage {
    super::TokenUsage {
        input: u.prompt_tokens,
        output: u.completion_tokens,
        cached_input: u.cached_tokens,
        reasoning: u.reasoning_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_event_is_not_output_but_has_choices() {
        let s = CHAT
            .event(br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#)
            .unwrap();
        assert_eq!((s.output, s.choices, s.end), (0, 1, false));
        let tool = CHAT
            .event(br#"{"choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":{"name":"read_file"}}]},"finish_reason":null}]}"#)
            .unwrap();
        assert_eq!(tool.output, 1);
    }

    #[test]
    fn done_ends_and_usage_event_is_usage_only() {
        assert!(CHAT.event(b"[DONE]").unwrap().end);
        let u = CHAT
            .event(br#"{"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":40,"prompt_tokens_details":{"cached_tokens":8}}}"#)
            .unwrap();
        assert!(u.usage_only && !u.end);
        assert_eq!(
            u.usage.unwrap(),
            super::super::TokenUsage {
                input: Some(11),
                output: Some(40),
                cached_input: Some(8),
                reasoning: None
            }
        );
    }
}
