//! TTFT for non-streamed requests: a non-streamed generation request is sent upstream as a
//! stream, measured like any stream, and answered with the JSON object vLLM would have sent for
//! the request as the client wrote it.
//!
//! Two halves per API, each in that API's file:
//! - the *rule*: which requests may be upgraded. It is decided before anything is sent, so it
//!   only admits requests whose streamed answer is known to rebuild into vLLM's non-streamed one
//!   (README, "TTFT for non-streamed requests", lists what is refused and why);
//! - the *fold*: a pure accumulator fed the stream's SSE events, holding only what the answer
//!   needs (its text, logprobs, finish reasons, usage), that writes vLLM 0.32's non-streamed JSON
//!   with the same members in the same order. Anything in the stream it does not know stops it
//!   ([`Unfoldable`]): the proxy then asks vLLM again, non-streamed, instead of guessing.
//!
//! Adding an API is one file here and one arm in [`Api`].

pub mod chat;
pub mod completions;
pub mod messages;
pub mod pyjson;
pub mod responses;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::openai::Usage;

/// `ttft_for_non_streamed`: per API, whether its non-streamed requests are sent upstream as
/// streams to measure their TTFT. All off by default: the upstream then sees exactly the
/// client's request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpgradeConfig {
    /// `POST /v1/chat/completions`.
    pub chat: bool,
    /// `POST /v1/completions`.
    pub completions: bool,
    /// `POST /v1/messages`.
    pub messages: bool,
    /// `POST /v1/responses`.
    pub responses: bool,
}

impl UpgradeConfig {
    /// Whether `api`'s non-streamed requests are upgraded.
    pub fn enabled(&self, api: Api) -> bool {
        match api {
            Api::Chat => self.chat,
            Api::Completions => self.completions,
            Api::Messages => self.messages,
            Api::Responses => self.responses,
        }
    }
}

/// The generation APIs whose non-streamed requests can be upgraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/messages` (Anthropic Messages).
    Messages,
    /// `POST /v1/responses` (OpenAI Responses).
    Responses,
}

/// Why a request or a stream cannot give vLLM's exact non-streamed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unfoldable(pub &'static str);

/// A non-streamed request turned into a streamed one.
pub struct Upgrade {
    /// The request body to send upstream instead of the client's.
    pub body: Bytes,
    /// The fold that rebuilds the client's answer from the stream.
    pub fold: Box<dyn Fold>,
}

/// What the client receives once the stream is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Folded {
    /// The rebuilt non-streamed answer (status 200).
    Answer(Vec<u8>),
    /// An error event inside the stream, as the error response vLLM sends non-streamed.
    Error {
        /// HTTP status of that response.
        status: u16,
        /// Its JSON body.
        body: Vec<u8>,
    },
}

/// What one event says, for measurement: the same facts the proxy reads from a client's stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Choices (or, for Messages and Responses, output items) the event is about; 0 for events
    /// that carry no output position at all (usage-only, lifecycle events).
    pub choices: u32,
    /// How many of them carry generated output (text, logprobs-bearing tokens).
    pub content_choices: u32,
    /// A finish (stop) reason, when the event carries one.
    pub finish_reason: Option<String>,
    /// Token counts, when the event carries them.
    pub usage: Option<Usage>,
    /// The event is an error event.
    pub error: bool,
}

/// An accumulator that turns one API's stream into its non-streamed answer.
pub trait Fold: Send {
    /// Takes one SSE event's data (`[DONE]` included).
    fn feed(&mut self, data: &[u8]) -> Result<Observed, Unfoldable>;
    /// The answer, once the stream has ended; `Unfoldable` when the stream did not finish
    /// the way a complete answer does.
    fn finish(&mut self) -> Result<Folded, Unfoldable>;
    /// Bytes of answer held so far (what `max_response_scan_bytes` bounds).
    fn held_bytes(&self) -> usize;
}

impl Api {
    /// Every API, in the order settings and docs list them.
    pub const ALL: [Api; 4] = [Api::Chat, Api::Completions, Api::Messages, Api::Responses];

    /// The API served at `path` (the path as forwarded, without a user prefix or query).
    pub fn from_path(path: &str) -> Option<Api> {
        match path {
            "/v1/chat/completions" => Some(Api::Chat),
            "/v1/completions" => Some(Api::Completions),
            "/v1/messages" => Some(Api::Messages),
            "/v1/responses" => Some(Api::Responses),
            _ => None,
        }
    }

    /// The setting's and the log's name for this API.
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Messages => "messages",
            Api::Responses => "responses",
        }
    }

    /// Reads a non-streamed request `body` and returns the streamed request to send instead with
    /// the fold that will rebuild its answer, or why the request must pass through unchanged.
    /// `Ok(None)`: the request is not a non-streamed one (nothing to do, nothing to report).
    pub fn upgrade(self, body: &[u8]) -> Result<Option<Upgrade>, Unfoldable> {
        let Ok(Value::Object(mut req)) = serde_json::from_slice::<Value>(body) else {
            return Err(Unfoldable("request body is not a JSON object"));
        };
        match req.get("stream") {
            None | Some(Value::Bool(false)) => {}
            Some(Value::Bool(true)) => return Ok(None),
            Some(_) => return Err(Unfoldable("stream is not a boolean")),
        }
        if let Some(why) = self.refusal(&req) {
            return Err(Unfoldable(why));
        }
        let fold: Box<dyn Fold> = match self {
            Api::Chat => Box::new(chat::ChatFold::new(&req)),
            Api::Completions => Box::new(completions::CompletionsFold::new(&req)),
            Api::Messages => Box::new(messages::MessagesFold::default()),
            Api::Responses => Box::new(responses::ResponsesFold::default()),
        };
        req.insert("stream".into(), Value::Bool(true));
        if matches!(self, Api::Chat | Api::Completions) {
            // These APIs send usage in a stream only when asked; Messages and Responses always do.
            let mut opts = Map::new();
            opts.insert("include_usage".into(), Value::Bool(true));
            req.insert("stream_options".into(), Value::Object(opts));
        }
        let out = serde_json::to_vec(&req).map_err(|_| Unfoldable("request not writable"))?;
        Ok(Some(Upgrade {
            body: Bytes::from(out),
            fold,
        }))
    }

    /// Why a request of this API must pass through, if it must.
    fn refusal(self, req: &Map<String, Value>) -> Option<&'static str> {
        match self {
            Api::Chat => chat::refusal(req),
            Api::Completions => completions::refusal(req),
            Api::Messages => messages::refusal(req),
            Api::Responses => responses::refusal(req),
        }
    }
}

/// Whether member `key` is present with a value that asks for something: anything but
/// `null`, `false`, `[]`, `{}` or `""`.
pub(crate) fn asks(req: &Map<String, Value>, key: &str) -> bool {
    match req.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

/// The first of `keys` that asks for something (see [`asks`]).
pub(crate) fn first_asking<'k>(req: &Map<String, Value>, keys: &[&'k str]) -> Option<&'k str> {
    keys.iter().copied().find(|k| asks(req, k))
}

/// `n`, when given: 1 when absent or null; `None` when it is not a positive integer.
pub(crate) fn choices_asked(req: &Map<String, Value>) -> Option<u32> {
    match req.get("n") {
        None | Some(Value::Null) => Some(1),
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=128).contains(n))
            .map(|n| n as u32),
    }
}

/// The escaped text between the quotes of a raw JSON string, or `None` when `raw` is no string.
pub(crate) fn string_inner(raw: &str) -> Option<&str> {
    let s = raw.strip_prefix('"')?.strip_suffix('"')?;
    Some(s)
}

/// A raw JSON value that is `null` (or absent).
pub(crate) fn is_null(raw: Option<&serde_json::value::RawValue>) -> bool {
    raw.is_none_or(|v| v.get() == "null")
}

/// Appends `raw`, or `null` when absent.
pub(crate) fn push_raw_or_null(out: &mut Vec<u8>, raw: Option<&str>) {
    out.extend_from_slice(raw.unwrap_or("null").as_bytes());
}

/// An in-stream `{"error": {...}}` event of the OpenAI-style APIs as the non-streamed error vLLM
/// sends: the same object written compactly (the stream's event is Python's `json.dumps` with its
/// default `", "` separators and ASCII escapes; the non-streamed one is compact UTF-8), with the
/// status in its `code` (400 when missing, as vLLM's default for a streamed error).
pub(crate) fn openai_error(data: &[u8]) -> Option<Folded> {
    let v: Value = serde_json::from_slice(data).ok()?;
    let err = v.get("error")?;
    let status = err
        .get("code")
        .and_then(Value::as_u64)
        .filter(|c| (400..=599).contains(c))
        .unwrap_or(400) as u16;
    Some(Folded::Error {
        status,
        body: serde_json::to_vec(&v).ok()?,
    })
}
