//! The Anthropic Messages API (`POST /v1/messages`) as vLLM 0.32 writes it.
//!
//! Stream: with the first token `message_start` (usage with `input_tokens`, `output_tokens: 0`)
//! and `content_block_start` (a text block, or a `tool_use` block carrying the forced tool's
//! name); one `content_block_delta` per token (`text_delta` or `input_json_delta`); then
//! `content_block_stop`, `message_delta` (stop reason and the cumulative `usage.output_tokens`) and
//! `message_stop`. No `[DONE]`. An end-of-sequence token has no text and so no delta event.

use std::collections::VecDeque;

use bytes::Bytes;

use super::engine::Finish;
use super::prompt::token_text;
use super::request::GenRequest;
use super::tools::ForcedTool;
use super::wire_parts::{json_str, new_id, prefixed, typed_event, ChoiceOut};
use super::wire_responses::text_of;

/// Anthropic's `stop_reason` for how a sequence ended.
fn stop_reason(finish: Finish, tool: bool) -> &'static str {
    match (finish, tool) {
        (Finish::Length, _) => "max_tokens",
        (Finish::Stop, true) => "tool_use",
        (Finish::Stop, false) => "end_turn",
    }
}

/// Builds the events of one streamed Messages answer.
#[derive(Debug)]
pub struct MessagesWriter {
    id: String,
    model: String,
    prompt_tokens: u64,
    tool: Option<ForcedTool>,
    tokens: u64,
    finish: Finish,
}

impl MessagesWriter {
    /// A writer for `req`, answering as `model`.
    pub fn new(req: &GenRequest, model: &str) -> Self {
        MessagesWriter {
            id: new_id(req.endpoint),
            model: json_str(model),
            prompt_tokens: req.prompt_tokens,
            tool: req.tool.clone(),
            tokens: 0,
            finish: Finish::Length,
        }
    }

    /// Output tokens written so far.
    pub fn completion_tokens(&self) -> u64 {
        self.tokens
    }

    /// The events of one token.
    pub fn token(&mut self, finish: Option<Finish>, out: &mut VecDeque<Bytes>) {
        let index = self.tokens;
        self.tokens += 1;
        if let Some(f) = finish {
            self.finish = f;
        }
        if index == 0 {
            let json = format!(
                "{{\"type\":\"message_start\",\"message\":{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":{},\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":0}}}}}}",
                self.id, self.model, self.prompt_tokens
            );
            out.push_back(typed_event("message_start", &json));
            let block = match &self.tool {
                Some(t) => format!(
                    "{{\"type\":\"tool_use\",\"id\":\"{}\",\"name\":{},\"input\":{{}}}}",
                    prefixed("chatcmpl-tool-"),
                    json_str(&t.name)
                ),
                None => "{\"type\":\"text\",\"text\":\"\"}".to_string(),
            };
            let json = format!(
                "{{\"type\":\"content_block_start\",\"content_block\":{block},\"index\":0}}"
            );
            out.push_back(typed_event("content_block_start", &json));
        }
        let delta = match &self.tool {
            Some(_) if index == 0 => return,
            Some(t) => format!(
                "{{\"type\":\"input_json_delta\",\"partial_json\":{}}}",
                json_str(&t.piece(index, finish.is_some()))
            ),
            None if finish == Some(Finish::Stop) => return,
            None => format!(
                "{{\"type\":\"text_delta\",\"text\":\"{}\"}}",
                token_text(index)
            ),
        };
        let json = format!("{{\"type\":\"content_block_delta\",\"delta\":{delta},\"index\":0}}");
        out.push_back(typed_event("content_block_delta", &json));
    }

    /// `content_block_stop`, `message_delta` with the usage, `message_stop`.
    pub fn done(&mut self, out: &mut VecDeque<Bytes>) {
        out.push_back(typed_event(
            "content_block_stop",
            "{\"type\":\"content_block_stop\",\"index\":0}",
        ));
        let json = format!(
            "{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":null}},\"usage\":{{\"input_tokens\":{},\"output_tokens\":{}}}}}",
            stop_reason(self.finish, self.tool.is_some()),
            self.prompt_tokens,
            self.tokens
        );
        out.push_back(typed_event("message_delta", &json));
        out.push_back(typed_event("message_stop", "{\"type\":\"message_stop\"}"));
    }
}

/// The non-streamed Messages answer.
pub fn full_response(req: &GenRequest, model: &str, out: &ChoiceOut) -> String {
    let content = match &req.tool {
        Some(t) => {
            let input: serde_json::Value = serde_json::from_str(&t.arguments(out.tokens))
                .unwrap_or_else(|_| serde_json::json!({}));
            format!(
                "{{\"type\":\"tool_use\",\"id\":\"{}\",\"name\":{},\"input\":{input}}}",
                prefixed("chatcmpl-tool-"),
                json_str(&t.name)
            )
        }
        None => format!(
            "{{\"type\":\"text\",\"text\":{}}}",
            json_str(&text_of(out.tokens, out.finish))
        ),
    };
    format!(
        "{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{content}],\"model\":{},\"stop_reason\":\"{}\",\"usage\":{{\"input_tokens\":{},\"output_tokens\":{}}}}}",
        new_id(req.endpoint),
        json_str(model),
        stop_reason(out.finish, req.tool.is_some()),
        req.prompt_tokens,
        out.tokens
    )
}

/// The `count_tokens` answer for `tokens` prompt tokens.
pub fn count_tokens_body(tokens: u64) -> String {
    format!("{{\"input_tokens\":{tokens},\"context_management\":{{\"original_input_tokens\":{tokens}}}}}")
}
