//! The Anthropic Messages API (`POST /v1/messages`) as vLLM 0.32 writes it.
//!
//! Stream: with the first token `message_start` (usage with `input_tokens`, `output_tokens: 0`)
//! and `content_block_start` (a text block, or a `tool_use` block carrying the forced tool's
//! name); one `content_block_delta` per token (`text_delta` or `input_json_delta`); then
//! `content_block_stop`, `message_delta` (stop reason and the cumulative `usage.output_tokens`) and
//! `message_stop`. No `[DONE]`. An end-of-sequence token has no text and so no delta event.

use std::collections::VecDeque;

use bytes::Bytes;

use serde_json::{Map, Value};

use super::api::SimApi;
use super::config::SimConfig;
use super::engine::{Finish, Timings};
use super::prompt::{self, token_text};
use super::request::{
    check_model, content_text, json_object, missing, py_repr, to_anthropic, validation, ApiError,
    GenRequest, RequestRules,
};
use super::tools::{ForcedTool, ToolShape};
use super::wire_parts::{json_str, prefixed, typed_event, Answering, ChoiceOut, EventWrite};
use super::wire_responses::text_of;

/// The Messages API. vLLM turns a Messages request into a chat request, so it reports the
/// output limit as chat's `max_completion_tokens`, and answers with ids of chat's form.
pub const MESSAGES: SimApi = SimApi {
    request: RequestRules {
        prompt: messages_prompt,
        openai_options: false,
        requires_max_tokens: true,
        refuses_empty_conversation: false,
        max_tokens: &["max_tokens"],
        max_tokens_label: "max_completion_tokens",
        tools: Some(ToolShape::Messages),
        echo: None,
    },
    writer,
    full_response: |req, a, choices, t| {
        let cached = cache_read(a.prompt_tokens_details, t.map_or(0, |t| t.cached_tokens));
        full_response(req, a.model, &choices[0], cached)
    },
    error: to_anthropic,
};

fn writer(req: &GenRequest, a: &Answering<'_>) -> Box<dyn EventWrite> {
    let mut w = MessagesWriter::new(req, a.model);
    w.prompt_tokens_details = a.prompt_tokens_details;
    Box::new(w)
}

/// The cached prompt tokens a Messages answer reports: vLLM's Messages answers are its chat
/// answers converted, so only where chat's `prompt_tokens_details` is (the switch on, some
/// tokens cached); 0 when not reported.
fn cache_read(on: bool, cached_tokens: u64) -> u64 {
    if on {
        cached_tokens
    } else {
        0
    }
}

/// `input_tokens` and the `cache_read_input_tokens` member (with its leading comma) of a usage
/// object: in Anthropic's sense `input_tokens` leaves the cached part out, so the prompt is
/// their sum.
fn input_usage(prompt_tokens: u64, cached: u64) -> (u64, String) {
    if cached == 0 {
        return (prompt_tokens, String::new());
    }
    let cached = cached.min(prompt_tokens);
    (
        prompt_tokens - cached,
        format!(",\"cache_read_input_tokens\":{cached}"),
    )
}

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
    /// Report cached prompt tokens (`cache_read_input_tokens`).
    pub prompt_tokens_details: bool,
}

impl MessagesWriter {
    /// A writer for `req`, answering as `model`.
    pub fn new(req: &GenRequest, model: &str) -> Self {
        MessagesWriter {
            id: prefixed("chatcmpl-"),
            model: json_str(model),
            prompt_tokens: req.prompt_tokens,
            tool: req.tool.clone(),
            tokens: 0,
            finish: Finish::Length,
            prompt_tokens_details: false,
        }
    }

    /// The events of one token.
    fn token_events(&mut self, finish: Option<Finish>, out: &mut VecDeque<Bytes>) {
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
    fn done_events(&mut self, cached_tokens: u64, out: &mut VecDeque<Bytes>) {
        out.push_back(typed_event(
            "content_block_stop",
            "{\"type\":\"content_block_stop\",\"index\":0}",
        ));
        let (input, read) = input_usage(
            self.prompt_tokens,
            cache_read(self.prompt_tokens_details, cached_tokens),
        );
        let json = format!(
            "{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":null}},\"usage\":{{\"input_tokens\":{input},\"output_tokens\":{}{read}}}}}",
            stop_reason(self.finish, self.tool.is_some()),
            self.tokens,
        );
        out.push_back(typed_event("message_delta", &json));
        out.push_back(typed_event("message_stop", "{\"type\":\"message_stop\"}"));
    }
}

/// One choice only: the Messages API has no `n`.
impl EventWrite for MessagesWriter {
    fn token(&mut self, _choice: u32, finish: Option<Finish>, out: &mut VecDeque<Bytes>) {
        self.token_events(finish, out);
    }

    fn done(&mut self, timings: Option<&Timings>, out: &mut VecDeque<Bytes>) {
        self.done_events(timings.map_or(0, |t| t.cached_tokens), out);
    }
}

/// The non-streamed Messages answer.
pub fn full_response(req: &GenRequest, model: &str, out: &ChoiceOut, cached: u64) -> String {
    let (input, read) = input_usage(req.prompt_tokens, cached);
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
        "{{\"id\":\"{}\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{content}],\"model\":{},\"stop_reason\":\"{}\",\"usage\":{{\"input_tokens\":{input},\"output_tokens\":{}{read}}}}}",
        prefixed("chatcmpl-"),
        json_str(model),
        stop_reason(out.finish, req.tool.is_some()),
        out.tokens
    )
}

/// The `count_tokens` answer for `tokens` prompt tokens.
pub fn count_tokens_body(tokens: u64) -> String {
    format!("{{\"input_tokens\":{tokens},\"context_management\":{{\"original_input_tokens\":{tokens}}}}}")
}

/// `POST /v1/messages/count_tokens`: the prompt-token estimate of a Messages request, without
/// generating anything. Errors in the OpenAI shape (the caller converts them).
pub fn count_tokens(
    content_type: Option<&str>,
    body: &[u8],
    cfg: &SimConfig,
) -> Result<u64, ApiError> {
    let obj = json_object(content_type, body)?;
    let (_, tokens) = messages_prompt(&obj)?;
    check_model(&obj, cfg)?;
    Ok(tokens)
}

/// Messages: `system` (a string or text blocks, one message) and each message, estimated like chat
/// messages.
fn messages_prompt(obj: &Map<String, Value>) -> Result<(Vec<String>, u64), ApiError> {
    let mut texts = Vec::new();
    if let Some(s) = obj.get("system").filter(|s| !s.is_null()) {
        texts.push(content_text(Some(s)));
    }
    match obj.get("messages") {
        None => return Err(missing(obj, "messages")),
        Some(Value::Array(a)) => texts.extend(a.iter().map(|m| content_text(m.get("content")))),
        Some(other) => {
            return Err(validation(
                "list_type",
                "body.messages",
                "Input should be a valid list",
                &py_repr(other),
                "",
            ))
        }
    }
    let tokens = prompt::chat_prompt_tokens(texts.iter().map(String::as_str));
    Ok((texts, tokens))
}
