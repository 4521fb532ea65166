//! Reading one streamed chat-completion event without building a JSON tree.
//!
//! Only what the load generator measures is extracted: whether `choices` is non-empty (TTFT),
//! how many choices carry non-empty text (the fallback token count), `usage`, and `error`.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// Token counts from a `usage` object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`.
    #[serde(default)]
    pub completion_tokens: Option<u64>,
}

/// What one `data:` payload says.
#[derive(Debug, PartialEq)]
pub enum StreamEvent {
    /// The `[DONE]` sentinel.
    Done,
    /// A chunk object.
    Chunk {
        /// `choices` holds at least one element.
        has_choices: bool,
        /// Choices whose `delta.content` (chat) or `text` (completions) is a non-empty string.
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
    match serde_json::from_slice::<ChunkLite>(trimmed) {
        Ok(c) => {
            if let Some(err) = c.error {
                return StreamEvent::Error(error_text(&err));
            }
            let choices = c.choices.unwrap_or_default();
            StreamEvent::Chunk {
                has_choices: choices.count > 0,
                content_choices: choices.with_content,
                usage: c.usage,
            }
        }
        Err(_) => StreamEvent::Unparsable,
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

#[derive(Deserialize)]
struct ChunkLite {
    #[serde(default)]
    choices: Option<ChoicesSummary>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Default)]
struct ChoicesSummary {
    count: u32,
    with_content: u32,
}

#[derive(Deserialize)]
struct ChoiceLite {
    #[serde(default)]
    delta: Option<DeltaLite>,
    #[serde(default)]
    text: Option<HasText>,
}

#[derive(Deserialize)]
struct DeltaLite {
    #[serde(default)]
    content: Option<HasText>,
}

impl<'de> Deserialize<'de> for ChoicesSummary {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ChoicesSummary;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut s = ChoicesSummary::default();
                while let Some(c) = seq.next_element::<ChoiceLite>()? {
                    s.count = s.count.saturating_add(1);
                    let text = c.text.is_some_and(|t| t.0);
                    let content = c.delta.and_then(|d| d.content).is_some_and(|t| t.0);
                    if text || content {
                        s.with_content = s.with_content.saturating_add(1);
                    }
                }
                Ok(s)
            }
        }
        d.deserialize_seq(V)
    }
}

/// Whether a value is a non-empty string, or a non-empty array/object (multimodal content).
struct HasText(bool);

impl<'de> Deserialize<'de> for HasText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = HasText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("text")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<HasText, E> {
                Ok(HasText(!v.is_empty()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<HasText, E> {
                Ok(HasText(false))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<HasText, E> {
                Ok(HasText(false))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<HasText, E> {
                Ok(HasText(false))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<HasText, E> {
                Ok(HasText(false))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<HasText, E> {
                Ok(HasText(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<HasText, A::Error> {
                let mut any = false;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(HasText(any))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HasText, A::Error> {
                let mut any = false;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                    any = true;
                }
                Ok(HasText(any))
            }
        }
        d.deserialize_any(V)
    }
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
