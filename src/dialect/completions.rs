//! OpenAI text completions (`/v1/completions`): the chat stream's framing, `text` in place of a
//! delta.

use super::chat::{openai_body, openai_event};
use super::{Api, Dialect, EventSummary, StreamUsage};

/// The text completions reader.
pub struct Completions;

impl Dialect for Completions {
    fn api(&self) -> Api {
        Api::Completions
    }

    fn matches(&self, path: &str) -> bool {
        path.ends_with("/v1/completions")
    }

    fn stream_usage(&self) -> StreamUsage {
        StreamUsage::IncludeUsageOption
    }

    #[inline]
    fn event<'a>(&self, data: &'a [u8]) -> Option<EventSummary<'a>> {
        openai_event(data)
    }

    fn body<'a>(&self, body: &'a [u8]) -> Option<EventSummary<'a>> {
        openai_body(body)
    }

    fn upgrade(
        &self,
        body: &[u8],
    ) -> Result<Option<crate::fold::Upgrade>, crate::fold::Unfoldable> {
        crate::fold::completions::upgrade(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_output() {
        let s = Completions
            .event(br#"{"choices":[{"index":0,"text":" hi","finish_reason":"length"}]}"#)
            .unwrap();
        assert_eq!((s.output, s.choices), (1, 1));
        assert_eq!(s.finish_reason.as_deref(), Some("length"));
        let body = Completions
            .body(br#"{"choices":[{"index":0,"text":"x","finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":1}}"#)
            .unwrap();
        assert!(body.end && !body.usage_only);
        assert_eq!(body.usage.unwrap().output, Some(1));
    }
}
