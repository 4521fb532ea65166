//! The generation APIs the proxy measures, behind one interface: which route is which API, whether
//! a stream must be asked for its usage, and what each SSE event or non-streamed body says, read
//! into one [`EventSummary`] whatever the API. The proxy, its tracker and the meter only ever see
//! that summary; each API's JSON is known to its own file.
//!
//! Each API's file holds everything about it: its reader ([`Dialect`]) and its facts
//! ([`ApiSpec`]: name, route, OpenTelemetry operation, how a client writes a request). Adding an
//! API: one new file with both, one [`Api`] variant listed in [`Api::ALL`], and its arm in
//! [`Api::spec`].

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::error::ErrorShape;
use crate::fold::{AsStream, Unfoldable};
use crate::openai::ServerTimings;

pub(crate) mod chat;
pub(crate) mod completions;
pub(crate) mod messages;
pub(crate) mod responses;

/// A generation API, as logged in the `api` field and used as a bounded metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// OpenAI chat completions, `POST /v1/chat/completions`.
    Chat,
    /// OpenAI text completions, `POST /v1/completions`.
    Completions,
    /// OpenAI Responses, `POST /v1/responses`.
    Responses,
    /// Anthropic Messages, `POST /v1/messages`.
    Messages,
}

impl Api {
    /// Every API, in a stable order (tables, labels; [`detect`] tries them in it).
    pub const ALL: [Api; 4] = [Api::Chat, Api::Completions, Api::Responses, Api::Messages];

    /// Its facts, declared in its file.
    pub fn spec(self) -> &'static ApiSpec {
        match self {
            Api::Chat => &chat::SPEC,
            Api::Completions => &completions::SPEC,
            Api::Responses => &responses::SPEC,
            Api::Messages => &messages::SPEC,
        }
    }

    /// The name used in logs, labels, reports, `load --api` and the config.
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// The API of a logged name (`as_str`'s inverse).
    pub fn from_name(name: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|a| a.as_str() == name)
    }

    /// The route its requests go to (what `load` sends and `sim` serves).
    pub fn path(self) -> &'static str {
        self.spec().path
    }

    /// The OpenTelemetry GenAI operation name (`gen_ai.operation.name`).
    pub fn otel_operation(self) -> &'static str {
        self.spec().otel_operation
    }

    /// This API's reader.
    pub fn dialect(self) -> &'static dyn Dialect {
        self.spec().dialect
    }
}

/// The facts of one generation API that are not code, in one place: what the proxy, the log, the
/// metrics, OTLP, `load` and the simulator's router read about it.
pub struct ApiSpec {
    /// Which API this is.
    pub api: Api,
    /// Its name in logs, labels, reports, `load --api` and the config.
    pub name: &'static str,
    /// The route its requests go to (what `load` sends and `sim` serves; the proxy matches any
    /// prefix through [`Dialect::matches`]).
    pub path: &'static str,
    /// Its OpenTelemetry GenAI operation name (`gen_ai.operation.name`, one of the well-known
    /// values): the conversational APIs are `chat`, the legacy prompt-in, text-out one
    /// `text_completion`.
    pub otel_operation: &'static str,
    /// Its reader.
    pub dialect: &'static dyn Dialect,
    /// How a client writes its requests.
    pub client: ClientShape,
    /// The shape of the errors a client of this API reads (the proxy's own are written in it).
    pub error_shape: ErrorShape,
}

/// How a client (`load`) writes a request of an API. Whether a stream asks for usage follows from
/// [`Dialect::stream_usage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientShape {
    /// Where the prompt goes.
    pub prompt: PromptField,
    /// The member that limits the output.
    pub max_tokens: &'static str,
    /// The path of members that names the end user (`["user"]`; Anthropic's
    /// `["metadata", "user_id"]`).
    pub user: &'static [&'static str],
    /// How the client sends its API key.
    pub key: KeyHeader,
}

/// Where a request's prompt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptField {
    /// One user message in `messages`.
    UserMessage,
    /// A string in this member (`prompt`, `input`).
    Text(&'static str),
}

/// How a client sends its API key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// `x-api-key: <key>`, with the `anthropic-version` header set to `version`.
    XApiKey {
        /// The `anthropic-version` sent.
        version: &'static str,
    },
}

/// How a streamed request gets its token usage from the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamUsage {
    /// The stream carries usage unasked (Responses' `response.completed`, Messages'
    /// `message_start` and `message_delta`): nothing to inject, nothing to strip.
    Always,
    /// Only when the request sets `stream_options.include_usage` (OpenAI chat and completions);
    /// the proxy may ask on the client's behalf and remove the usage-only event it caused.
    IncludeUsageOption,
}

/// Token counts as every API reports them, under one set of names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenUsage {
    /// Prompt (input) tokens, cached ones included.
    pub input: Option<u64>,
    /// Generated (output) tokens, reasoning included; cumulative where the API repeats it.
    pub output: Option<u64>,
    /// Of `input`, tokens served from the prefix cache.
    pub cached_input: Option<u64>,
    /// Of `output`, reasoning tokens.
    pub reasoning: Option<u64>,
}

/// What one SSE event, or one whole non-streamed body, says, in terms common to every API.
#[derive(Debug, Default, PartialEq)]
pub struct EventSummary<'a> {
    /// Pieces of generated output in it: text, reasoning, tool-call name or arguments (chat: the
    /// choices that carry any; other APIs: 1 for a non-empty delta). 0 for role-only, start,
    /// bookkeeping and ping events.
    pub output: u32,
    /// Chat and completions: the length of `choices` (`vllm bench serve` takes its TTFT at the
    /// first event where it is non-zero). 0 for the other APIs.
    pub choices: u32,
    /// Token counts, when the event carries them.
    pub usage: Option<TokenUsage>,
    /// The API's own finish (stop) reason, when the event reports one.
    pub finish_reason: Option<Cow<'a, str>>,
    /// An error reported inside the response (an error event in a 200 stream, or an error body).
    pub error: bool,
    /// The API's terminal event: `[DONE]`, `response.completed` (and the other final
    /// `response.*` events), `message_stop`. After it, a client that closes has all it asked for.
    pub end: bool,
    /// An event that only carries usage (chat's `"choices": []` event): the one the proxy removes
    /// when it asked for usage itself.
    pub usage_only: bool,
    /// vLLM's per-request timings, when the upstream attaches them.
    pub server_timings: Option<ServerTimings>,
}

/// One generation API's reader.
///
/// Implementations must not allocate for the common events of a stream: `event` runs once per
/// SSE event on the data path.
pub trait Dialect: Send + Sync + 'static {
    /// Which API this is.
    fn api(&self) -> Api;

    /// Whether `path` (any `/u/<name>` prefix removed, no query) is this API's generation route.
    fn matches(&self, path: &str) -> bool;

    /// How a stream of this API gets its usage.
    fn stream_usage(&self) -> StreamUsage;

    /// Reads one SSE event's data (the data lines joined; comments never reach here), on its
    /// own.
    fn event<'a>(&self, data: &'a [u8]) -> Option<EventSummary<'a>>;

    /// A reader for the events of one stream, in order. A dialect that keeps nothing between
    /// events returns a reader without state, which a `Box` holds without allocating.
    fn stream_reader(&self) -> Box<dyn StreamReader>;

    /// Reads a whole non-streamed JSON body.
    fn body<'a>(&self, body: &'a [u8]) -> Option<EventSummary<'a>>;

    /// TTFT for non-streamed requests (`ttft_for_non_streamed`): the streamed request to send in
    /// place of the non-streamed `body`, with the fold that rebuilds vLLM's non-streamed answer
    /// from the stream (`crate::fold`, one file per API), or why the request must pass through
    /// unchanged. `Ok(None)` for a request that streams already.
    fn as_stream(&self, _body: &[u8]) -> Result<Option<AsStream>, Unfoldable> {
        Err(Unfoldable("this API has no fold"))
    }
}

/// One stream's reader: its events read in order, with what the reader learned from the earlier
/// events of the same stream (it may skip in an event what those showed it). Made by
/// [`Dialect::stream_reader`], one per response, so the state is the stream's own.
pub trait StreamReader: Send {
    /// Reads the stream's next event's data: what [`Dialect::event`] answers for it.
    fn next_event<'a>(&mut self, data: &'a [u8]) -> Option<EventSummary<'a>>;
}

/// A field carries output when it is a non-empty string or any other non-null value (text,
/// thinking, reasoning, refusal, tool input or arguments). The agent dialects count with it.
pub(super) fn carries(v: Option<&serde_json::value::RawValue>) -> bool {
    v.is_some_and(|v| v.get() != "\"\"" && v.get() != "null")
}

/// The generation API `path` belongs to (any `/u/<name>` prefix removed; a query is ignored).
/// Other routes, `/v1/messages/count_tokens` and `/v1/models` among them, are `None`: logged, never
/// counted as generation.
pub fn detect(path: &str) -> Option<Api> {
    let path = path.split('?').next().unwrap_or(path);
    Api::ALL.into_iter().find(|a| a.dialect().matches(path))
}

/// The shape of errors on `path`: its API's ([`ApiSpec::error_shape`]), for the API's route
/// and the routes under it (`/v1/messages/count_tokens` is Anthropic's too); OpenAI's for every
/// other path.
pub fn error_shape(path: &str) -> ErrorShape {
    let path = path.split('?').next().unwrap_or(path);
    let api = detect(path).or_else(|| {
        Api::ALL.into_iter().find(|a| {
            path.match_indices(a.path())
                .any(|(i, m)| path[i + m.len()..].starts_with('/'))
        })
    });
    api.map_or(ErrorShape::OpenAi, |a| a.spec().error_shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_shapes_follow_the_api() {
        assert_eq!(error_shape("/v1/messages"), ErrorShape::Messages);
        assert_eq!(
            error_shape("/u/ann/v1/messages?beta=true"),
            ErrorShape::Messages
        );
        assert_eq!(
            error_shape("/v1/messages/count_tokens"),
            ErrorShape::Messages
        );
        assert_eq!(error_shape("/v1/chat/completions"), ErrorShape::OpenAi);
        assert_eq!(error_shape("/v1/responses/resp_1"), ErrorShape::OpenAi);
        assert_eq!(error_shape("/v1/models"), ErrorShape::OpenAi);
        assert_eq!(error_shape("/v1/xmessages"), ErrorShape::OpenAi);
        assert_eq!(error_shape("/"), ErrorShape::OpenAi);
    }

    #[test]
    fn routes_are_detected() {
        assert_eq!(detect("/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(detect("/base/v1/chat/completions"), Some(Api::Chat));
        assert_eq!(detect("/v1/completions"), Some(Api::Completions));
        assert_eq!(detect("/v1/responses"), Some(Api::Responses));
        assert_eq!(detect("/v1/messages"), Some(Api::Messages));
        assert_eq!(detect("/v1/messages?beta=true"), Some(Api::Messages));
        assert_eq!(detect("/v1/messages/count_tokens"), None);
        assert_eq!(detect("/v1/responses/resp_1"), None);
        assert_eq!(detect("/v1/models"), None);
        assert_eq!(detect("/health"), None);
        assert_eq!(detect("/v1/xmessages"), None);
        for api in Api::ALL {
            assert_eq!(api.spec().api, api);
            assert_eq!(api.dialect().api(), api);
            assert_eq!(detect(api.path()), Some(api));
            assert_eq!(Api::from_name(api.as_str()), Some(api));
        }
    }
}
