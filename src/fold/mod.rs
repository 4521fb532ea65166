//! TTFT for non-streamed requests: a non-streamed generation request is sent upstream as a
//! stream, measured like any stream, and answered with the JSON object vLLM would have sent for
//! the request as the client wrote it.
//!
//! Two halves per API, each in that API's file:
//! - the *rule*: which requests may be sent as streams. It is decided before anything is sent, so it
//!   only admits requests whose streamed answer is known to rebuild into vLLM's non-streamed one
//!   (docs/proxy.md, "TTFT for non-streamed requests", lists what is refused and why);
//! - the *fold*: a pure accumulator fed the stream's SSE events, holding only what the answer
//!   needs (its text, logprobs, finish reasons, usage), that writes vLLM 0.32's non-streamed JSON
//!   with the same members in the same order. Anything in the stream it does not know stops it
//!   ([`Unfoldable`]): the proxy then asks vLLM again, non-streamed, instead of guessing.
//!
//! Each API's dialect (`crate::dialect`) offers its file's `as_stream` as `Dialect::as_stream`: adding
//! an API is one file here and that one method in its dialect.

pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod messages;
pub(crate) mod pyjson;
pub(crate) mod responses;

use bytes::Bytes;
use serde_json::{Map, Value};

/// Why a request or a stream cannot give vLLM's exact non-streamed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unfoldable(pub &'static str);

/// A non-streamed request turned into a streamed one.
pub struct AsStream {
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

/// An accumulator that turns one API's stream into its non-streamed answer.
pub trait Fold: Send {
    /// Takes one SSE event's data (`[DONE]` included).
    fn feed(&mut self, data: &[u8]) -> Result<(), Unfoldable>;
    /// The answer, once the stream has ended; `Unfoldable` when the stream did not finish
    /// the way a complete answer does.
    fn finish(&mut self) -> Result<Folded, Unfoldable>;
    /// Bytes of answer held so far (what `max_response_scan_bytes` bounds).
    fn held_bytes(&self) -> usize;
}

/// Reads a non-streamed request `body` of an API whose `refusal` and fold are given, and returns
/// the streamed request to send instead with the fold that will rebuild its answer, or why the
/// request must pass through unchanged. `ask_usage`: the API sends usage in a stream only when
/// asked (chat, completions). `Ok(None)`: the request streams already (nothing to do).
pub(crate) fn as_stream_request(
    body: &[u8],
    refusal: fn(&Map<String, Value>) -> Option<&'static str>,
    ask_usage: bool,
    fold: fn(&Map<String, Value>) -> Box<dyn Fold>,
) -> Result<Option<AsStream>, Unfoldable> {
    let Ok(Value::Object(mut req)) = serde_json::from_slice::<Value>(body) else {
        return Err(Unfoldable("request body is not a JSON object"));
    };
    match req.get("stream") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => return Ok(None),
        Some(_) => return Err(Unfoldable("stream is not a boolean")),
    }
    if let Some(why) = refusal(&req) {
        return Err(Unfoldable(why));
    }
    let fold = fold(&req);
    req.insert("stream".into(), Value::Bool(true));
    if ask_usage {
        let mut opts = Map::new();
        opts.insert("include_usage".into(), Value::Bool(true));
        req.insert("stream_options".into(), Value::Object(opts));
    }
    let out = serde_json::to_vec(&req).map_err(|_| Unfoldable("request not writable"))?;
    Ok(Some(AsStream {
        body: Bytes::from(out),
        fold,
    }))
}

/// Whether member `key` is present with a value that asks for something: anything but
/// `null`, `false`, `[]`, `{}` or `""`.
pub(crate) fn asks(req: &Map<String, Value>, key: &str) -> bool {
    match req.get(key) {
        None | Some(Value::Null | Value::Bool(false)) => false,
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
