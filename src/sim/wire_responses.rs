//! The OpenAI Responses API (`POST /v1/responses`) as vLLM 0.32 writes it: typed SSE events with a
//! `sequence_number`, and the `response` object of `response.completed` and of non-streamed answers.
//!
//! Stream: `response.created` and `response.in_progress` as soon as the request is accepted; with
//! the first token `response.output_item.added` (and `response.content_part.added` for text); one
//! `response.output_text.delta` (or `response.function_call_arguments.delta`) per token; then the
//! `.done` events and `response.completed`, whose `response.usage` holds the token counts. No
//! `[DONE]`. An end-of-sequence token has no text and so no delta event.

use std::collections::VecDeque;
use std::fmt::Write as _;

use bytes::Bytes;

use serde_json::{Map, Value};

use super::api::SimApi;
use super::engine::{Finish, Timings};
use super::prompt::{self, token_text};
use super::request::{
    content_text, missing, py_repr, validation, ApiError, GenRequest, RequestRules, ResponsesEcho,
};
use super::tools::{ForcedTool, ToolShape};
use super::wire_parts::{json_str, prefixed, typed_event, ChoiceOut, EventWrite};

/// The Responses API.
pub const RESPONSES: SimApi = SimApi {
    request: RequestRules {
        prompt: responses_prompt,
        openai_options: false,
        requires_max_tokens: false,
        refuses_empty_conversation: false,
        max_tokens: &["max_output_tokens"],
        max_tokens_label: "max_output_tokens",
        tools: Some(ToolShape::Responses),
        echo: Some(responses_echo),
    },
    writer: |req, a| Box::new(ResponsesWriter::new(req, a.model, a.created_s)),
    full_response: |req, a, choices, t| {
        let cached = t.map_or(0, |t| t.cached_tokens);
        full_response(req, a.model, a.created_s, &choices[0], cached)
    },
    error: std::convert::identity,
};

/// The text of `tokens` tokens ending with `finish` (an end-of-sequence token writes nothing).
pub fn text_of(tokens: u64, finish: Finish) -> String {
    let written = tokens - u64::from(finish == Finish::Stop && tokens > 0);
    (0..written).map(token_text).collect()
}

/// The request-dependent parts of every `response` object of one answer.
#[derive(Debug)]
struct Head {
    id: String,
    created_s: u64,
    model: String,
    echo: ResponsesEcho,
    max_output_tokens: u64,
    prompt_tokens: u64,
    tool: Option<ForcedTool>,
    /// `msg_…` or `fc_…`: the one output item's id.
    item_id: String,
    /// `chatcmpl-tool-…`: the call id of a forced tool call.
    call_id: String,
    /// Prompt tokens found in the prefix cache (`usage.input_tokens_details.cached_tokens`).
    cached_tokens: u64,
}

impl Head {
    fn new(req: &GenRequest, model: &str, created_s: u64) -> Self {
        let tool = req.tool.clone();
        Head {
            id: prefixed("resp_"),
            created_s,
            model: json_str(model),
            echo: req.echo.as_deref().cloned().unwrap_or(ResponsesEcho {
                instructions: None,
                temperature: 1.0,
                top_p: 1.0,
                tool_choice: "\"none\"".into(),
                tools: "[]".into(),
            }),
            max_output_tokens: req.max_tokens,
            prompt_tokens: req.prompt_tokens,
            item_id: prefixed(if tool.is_some() { "fc_" } else { "msg_" }),
            call_id: prefixed("chatcmpl-tool-"),
            cached_tokens: 0,
            tool,
        }
    }

    /// The output item, `done` or in progress, after `tokens` tokens ending with `finish`.
    fn item(&self, tokens: u64, finish: Finish, done: bool) -> String {
        let status = if done { "completed" } else { "in_progress" };
        match &self.tool {
            Some(t) => format!(
                "{{\"arguments\":{},\"call_id\":\"{}\",\"name\":{},\"type\":\"function_call\",\"id\":\"{}\",\"async\":null,\"caller\":null,\"namespace\":null,\"status\":\"{status}\"}}",
                json_str(&if done { t.arguments(tokens) } else { String::new() }),
                self.call_id,
                json_str(&t.name),
                self.item_id
            ),
            None => {
                let content = if done {
                    format!(
                        "[{{\"annotations\":[],\"text\":{},\"type\":\"output_text\",\"logprobs\":null}}]",
                        json_str(&text_of(tokens, finish))
                    )
                } else {
                    "[]".into()
                };
                format!(
                    "{{\"id\":\"{}\",\"content\":{content},\"role\":\"assistant\",\"status\":\"{status}\",\"type\":\"message\",\"phase\":null}}",
                    self.item_id
                )
            }
        }
    }

    /// The `response` object: in progress (`end` None) or finished after `tokens` tokens.
    fn response(&self, end: Option<(u64, Finish)>) -> String {
        let (incomplete, output, status, usage) = match end {
            None => ("null", "[]".to_string(), "in_progress", "null".to_string()),
            Some((tokens, finish)) => {
                let p = self.prompt_tokens;
                let usage = format!(
                    "{{\"input_tokens\":{p},\"input_tokens_details\":{{\"cached_tokens\":{},\"cache_write_tokens\":0,\"input_tokens_per_turn\":[],\"cached_tokens_per_turn\":[]}},\"output_tokens\":{tokens},\"output_tokens_details\":{{\"reasoning_tokens\":0,\"tool_output_tokens\":0,\"output_tokens_per_turn\":[],\"tool_output_tokens_per_turn\":[]}},\"total_tokens\":{}}}",
                    self.cached_tokens,
                    p + tokens
                );
                let output = format!("[{}]", self.item(tokens, finish, true));
                match finish {
                    Finish::Length => (
                        "{\"reason\":\"max_output_tokens\"}",
                        output,
                        "incomplete",
                        usage,
                    ),
                    Finish::Stop => ("null", output, "completed", usage),
                }
            }
        };
        let e = &self.echo;
        let instructions = e
            .instructions
            .as_deref()
            .map(json_str)
            .unwrap_or_else(|| "null".into());
        format!(
            "{{\"id\":\"{}\",\"created_at\":{},\"incomplete_details\":{incomplete},\"instructions\":{instructions},\"metadata\":null,\"model\":{},\"object\":\"response\",\"output\":{output},\"parallel_tool_calls\":true,\"temperature\":{:?},\"tool_choice\":{},\"tools\":{},\"top_p\":{:?},\"background\":false,\"max_output_tokens\":{},\"max_tool_calls\":null,\"previous_response_id\":null,\"prompt\":null,\"reasoning\":null,\"service_tier\":\"auto\",\"status\":\"{status}\",\"text\":null,\"top_logprobs\":null,\"truncation\":\"disabled\",\"usage\":{usage},\"user\":null,\"presence_penalty\":0.0,\"frequency_penalty\":0.0,\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"input_messages\":null,\"output_messages\":null}}",
            self.id, self.created_s, self.model, e.temperature, e.tool_choice, e.tools, e.top_p, self.max_output_tokens
        )
    }
}

/// Builds the events of one streamed Responses answer.
#[derive(Debug)]
pub struct ResponsesWriter {
    head: Head,
    seq: u64,
    tokens: u64,
    finish: Finish,
}

impl ResponsesWriter {
    /// A writer for `req`, answering as `model`.
    pub fn new(req: &GenRequest, model: &str, created_s: u64) -> Self {
        ResponsesWriter {
            head: Head::new(req, model, created_s),
            seq: 0,
            tokens: 0,
            finish: Finish::Length,
        }
    }

    fn push(&mut self, out: &mut VecDeque<Bytes>, name: &str, json: String) {
        out.push_back(typed_event(name, &json));
        self.seq += 1;
    }

    /// `response.created` and `response.in_progress`.
    fn start_events(&mut self, out: &mut VecDeque<Bytes>) {
        for name in ["response.created", "response.in_progress"] {
            let json = format!(
                "{{\"response\":{},\"sequence_number\":{},\"type\":\"{name}\"}}",
                self.head.response(None),
                self.seq
            );
            self.push(out, name, json);
        }
    }

    /// The events of one token.
    fn token_events(&mut self, finish: Option<Finish>, out: &mut VecDeque<Bytes>) {
        let index = self.tokens;
        self.tokens += 1;
        if let Some(f) = finish {
            self.finish = f;
        }
        let id = self.head.item_id.clone();
        if index == 0 {
            let json = format!(
                "{{\"item\":{},\"output_index\":0,\"sequence_number\":{},\"type\":\"response.output_item.added\"}}",
                self.head.item(0, Finish::Length, false),
                self.seq
            );
            self.push(out, "response.output_item.added", json);
        }
        match self
            .head
            .tool
            .as_ref()
            .filter(|_| index > 0)
            .map(|t| t.piece(index, finish.is_some()))
        {
            _ if index == 0 && self.head.tool.is_some() => {}
            Some(piece) => {
                let json = format!(
                    "{{\"delta\":{},\"item_id\":\"{id}\",\"output_index\":0,\"sequence_number\":{},\"type\":\"response.function_call_arguments.delta\"}}",
                    json_str(&piece),
                    self.seq
                );
                self.push(out, "response.function_call_arguments.delta", json);
            }
            None => {
                if index == 0 {
                    let json = format!(
                        "{{\"content_index\":0,\"item_id\":\"{id}\",\"output_index\":0,\"part\":{{\"annotations\":[],\"text\":\"\",\"type\":\"output_text\",\"logprobs\":[]}},\"sequence_number\":{},\"type\":\"response.content_part.added\"}}",
                        self.seq
                    );
                    self.push(out, "response.content_part.added", json);
                }
                if finish != Some(Finish::Stop) {
                    let json = format!(
                        "{{\"content_index\":0,\"delta\":\"{}\",\"item_id\":\"{id}\",\"logprobs\":[],\"output_index\":0,\"sequence_number\":{},\"type\":\"response.output_text.delta\"}}",
                        token_text(index),
                        self.seq
                    );
                    self.push(out, "response.output_text.delta", json);
                }
            }
        }
    }

    /// The `.done` events and `response.completed`.
    fn done_events(&mut self, out: &mut VecDeque<Bytes>) {
        let (tokens, finish) = (self.tokens, self.finish);
        let id = self.head.item_id.clone();
        match &self.head.tool {
            Some(t) => {
                let json = format!(
                    "{{\"arguments\":{},\"item_id\":\"{id}\",\"output_index\":0,\"sequence_number\":{},\"type\":\"response.function_call_arguments.done\",\"name\":{}}}",
                    json_str(&t.arguments(tokens)),
                    self.seq,
                    json_str(&t.name)
                );
                self.push(out, "response.function_call_arguments.done", json);
            }
            None => {
                let text = json_str(&text_of(tokens, finish));
                let json = format!(
                    "{{\"content_index\":0,\"item_id\":\"{id}\",\"logprobs\":[],\"output_index\":0,\"sequence_number\":{},\"text\":{text},\"type\":\"response.output_text.done\"}}",
                    self.seq
                );
                self.push(out, "response.output_text.done", json);
                let json = format!(
                    "{{\"content_index\":0,\"item_id\":\"{id}\",\"output_index\":0,\"part\":{{\"annotations\":[],\"text\":{text},\"type\":\"output_text\",\"logprobs\":null}},\"sequence_number\":{},\"type\":\"response.content_part.done\"}}",
                    self.seq
                );
                self.push(out, "response.content_part.done", json);
            }
        }
        let mut json = String::new();
        let _ = write!(
            json,
            "{{\"item\":{},\"output_index\":0,\"sequence_number\":{},\"type\":\"response.output_item.done\"}}",
            self.head.item(tokens, finish, true),
            self.seq
        );
        self.push(out, "response.output_item.done", json);
        let json = format!(
            "{{\"response\":{},\"sequence_number\":{},\"type\":\"response.completed\"}}",
            self.head.response(Some((tokens, finish))),
            self.seq
        );
        self.push(out, "response.completed", json);
    }
}

/// One choice only: the Responses API has no `n`.
impl EventWrite for ResponsesWriter {
    fn start(&mut self, out: &mut VecDeque<Bytes>) {
        self.start_events(out);
    }

    fn token(&mut self, _choice: u32, finish: Option<Finish>, out: &mut VecDeque<Bytes>) {
        self.token_events(finish, out);
    }

    fn done(&mut self, timings: Option<&Timings>, out: &mut VecDeque<Bytes>) {
        self.head.cached_tokens = timings.map_or(0, |t| t.cached_tokens);
        self.done_events(out);
    }
}

/// The non-streamed Responses answer: the finished `response` object.
pub fn full_response(
    req: &GenRequest,
    model: &str,
    created_s: u64,
    out: &ChoiceOut,
    cached_tokens: u64,
) -> String {
    let mut head = Head::new(req, model, created_s);
    head.cached_tokens = cached_tokens;
    head.response(Some((out.tokens, out.finish)))
}

/// Responses: `instructions` (one message) and each `input` item (a string input is one user
/// message; an item's text is its `content`, a call's `arguments` or a call output's `output`),
/// estimated like chat messages.
fn responses_prompt(obj: &Map<String, Value>) -> Result<(Vec<String>, u64), ApiError> {
    let mut texts = Vec::new();
    if let Some(i) = obj.get("instructions").and_then(Value::as_str) {
        texts.push(i.to_string());
    }
    match obj.get("input") {
        None => return Err(missing(obj, "input")),
        Some(Value::String(s)) => texts.push(s.clone()),
        Some(Value::Array(items)) => {
            for it in items {
                let text = match (it.get("content"), it.get("arguments"), it.get("output")) {
                    (Some(c), _, _) => content_text(Some(c)),
                    (None, Some(a), _) | (None, None, Some(a)) => a
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| a.to_string()),
                    _ => String::new(),
                };
                texts.push(text);
            }
        }
        Some(other) => {
            return Err(validation(
                "list_type",
                "body.input",
                "Input should be a valid list",
                &py_repr(other),
                "",
            ))
        }
    }
    let tokens = prompt::chat_prompt_tokens(texts.iter().map(String::as_str));
    Ok((texts, tokens))
}

/// What a Responses answer echoes of its request.
fn responses_echo(obj: &Map<String, Value>) -> ResponsesEcho {
    let f = |k: &str| obj.get(k).and_then(Value::as_f64).unwrap_or(1.0);
    let tools: Vec<Value> = obj
        .get("tools")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|t| {
                    serde_json::json!({
                        "name": t.get("name"), "parameters": t.get("parameters"),
                        "strict": t.get("strict"), "type": t.get("type").cloned().unwrap_or("function".into()),
                        "allowed_callers": null, "async": null, "defer_loading": null,
                        "description": t.get("description"), "output_schema": null
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let tool_choice = match obj.get("tool_choice") {
        _ if tools.is_empty() => Value::from("none"),
        None | Some(Value::Null) => Value::from("auto"),
        Some(c) => c.clone(),
    };
    ResponsesEcho {
        instructions: obj
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_string),
        temperature: f("temperature"),
        top_p: f("top_p"),
        tool_choice: tool_choice.to_string(),
        tools: Value::Array(tools).to_string(),
    }
}
