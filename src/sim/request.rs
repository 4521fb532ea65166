//! Request parsing and validation with vLLM 0.32's error statuses, types and messages.

use serde_json::{Map, Value};

use crate::dialect::Api;

use super::config::SimConfig;
use super::prompt;
use super::tools::{self, ForcedTool, ToolShape};

/// A request's prompt: its texts and their token estimate, or vLLM's error for the body.
pub type PromptReader = fn(&Map<String, Value>) -> Result<(Vec<String>, u64), ApiError>;

/// What an answer echoes of its request.
pub type EchoReader = fn(&Map<String, Value>) -> ResponsesEcho;

/// How vLLM reads one API's generation requests where the APIs differ; each API's wire file
/// declares its rules (in its [`super::api::SimApi`]).
#[derive(Debug, Clone, Copy)]
pub struct RequestRules {
    /// Reads the prompt.
    pub prompt: PromptReader,
    /// Takes OpenAI's `n` and `stream_options` (the others answer one choice, and their
    /// streams carry usage unasked).
    pub openai_options: bool,
    /// Refuses a request without `max_tokens` (Anthropic's required member).
    pub requires_max_tokens: bool,
    /// Refuses a conversation without messages (chat's template needs one).
    pub refuses_empty_conversation: bool,
    /// The members read as the output limit, first present wins.
    pub max_tokens: &'static [&'static str],
    /// The name vLLM's errors give the output limit (Messages are turned into chat requests
    /// and report the chat member).
    pub max_tokens_label: &'static str,
    /// Where a forced tool is read from, for the APIs whose answers call tools.
    pub tools: Option<ToolShape>,
    /// What the answer echoes of the request (Responses).
    pub echo: Option<EchoReader>,
}

/// What a Responses answer echoes of its request (the `response` object's request fields).
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesEcho {
    /// `instructions`, when sent.
    pub instructions: Option<String>,
    /// `temperature` (1.0 when not sent).
    pub temperature: f64,
    /// `top_p` (1.0 when not sent).
    pub top_p: f64,
    /// `tool_choice` as JSON text (`"none"` without tools, as vLLM shows it).
    pub tool_choice: String,
    /// `tools` as JSON text, each function tool in vLLM's field order.
    pub tools: String,
}

/// A validated generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// Which endpoint it came to.
    pub endpoint: Api,
    /// Streamed (SSE) or one JSON response.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` (only with include_usage, as vLLM).
    pub continuous_usage: bool,
    /// Number of choices.
    pub n: u32,
    /// Estimated prompt tokens (see [`prompt`]).
    pub prompt_tokens: u64,
    /// The prompt tokens' identities for the prefix cache (empty when it is off).
    pub prompt_ids: Vec<u64>,
    /// Output limit per choice.
    pub max_tokens: u64,
    /// Per choice: stop rule position (`None` = runs to max_tokens).
    pub stop_after: Vec<Option<u64>>,
    /// The tool call the request forces (see [`tools`]), if any.
    pub tool: Option<ForcedTool>,
    /// Responses only: the request fields its answer echoes.
    pub echo: Option<Box<ResponsesEcho>>,
}

/// An error response: status and the JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// JSON body text.
    pub body: String,
}

/// vLLM's `{"error":{message,type,param,code}}` body.
pub fn error(status: u16, kind: &str, message: &str, param: Option<&str>) -> ApiError {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": param, "code": status}
    });
    ApiError {
        status,
        body: body.to_string(),
    }
}

/// The same error in the Anthropic Messages shape, `{"type":"error","error":{type,message}}`, as
/// vLLM's `/v1/messages` route answers.
pub fn to_anthropic(e: ApiError) -> ApiError {
    let v: Value = serde_json::from_str(&e.body).unwrap_or(Value::Null);
    let inner = &v["error"];
    let body = serde_json::json!({
        "type": "error",
        "error": {"type": inner["type"], "message": inner["message"]}
    });
    ApiError {
        status: e.status,
        body: body.to_string(),
    }
}

pub(super) fn bad(message: &str, param: Option<&str>) -> ApiError {
    error(400, "BadRequestError", message, param)
}

/// A pydantic-style validation error (type "Bad Request").
pub(super) fn validation(kind: &str, loc: &str, msg: &str, input: &str, ctx: &str) -> ApiError {
    let message = format!("1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}', 'input': {input}{ctx}}}");
    error(400, "Bad Request", &message, Some(loc))
}

/// Python-repr-like rendering of a JSON value for validation messages.
pub(super) fn py_repr(v: &Value) -> String {
    match v {
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Null => "None".to_string(),
        Value::Bool(b) => if *b { "True" } else { "False" }.to_string(),
        Value::Object(m) => format!("'<dict of {} items>'", m.len()),
        other => other.to_string(),
    }
}

/// True for `application/json` (any parameters, any case).
pub fn is_json_content_type(ct: Option<&str>) -> bool {
    ct.and_then(|c| c.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// The byte offset Python's JSON decoder would report for a serde_json error.
fn json_error_pos(body: &[u8], e: &serde_json::Error) -> usize {
    let line_start: usize = body
        .split(|b| *b == b'\n')
        .take(e.line().saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    (line_start + e.column()).min(body.len())
}

/// The body as a JSON object, or vLLM's 400 for a wrong content type, bad JSON or a non-object.
pub(super) fn json_object(
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Map<String, Value>, ApiError> {
    if !is_json_content_type(content_type) {
        return Err(error(
            400,
            "Bad Request",
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            None,
        ));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        let loc = format!("body.{}", json_error_pos(body, &e));
        validation(
            "json_invalid",
            &loc,
            "JSON decode error",
            "'<dict of 0 items>'",
            ", 'ctx': {'error': 'Expecting value'}",
        )
    })?;
    let obj = match v {
        Value::Object(o) => o,
        other => {
            return Err(validation(
                "model_attributes_type",
                "body",
                "Input should be a valid dictionary or object to extract fields from",
                &py_repr(&other),
                "",
            ))
        }
    };
    Ok(obj)
}

/// Parses and validates a generation request body against `cfg`, in vLLM's order of checks.
pub fn parse(
    endpoint: Api,
    rules: &RequestRules,
    content_type: Option<&str>,
    body: &[u8],
    cfg: &SimConfig,
) -> Result<GenRequest, ApiError> {
    let owned = json_object(content_type, body)?;
    let obj = &owned;
    let (texts, prompt_tokens) = (rules.prompt)(obj)?;
    let openai = rules.openai_options;
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    // Responses and Messages streams always carry usage: they take no stream_options.
    let opts = obj.get("stream_options").filter(|o| openai && !o.is_null());
    if opts.is_some() && !stream {
        return Err(bad(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
            Some("stream_options"),
        ));
    }
    let flag = |k: &str| {
        opts.and_then(|o| o.get(k))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    };
    let include_usage = flag("include_usage");
    let continuous_usage = include_usage && flag("continuous_usage_stats");

    check_model(obj, cfg)?;
    if rules.requires_max_tokens && !obj.contains_key("max_tokens") {
        return Err(missing(obj, "max_tokens"));
    }
    if rules.refuses_empty_conversation && texts.is_empty() {
        return Err(bad(
            "Cannot apply chat template to an empty conversation. Provide at least one message.",
            None,
        ));
    }
    let n = match obj.get("n") {
        _ if !openai => 1,
        None | Some(Value::Null) => 1,
        Some(v) => v.as_i64().unwrap_or(0),
    };
    if n < 1 {
        return Err(bad(
            &format!("n must be at least 1, got {n}. (parameter=n, value={n})"),
            Some("n"),
        ));
    }
    if n > i64::from(cfg.max_num_seqs) {
        let msg = format!(
            "n={n} exceeds max_num_seqs={} of this simulator. (parameter=n, value={n})",
            cfg.max_num_seqs
        );
        return Err(bad(&msg, Some("n")));
    }
    let label = rules.max_tokens_label;
    let max_field = rules
        .max_tokens
        .iter()
        .find_map(|k| obj.get(*k).filter(|v| !v.is_null()));
    let requested = match max_field {
        None => None,
        Some(v) => {
            match v.as_i64() {
                Some(m) if m >= 1 => Some(m as u64),
                _ => {
                    let shown = v.to_string();
                    let msg = format!("{label} must be at least 1, got {shown}. (parameter={label}, value={shown})");
                    return Err(bad(&msg, Some(label)));
                }
            }
        }
    };
    if let Some(t) = obj.get("temperature").and_then(Value::as_f64) {
        if t < 0.0 {
            let shown = format!("{t:?}");
            let msg = format!("temperature must be non-negative, got {shown}. (parameter=temperature, value={shown})");
            return Err(bad(&msg, Some("temperature")));
        }
    }
    let len = cfg.max_model_len;
    if let Some(m) = requested {
        if m > len {
            let msg = format!("{label}={m} cannot be greater than max_model_len={len}. Please request fewer output tokens. (parameter={label}, value={m})");
            return Err(bad(&msg, Some(label)));
        }
    }
    if prompt_tokens > len {
        let over = len + 1;
        let msg = format!("This model's maximum context length is {len} tokens. However, your prompt contains at least {over} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={over})");
        return Err(bad(&msg, Some("input_tokens")));
    }
    let room = len - prompt_tokens;
    let max_tokens = match requested {
        Some(m) if m > room => {
            let msg = format!("'max_tokens' or 'max_completion_tokens' is too large: {m}. This model's maximum context length is {len} tokens and your request has {prompt_tokens} input tokens ({m} > {len} - {prompt_tokens}). (parameter=max_tokens, value={m})");
            return Err(bad(&msg, Some("max_tokens")));
        }
        Some(m) => m,
        None if room == 0 => {
            let msg = format!("This model's maximum context length is {len} tokens and your request has {prompt_tokens} input tokens, leaving no room for output. (parameter=input_tokens, value={prompt_tokens})");
            return Err(bad(&msg, Some("input_tokens")));
        }
        None => room,
    };
    let ignore_eos = obj
        .get("ignore_eos")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let seed = obj.get("seed").and_then(Value::as_i64).unwrap_or(0) as u64;
    let hash = texts.iter().fold(prompt::FNV_OFFSET, |h, t| {
        prompt::fnv1a(t.as_bytes(), prompt::fnv1a(b"\x1f", h))
    });
    let p = if ignore_eos {
        0.0
    } else {
        cfg.stop_probability_per_token
    };
    let stop_after = (0..n as u32)
        .map(|c| prompt::stop_after_tokens(hash, seed, c, p))
        .collect();
    let prompt_ids = if cfg.enable_prefix_caching {
        prompt_ids(endpoint, &texts, prompt_tokens)
    } else {
        Vec::new()
    };
    let tool = rules.tools.and_then(|shape| tools::forced(obj, shape));
    let echo = rules.echo.map(|read| Box::new(read(obj)));
    Ok(GenRequest {
        endpoint,
        stream,
        include_usage,
        continuous_usage,
        n: n as u32,
        prompt_tokens,
        prompt_ids,
        max_tokens,
        stop_after,
        tool,
        echo,
    })
}

/// The identities of a prompt's tokens (see [`prompt::chat_prompt_ids`]): a completions prompt
/// of token ids is its ids; empty when they cannot be told (never cached).
fn prompt_ids(endpoint: Api, texts: &[String], prompt_tokens: u64) -> Vec<u64> {
    let ids = match (endpoint, texts) {
        (Api::Completions, [one]) => {
            let ids = prompt::completion_prompt_ids(one);
            if ids.len() as u64 == prompt_tokens {
                ids
            } else {
                serde_json::from_str::<Vec<u64>>(one).unwrap_or_default()
            }
        }
        (Api::Completions, _) => Vec::new(),
        _ => prompt::chat_prompt_ids(texts),
    };
    if ids.len() as u64 == prompt_tokens {
        ids
    } else {
        Vec::new()
    }
}

/// 404 unless `model` is absent, null or the served name.
pub(super) fn check_model(obj: &Map<String, Value>, cfg: &SimConfig) -> Result<(), ApiError> {
    match obj.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if *m == cfg.served_model_name => Ok(()),
        Some(other) => {
            let name = other
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| other.to_string());
            let msg = format!(
                "The model `{name}` does not exist. Valid aliases: {}.",
                cfg.served_model_name
            );
            Err(error(404, "NotFoundError", &msg, Some("model")))
        }
    }
}

pub(super) fn missing(obj: &Map<String, Value>, field: &str) -> ApiError {
    let input = format!("'<dict of {} items>'", obj.len());
    validation(
        "missing",
        &format!("body.{field}"),
        "Field required",
        &input,
        "",
    )
}

/// The text of a content value: a string, or the concatenated `text` of its parts (Anthropic
/// `tool_result` parts count their own content, `tool_use` parts their input).
pub(super) fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("text").and_then(Value::as_str) {
                Some(t) => t.to_string(),
                None if p.get("content").is_some() => content_text(p.get("content")),
                None => p.get("input").map(Value::to_string).unwrap_or_default(),
            })
            .collect(),
        _ => String::new(),
    }
}
