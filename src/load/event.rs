//! What `load` reads from an answer besides the dialect's events: the message of an error body,
//! and the usage type it reports.

pub use crate::openai::Usage;

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
    fn error_text_reads_each_shape() {
        let v = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(
            error_text(&v(r#"{"error":{"message":"boom","type":"x"}}"#)),
            "boom"
        );
        assert_eq!(error_text(&v(r#"{"message":"flat"}"#)), "flat");
        assert_eq!(error_text(&v(r#"{"detail":"Not Found"}"#)), "Not Found");
        assert_eq!(error_text(&v(r#"{"error":"plain"}"#)), "plain");
    }
}
