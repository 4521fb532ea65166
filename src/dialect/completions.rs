//! OpenAI text completions (`/v1/completions`): the chat stream's framing, `text` in place of a
//! delta.

use super::chat::OpenAiStyle;
use super::{Api, ApiSpec, ClientShape, KeyHeader, PromptField};

/// The text completions reader.
pub const COMPLETIONS: OpenAiStyle = OpenAiStyle::new(
    Api::Completions,
    "/v1/completions",
    crate::fold::completions::as_stream,
);

/// Text completions' facts.
pub const SPEC: ApiSpec = ApiSpec {
    api: Api::Completions,
    name: "completions",
    path: "/v1/completions",
    otel_operation: "text_completion",
    dialect: &COMPLETIONS,
    client: ClientShape {
        prompt: PromptField::Text("prompt"),
        max_tokens: "max_tokens",
        user: &["user"],
        key: KeyHeader::Bearer,
    },
    error_shape: crate::error::ErrorShape::OpenAi,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;

    #[test]
    fn text_is_output() {
        let s = COMPLETIONS
            .event(br#"{"choices":[{"index":0,"text":" hi","finish_reason":"length"}]}"#)
            .unwrap();
        assert_eq!((s.output, s.choices), (1, 1));
        assert_eq!(s.finish_reason.as_deref(), Some("length"));
        let body = COMPLETIONS
            .body(br#"{"choices":[{"index":0,"text":"x","finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":1}}"#)
            .unwrap();
        assert!(body.end && !body.usage_only);
        assert_eq!(body.usage.unwrap().output, Some(1));
    }
}
