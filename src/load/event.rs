//! Reading one streamed chat-completion event, with the proxy's own summary parser
//! ([`crate::openai::summarize`]): whether `choices` is non-empty (TTFT), how many choices carry
//! output (the fallback token count), `usage`, and `error`.

pub use crate::openai::Usage;

/// What one `data:` payload says.
#[derive(Debug, PartialEq)]
pub enum StreamEvent {
    /// The `[DONE]` sentinel.
    Done,
    /// A chunk object.
    Chunk {
        /// `choices` holds at least one element.
        has_choices: bool,
        /// Choices that carry output (non-empty content, text, reasoning or tool calls).
        content_choices: u32,
        /// The chunk's `usage`, when present and not null.
        usage: Option<Usage>,
    },
    /// An `error` object sent inside the stream.
    Error(String),
    /// Not JSON of the expected shape.
    Unparsable,
}

/// Classifies one event payload.
pub fn parse_event(data: &[u8]) -> StreamEvent {
    let trimmed = data.trim_ascii();
    if trimmed == b"[DONE]" {
        return StreamEvent::Done;
    }
    match crate::openai::summarize(trimmed) {
        Some(s) if s.is_error => {
            // Rare: build the tree only to read the message.
            let v: serde_json::Value = serde_json::from_slice(trimmed).unwrap_or_default();
            StreamEvent::Error(error_text(&v))
        }
        Some(s) => StreamEvent::Chunk {
            has_choices: s.choices > 0,
            content_choices: s.content_choices,
            usage: s.usage,
        },
        None => StreamEvent::Unparsable,
    }
}

/// The message of an OpenAI-style error value (`{"message":..}`, `{"error":{..}}` or a string).
pub fn error_text(v: &serde_json::Value) -> String {
    let inner = v.get("error").unwrap_or(v);
    if let Some(m) = inner.get("message").and_then(|m| m.as_str()) {
        return m.to_owned();
    }
    if let Some(d) = inner.get("detail") {
        return d.as_str().map_or_else(|| d.to_string(), str::to_owned);
    }
    inner
        .as_str()
        .map_or_else(|| inner.to_string(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_event_has_choices_but_no_content() {
        let e = br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        assert_eq!(
            parse_event(e),
            StreamEvent::Chunk {
                has_choices: true,
                content_choices: 0,
                usage: None
            }
        );
    }

    #[test]
    fn escaped_content_counts_as_content() {
        let e = br#"{"choices":[{"delta":{"content":"\n"},"finish_reason":null}]}"#;
        assert_eq!(
            parse_event(e),
            StreamEvent::Chunk {
                has_choices: true,
                content_choices: 1,
                usage: None
            }
        );
    }

    #[test]
    fn usage_event_has_no_choices() {
        let e = br#"{"choices":[],"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5}}"#;
        let want = Usage {
            prompt_tokens: Some(12),
            completion_tokens: Some(5),
            ..Usage::default()
        };
        assert_eq!(
            parse_event(e),
            StreamEvent::Chunk {
                has_choices: false,
                content_choices: 0,
                usage: Some(want)
            }
        );
    }

    #[test]
    fn done_error_and_garbage() {
        assert_eq!(parse_event(b" [DONE] "), StreamEvent::Done);
        let err = br#"{"error":{"message":"boom","type":"x"}}"#;
        assert_eq!(parse_event(err), StreamEvent::Error("boom".into()));
        assert_eq!(parse_event(b"{not json"), StreamEvent::Unparsable);
        assert_eq!(parse_event(br#"{"choices":7}"#), StreamEvent::Unparsable);
    }

    #[test]
    fn completions_text_counts() {
        let e = br#"{"choices":[{"text":"hi"},{"text":""}],"usage":null}"#;
        assert_eq!(
            parse_event(e),
            StreamEvent::Chunk {
                has_choices: true,
                content_choices: 1,
                usage: None
            }
        );
    }
}
