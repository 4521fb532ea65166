//! Anthropic Messages: which non-streamed requests may be sent as streams, and the fold that rebuilds
//! vLLM 0.32's `message` object from its event stream.
//!
//! vLLM writes the non-streamed message without its null members (`stop_sequence` is absent
//! unless a stop sequence ended it); the stream's `message_start` and `message_delta` carry the
//! id, model, stop reason and the final usage.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{as_stream_request, first_asking, string_inner, AsStream, Fold, Folded, Unfoldable};

/// A non-streamed Messages request as a stream with its fold, or why it must pass through.
pub fn as_stream(body: &[u8]) -> Result<Option<AsStream>, Unfoldable> {
    as_stream_request(body, refusal, false, |_| Box::<MessagesFold>::default())
}

/// Why a Messages request must pass through unchanged, if it must: tools (the recorded forced-tool
/// pair differs between the two answers) and extended thinking (a thinking block is parsed
/// differently when streamed, as reasoning is for chat).
pub(crate) fn refusal(req: &Map<String, Value>) -> Option<&'static str> {
    first_asking(req, &["tools", "tool_choice", "thinking"]).map(|k| match k {
        "thinking" => "request asks for thinking",
        "tool_choice" => "request has tool_choice",
        _ => "request has tools",
    })
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    message: Option<StartMessage<'a>>,
    #[serde(borrow)]
    content_block: Option<Block<'a>>,
    #[serde(borrow)]
    delta: Option<DeltaBody<'a>>,
    index: Option<u32>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct StartMessage<'a> {
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(borrow)]
    model: &'a RawValue,
}

/// A content block's start; its type is checked, so other block types' members are allowed.
#[derive(Deserialize)]
struct Block<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
}

/// A block delta or a message delta; a block delta's type is checked.
#[derive(Deserialize)]
struct DeltaBody<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<&'a str>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    stop_reason: Option<&'a RawValue>,
    #[serde(borrow)]
    stop_sequence: Option<&'a RawValue>,
}

/// Rebuilds a Messages `message` from its stream (text blocks only: see [`refusal`]).
#[derive(Default)]
pub struct MessagesFold {
    id: Option<String>,
    model: Option<String>,
    /// Escaped text of each text block, in order.
    blocks: Vec<Vec<u8>>,
    open: Option<u32>,
    stop_reason: Option<String>,
    stop_sequence: Option<String>,
    usage: Option<Vec<u8>>,
    held: usize,
    error: Option<Folded>,
    stopped: bool,
}

impl Fold for MessagesFold {
    fn feed(&mut self, data: &[u8]) -> Result<(), Unfoldable> {
        if self.stopped || self.error.is_some() {
            return Err(Unfoldable("event after the end of the stream"));
        }
        let ev: Event<'_> =
            serde_json::from_slice(data).map_err(|_| Unfoldable("unknown event shape"))?;
        match ev.kind {
            "message_start" => {
                let m = ev
                    .message
                    .ok_or(Unfoldable("message_start without message"))?;
                self.id = Some(m.id.get().to_string());
                self.model = Some(m.model.get().to_string());
            }
            "content_block_start" => {
                let b = ev
                    .content_block
                    .ok_or(Unfoldable("block start without block"))?;
                if b.kind != "text" {
                    return Err(Unfoldable("stream carries a non-text block"));
                }
                if ev.index != Some(self.blocks.len() as u32) || self.open.is_some() {
                    return Err(Unfoldable("content blocks out of order"));
                }
                let inner = b
                    .text
                    .and_then(|t| string_inner(t.get()))
                    .ok_or(Unfoldable("block text is not a string"))?;
                self.open = ev.index;
                self.held += inner.len();
                self.blocks.push(inner.as_bytes().to_vec());
            }
            "content_block_delta" => {
                let d = ev.delta.ok_or(Unfoldable("block delta without delta"))?;
                if d.kind != Some("text_delta") || ev.index != self.open {
                    return Err(Unfoldable("stream carries a non-text delta"));
                }
                let inner = d
                    .text
                    .and_then(|t| string_inner(t.get()))
                    .ok_or(Unfoldable("delta text is not a string"))?;
                self.held += inner.len();
                if let Some(block) = self.blocks.last_mut() {
                    block.extend_from_slice(inner.as_bytes());
                }
            }
            "content_block_stop" => {
                if ev.index != self.open {
                    return Err(Unfoldable("content blocks out of order"));
                }
                self.open = None;
            }
            "message_delta" => {
                let d = ev.delta.ok_or(Unfoldable("message_delta without delta"))?;
                if let Some(r) = d.stop_reason.filter(|r| r.get() != "null") {
                    self.stop_reason = Some(r.get().to_string());
                }
                self.stop_sequence = d
                    .stop_sequence
                    .filter(|s| s.get() != "null")
                    .map(|s| s.get().to_string());
                if let Some(u) = ev.usage.filter(|u| u.get() != "null") {
                    self.usage = Some(without_nulls(u.get())?);
                }
            }
            "message_stop" => self.stopped = true,
            "ping" => {}
            "error" => {
                self.error = Some(error_response(data)?);
            }
            _ => return Err(Unfoldable("unknown event type")),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<Folded, Unfoldable> {
        if let Some(e) = self.error.take() {
            return Ok(e);
        }
        if !self.stopped || self.open.is_some() {
            return Err(Unfoldable("stream ended without message_stop"));
        }
        let (Some(id), Some(model), Some(usage)) = (&self.id, &self.model, &self.usage) else {
            return Err(Unfoldable("stream without id, model or usage"));
        };
        if self.blocks.is_empty() {
            // No recording shows what vLLM answers non-streamed for an empty message.
            return Err(Unfoldable("stream carried no content block"));
        }
        let mut out = Vec::with_capacity(self.held + 200);
        out.extend_from_slice(b"{\"id\":");
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"content\":[");
        for (i, text) in self.blocks.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"type\":\"text\",\"text\":\"");
            out.extend_from_slice(text);
            out.extend_from_slice(b"\"}");
        }
        out.extend_from_slice(b"],\"model\":");
        out.extend_from_slice(model.as_bytes());
        if let Some(r) = &self.stop_reason {
            out.extend_from_slice(b",\"stop_reason\":");
            out.extend_from_slice(r.as_bytes());
        }
        if let Some(s) = &self.stop_sequence {
            out.extend_from_slice(b",\"stop_sequence\":");
            out.extend_from_slice(s.as_bytes());
        }
        out.extend_from_slice(b",\"usage\":");
        out.extend_from_slice(usage);
        out.push(b'}');
        Ok(Folded::Answer(out))
    }

    fn held_bytes(&self) -> usize {
        self.held
    }
}

/// `usage` written compactly without its null members, as the non-streamed message has it.
fn without_nulls(raw: &str) -> Result<Vec<u8>, Unfoldable> {
    let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(raw) else {
        return Err(Unfoldable("usage is not an object"));
    };
    m.retain(|_, v| !v.is_null());
    if m.values().any(|v| !v.is_u64()) {
        return Err(Unfoldable("usage holds more than counts"));
    }
    serde_json::to_vec(&m).map_err(|_| Unfoldable("usage not writable"))
}

/// An in-stream `error` event as vLLM's non-streamed Messages error: the same
/// `{"type":"error","error":{"type","message"}}` object, compact, with the status its error type
/// has in the recorded samples (`BadRequestError` 400, `NotFoundError` 404), else 500.
fn error_response(data: &[u8]) -> Result<Folded, Unfoldable> {
    let v: Value =
        serde_json::from_slice(data).map_err(|_| Unfoldable("error event not readable"))?;
    let status = match v.pointer("/error/type").and_then(Value::as_str) {
        Some("BadRequestError" | "invalid_request_error") => 400,
        Some("NotFoundError" | "not_found_error") => 404,
        _ => 500,
    };
    Ok(Folded::Error {
        status,
        body: serde_json::to_vec(&v).map_err(|_| Unfoldable("error not writable"))?,
    })
}
