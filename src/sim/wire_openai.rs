//! OpenAI chat completions and text completions (`POST /v1/chat/completions`,
//! `POST /v1/completions`) as vLLM 0.32 reads and answers them: their [`SimApi`]s, the prompt
//! readers, the SSE events of a stream and the non-streaming JSON objects.

use std::collections::VecDeque;

use bytes::Bytes;
use serde_json::{Map, Value};

use super::api::SimApi;
use super::engine::{Finish, Timings};
use super::prompt::{self, token_text};
use super::request::{bad, missing, py_repr, validation, ApiError, GenRequest, RequestRules};
use super::tools::{ForcedTool, ToolShape};
pub use super::wire_parts::{json_str, prefixed, ChoiceOut};
use super::wire_parts::{prompt_tokens_details, Answering, EventWrite};
use crate::dialect::Api;

/// `system_fingerprint` the simulator reports.
pub const SYSTEM_FINGERPRINT: &str = "vllm-0.32.0-sim";

/// The members chat and completions read as the output limit, first present wins.
const MAX_TOKENS: &[&str] = &["max_completion_tokens", "max_tokens"];

/// Chat completions.
pub const CHAT: SimApi = SimApi {
    request: RequestRules {
        prompt: chat_prompt,
        openai_options: true,
        requires_max_tokens: false,
        refuses_empty_conversation: true,
        max_tokens: MAX_TOKENS,
        max_tokens_label: "max_tokens",
        tools: Some(ToolShape::Chat),
        echo: None,
    },
    writer,
    full_response,
    error: std::convert::identity,
};

/// Text completions: no tools, no conversation.
pub const COMPLETIONS: SimApi = SimApi {
    request: RequestRules {
        prompt: completion_prompt,
        refuses_empty_conversation: false,
        tools: None,
        ..CHAT.request
    },
    ..CHAT
};

fn writer(req: &GenRequest, a: &Answering<'_>) -> Box<dyn EventWrite> {
    Box::new(StreamWriter::new(req, a))
}

/// A fresh response id: `chatcmpl-<16 hex>` or `cmpl-<16 hex>`.
fn new_id(endpoint: Api) -> String {
    prefixed(if endpoint == Api::Completions {
        "cmpl-"
    } else {
        "chatcmpl-"
    })
}

/// Per-request `metrics` object (mirrors vLLM's `--enable-per-request-metrics` field).
pub fn metrics_json(t: &Timings) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    format!(
        "{{\"queue_time_ms\":{},\"time_to_first_token_ms\":{},\"mean_itl_ms\":{},\"e2e_ms\":{}}}",
        ms(t.queue_ns),
        ms(t.ttft_ns),
        ms(t.mean_itl_ns),
        ms(t.e2e_ns)
    )
}

/// Builds the SSE events of one streamed response, in vLLM's field order.
#[derive(Debug)]
pub struct StreamWriter {
    endpoint: Api,
    /// `{"id":..,"object":..,"created":..,"model":..,` — shared prefix of every event.
    head: String,
    prompt_tokens: u64,
    include_usage: bool,
    continuous: bool,
    per_request_metrics: bool,
    prompt_tokens_details: bool,
    generated: Vec<u64>,
    roles_sent: bool,
    /// Add `"tm_sent_ns"` with CLOCK_MONOTONIC at build time.
    stamp: bool,
    /// Chat only: the forced tool every choice calls.
    tool: Option<ForcedTool>,
}

impl StreamWriter {
    /// A writer for `req`, answering as `a` says.
    pub fn new(req: &GenRequest, a: &Answering<'_>) -> Self {
        let (model, created_s) = (a.model, a.created_s);
        let object = match req.endpoint {
            Api::Completions => "text_completion",
            _ => "chat.completion.chunk",
        };
        let head = format!(
            "data: {{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{created_s},\"model\":{},",
            new_id(req.endpoint),
            json_str(model)
        );
        StreamWriter {
            endpoint: req.endpoint,
            head,
            prompt_tokens: req.prompt_tokens,
            include_usage: req.include_usage,
            continuous: req.continuous_usage,
            per_request_metrics: a.per_request_metrics,
            prompt_tokens_details: a.prompt_tokens_details,
            generated: vec![0; req.n as usize],
            roles_sent: req.endpoint == Api::Completions,
            stamp: a.stamp,
            tool: req.tool.clone().filter(|_| req.endpoint == Api::Chat),
        }
    }

    /// Total completion tokens written so far.
    pub fn completion_tokens(&self) -> u64 {
        self.generated.iter().sum()
    }

    fn usage(&self, out: &mut String, completion: u64, details: bool) {
        use std::fmt::Write as _;
        let p = self.prompt_tokens;
        let _ = write!(out, "\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{completion}", p + completion);
        out.push_str(if details {
            ",\"completion_tokens_details\":null}"
        } else {
            "}"
        });
    }

    fn finish_event(&self, mut s: String) -> Bytes {
        if self.stamp {
            use std::fmt::Write as _;
            let _ = write!(s, ",\"tm_sent_ns\":{}", crate::clock::monotonic_ns());
        }
        s.push_str("}\n\n");
        Bytes::from(s)
    }

    /// The events for one token of `choice` (role events first, before the first token).
    fn token_events(&mut self, choice: u32, finish: Option<Finish>, out: &mut VecDeque<Bytes>) {
        use std::fmt::Write as _;
        if !self.roles_sent {
            self.roles_sent = true;
            for i in 0..self.generated.len() {
                let mut s = String::with_capacity(self.head.len() + 200);
                s.push_str(&self.head);
                let _ = write!(s, "\"choices\":[{{\"index\":{i},\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}],");
                if self.continuous {
                    self.usage(&mut s, 0, true);
                    s.push(',');
                }
                s.push_str("\"prompt_token_ids\":null,\"prompt_text\":null");
                out.push_back(self.finish_event(s));
            }
        }
        let Some(count) = self.generated.get_mut(choice as usize) else {
            return;
        };
        let index = *count;
        *count += 1;
        let cumulative = *count;
        // An end-of-sequence stop token has no text, like vLLM's final "" delta.
        let text = if finish == Some(Finish::Stop) {
            ""
        } else {
            token_text(index)
        };
        let mut s = String::with_capacity(self.head.len() + 200);
        s.push_str(&self.head);
        // Static text: nothing allocated per token beyond the event itself.
        let reason = match finish {
            Some(Finish::Length) => "\"length\",\"stop_reason\":null",
            Some(Finish::Stop) => "\"stop\",\"stop_reason\":null",
            None => "null",
        };
        match (self.endpoint, &self.tool) {
            (Api::Chat, Some(tool)) => {
                let reason = match finish {
                    Some(Finish::Stop) => "\"tool_calls\",\"stop_reason\":null",
                    _ => reason,
                };
                let call = if index == 0 {
                    format!(
                        "{{\"id\":\"{}\",\"type\":\"function\",\"index\":0,\"function\":{{\"name\":{}}}}}",
                        prefixed("chatcmpl-tool-"),
                        json_str(&tool.name)
                    )
                } else {
                    let piece = tool.piece(index, finish.is_some());
                    format!(
                        "{{\"index\":0,\"function\":{{\"arguments\":{}}}}}",
                        json_str(&piece)
                    )
                };
                let _ = write!(s, "\"choices\":[{{\"index\":{choice},\"delta\":{{\"content\":null,\"tool_calls\":[{call}]}},\"logprobs\":null,\"finish_reason\":{reason},\"token_ids\":null}}]");
            }
            (Api::Chat, None) => {
                let _ = write!(s, "\"choices\":[{{\"index\":{choice},\"delta\":{{\"content\":\"{text}\"}},\"logprobs\":null,\"finish_reason\":{reason},\"token_ids\":null}}]");
            }
            _ => {
                let stop = if finish.is_some() {
                    ""
                } else {
                    ",\"stop_reason\":null"
                };
                let _ = write!(s, "\"choices\":[{{\"index\":{choice},\"text\":\"{text}\",\"logprobs\":null,\"finish_reason\":{reason}{stop},\"prompt_token_ids\":null,\"token_ids\":null}}]");
            }
        }
        if self.continuous {
            s.push(',');
            self.usage(&mut s, cumulative, true);
        }
        if finish.is_some() && !self.include_usage && self.endpoint == Api::Chat {
            let _ = write!(s, ",\"system_fingerprint\":\"{SYSTEM_FINGERPRINT}\"");
        }
        out.push_back(self.finish_event(s));
    }

    /// The closing events: the usage event (with include_usage) and `data: [DONE]`.
    fn done_events(&self, timings: Option<&Timings>, out: &mut VecDeque<Bytes>) {
        if self.include_usage {
            let mut s = String::with_capacity(self.head.len() + 200);
            s.push_str(&self.head);
            s.push_str("\"choices\":[],");
            self.usage(&mut s, self.completion_tokens(), false);
            let cached = timings.map_or(0, |t| t.cached_tokens);
            if let Some(d) = prompt_tokens_details(self.prompt_tokens_details, cached) {
                s.pop();
                s.push_str(",\"prompt_tokens_details\":");
                s.push_str(&d);
                s.push('}');
            }
            s.push_str(",\"system_fingerprint\":\"");
            s.push_str(SYSTEM_FINGERPRINT);
            s.push('"');
            if let (true, Some(t)) = (self.per_request_metrics, timings) {
                s.push_str(",\"metrics\":");
                s.push_str(&metrics_json(t));
            }
            out.push_back(self.finish_event(s));
        }
        out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
    }
}

impl EventWrite for StreamWriter {
    fn token(&mut self, choice: u32, finish: Option<Finish>, out: &mut VecDeque<Bytes>) {
        self.token_events(choice, finish, out);
    }

    fn done(&mut self, timings: Option<&Timings>, out: &mut VecDeque<Bytes>) {
        self.done_events(timings, out);
    }
}

/// The non-streaming response body for `req`.
pub fn full_response(
    req: &GenRequest,
    a: &Answering<'_>,
    choices: &[ChoiceOut],
    timings: Option<&Timings>,
) -> String {
    let (model, created_s) = (a.model, a.created_s);
    let mut arr = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        let t = json_str(&c.text);
        let f = c.finish.as_str();
        arr.push(match (req.endpoint, &req.tool) {
            (Api::Chat, Some(tool)) => {
                let f = if c.finish == Finish::Stop { "tool_calls" } else { f };
                let call = format!(
                    "{{\"id\":\"{}\",\"type\":\"function\",\"function\":{{\"name\":{},\"arguments\":{}}}}}",
                    prefixed("chatcmpl-tool-"),
                    json_str(&tool.name),
                    json_str(&tool.arguments(c.tokens))
                );
                format!("{{\"index\":{i},\"message\":{{\"role\":\"assistant\",\"content\":null,\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"tool_calls\":[{call}],\"reasoning\":null}},\"logprobs\":null,\"finish_reason\":\"{f}\",\"stop_reason\":null,\"token_ids\":null,\"routed_experts\":null}}")
            }
            (Api::Chat, None) => format!("{{\"index\":{i},\"message\":{{\"role\":\"assistant\",\"content\":{t},\"refusal\":null,\"annotations\":null,\"audio\":null,\"function_call\":null,\"reasoning\":null}},\"logprobs\":null,\"finish_reason\":\"{f}\",\"stop_reason\":null,\"token_ids\":null,\"routed_experts\":null}}"),
            _ => format!("{{\"index\":{i},\"text\":{t},\"logprobs\":null,\"finish_reason\":\"{f}\",\"stop_reason\":null,\"token_ids\":null,\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"routed_experts\":null}}"),
        });
    }
    let completion: u64 = choices.iter().map(|c| c.tokens).sum();
    let p = req.prompt_tokens;
    let (object, tail) = if req.endpoint == Api::Completions {
        (
            "text_completion",
            "\"kv_transfer_params\":null,\"ec_transfer_params\":null",
        )
    } else {
        ("chat.completion", "\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\"kv_transfer_params\":null,\"ec_transfer_params\":null")
    };
    let metrics = timings
        .filter(|_| a.per_request_metrics)
        .map(metrics_json)
        .unwrap_or_else(|| "null".to_string());
    let details = prompt_tokens_details(
        a.prompt_tokens_details,
        timings.map_or(0, |t| t.cached_tokens),
    )
    .unwrap_or_else(|| "null".to_string());
    format!(
        "{{\"id\":\"{}\",\"object\":\"{object}\",\"created\":{created_s},\"model\":{},\"choices\":[{}],\"service_tier\":null,\"system_fingerprint\":\"{SYSTEM_FINGERPRINT}\",\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{},\"prompt_tokens_details\":{details},\"completion_tokens_details\":null}},{tail},\"metrics\":{metrics}}}",
        new_id(req.endpoint),
        json_str(model),
        arr.join(","),
        p + completion,
        completion
    )
}

/// Message texts and the chat prompt-token estimate.
fn chat_prompt(obj: &Map<String, Value>) -> Result<(Vec<String>, u64), ApiError> {
    let msgs = match obj.get("messages") {
        None => return Err(missing(obj, "messages")),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(validation(
                "list_type",
                "body.messages",
                "Input should be a valid list",
                &py_repr(other),
                "",
            ))
        }
    };
    let mut texts = Vec::with_capacity(msgs.len());
    for m in msgs {
        let mut text = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<String>(),
            _ => String::new(),
        };
        // An assistant's tool calls are read after its text, as the chat template writes them
        // (a `role: "tool"` result's text is its `content`).
        for call in m
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                text.push_str(args);
            }
        }
        texts.push(text);
    }
    let tokens = prompt::chat_prompt_tokens(texts.iter().map(String::as_str));
    Ok((texts, tokens))
}

/// Prompt text and the completions prompt-token estimate: a string, a one-string array, or an
/// array of token ids (counted as they are).
fn completion_prompt(obj: &Map<String, Value>) -> Result<(Vec<String>, u64), ApiError> {
    match obj.get("prompt") {
        None => Err(missing(obj, "prompt")),
        Some(Value::String(s)) => Ok((vec![s.clone()], prompt::completion_prompt_tokens(s))),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            let s = a[0].as_str().unwrap_or_default().to_string();
            let t = prompt::completion_prompt_tokens(&s);
            Ok((vec![s], t))
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            Ok((vec![Value::Array(a.clone()).to_string()], a.len() as u64))
        }
        Some(_) => Err(bad("The simulator accepts one prompt per request: a string, a one-string list or a list of token ids.", Some("prompt"))),
    }
}
