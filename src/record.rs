//! The one record every proxied request produces: what the access log writes, what the meter
//! consumes and what `analyze` reads back.

use serde::{Deserialize, Serialize};

use crate::clock::UnixNanos;
use crate::dialect::Api;

mod line;

/// Version of the access-log line format; `analyze` skips lines of other versions.
pub const RECORD_SCHEMA: u32 = 1;

/// The prefix audit's verdicts (`prefix_audit`), in a stable order (metrics, reports).
pub const PREFIX_AUDIT_VERDICTS: [&str; 6] = [
    "kept",
    "lost",
    "first_call",
    "not_an_extension",
    "usage_unknown",
    "cached_unknown",
];

/// Longest `user_agent` logged, in characters (longer ones are cut).
pub const MAX_USER_AGENT_CHARS: usize = 256;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The upstream answered with a success status and the body ended cleanly.
    Ok,
    /// The upstream failed the request: it answered 5xx, 408 or 429, or sent an error event
    /// inside a 200 stream.
    UpstreamError,
    /// The client went away before the response was complete.
    ClientAborted,
    /// The upstream connection was lost before the body was complete.
    UpstreamAborted,
    /// A configured timeout fired (connect, response headers or idle body gap).
    Timeout,
    /// The proxy could not forward the request: the upstream unreachable (502) or no replica
    /// left to try.
    ProxyError,
    /// The client's own fault, not the server's: the upstream answered 4xx other than 408 and
    /// 429 (bad JSON, unknown model, a prompt too long), or the proxy refused the request itself
    /// (400, 401, 408 body too slow, 413, 431). Not an error of the box.
    ClientError,
}

impl Outcome {
    /// All outcomes, in a stable order (for metrics and reports).
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::UpstreamError,
        Outcome::ClientAborted,
        Outcome::UpstreamAborted,
        Outcome::Timeout,
        Outcome::ProxyError,
        Outcome::ClientError,
    ];

    /// The snake_case name used in logs and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::UpstreamError => "upstream_error",
            Outcome::ClientAborted => "client_aborted",
            Outcome::UpstreamAborted => "upstream_aborted",
            Outcome::Timeout => "timeout",
            Outcome::ProxyError => "proxy_error",
            Outcome::ClientError => "client_error",
        }
    }

    /// Whether this outcome is an error of the box (the upstream or the proxy failed), counted in
    /// windows' and totals' `errors`. The client's own doings (`client_aborted`, `client_error`)
    /// are not.
    pub fn is_error(self) -> bool {
        !matches!(
            self,
            Outcome::Ok | Outcome::ClientAborted | Outcome::ClientError
        )
    }

    /// The outcome of a request the upstream answered with `status` (and, inside a 200 stream,
    /// with an error event when `error_event`): `client_error` for a 4xx that is the client's
    /// fault, `upstream_error` for 5xx, 408 (the server gave up waiting), 429 (the server is
    /// overloaded) and error events, else `ok`.
    pub fn of_answer(status: Option<u16>, error_event: bool) -> Outcome {
        match status {
            Some(s) if is_client_fault(s) => Outcome::ClientError,
            Some(s) if s >= 400 => Outcome::UpstreamError,
            _ if error_event => Outcome::UpstreamError,
            _ => Outcome::Ok,
        }
    }
}

/// Whether an upstream's `status` says the request itself was at fault: 4xx other than 408
/// (Request Timeout) and 429 (Too Many Requests), which say the server could not serve it.
pub fn is_client_fault(status: u16) -> bool {
    (400..500).contains(&status) && status != 408 && status != 429
}

/// Where the token counts came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokensSource {
    /// The upstream's `usage` object.
    Usage,
    /// No usage arrived; completion tokens are the count of content-bearing events (an estimate).
    Counted,
    /// Nothing to count (errors, non-generation paths).
    None,
}

/// How the user was identified, in the configured order of sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserSource {
    /// A `/u/<name>/` path prefix.
    Path,
    /// The configured user header.
    Header,
    /// The configured API-key to name map.
    KeyMap,
    /// The request body's `user` field, or Anthropic's `metadata.user_id` when there is no `user`.
    Body,
    /// A pseudonym derived from the bearer key: `key-` + 8 hex of its SHA-256.
    KeyHash,
    /// The client's IP address.
    Ip,
}

/// Where a request's session came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionSource {
    /// A Codex header: `session-id`, `thread-id`, or `x-codex-turn-metadata`'s `session_id`.
    CodexHeader,
    /// Claude Code's `X-Claude-Code-Session-Id` header.
    ClaudeHeader,
    /// The body's `prompt_cache_key` (OpenAI clients that key their cache by conversation).
    PromptCacheKey,
    /// The `session_id` in Anthropic `metadata.user_id` when that is a JSON string.
    MetadataUserId,
    /// None of the above: a hash of the conversation's normalised opening.
    Fingerprint,
}

/// One finished request, exactly one per request on every path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Line type; always `"request"` for these records.
    #[serde(rename = "type")]
    pub kind: String,
    /// Line format version, [`RECORD_SCHEMA`].
    pub schema: u32,
    /// Arrival time (request head read), RFC 3339 UTC with microseconds.
    pub ts: String,
    /// Arrival time as Unix nanoseconds on the monotonic timeline (exact twin of `ts`).
    pub ts_ns: UnixNanos,
    /// The proxy's id for this request (unique within the process's lifetime).
    pub request_id: String,
    /// The request id the client sent in `request_id_header`, when it sent a valid one; that id,
    /// else `request_id`, is what the upstream and the client see in that header.
    #[serde(default)]
    pub client_request_id: Option<String>,
    /// Name of the upstream replica that answered (the last one tried); `null` when the request
    /// never reached one (rejected by the proxy first). Absent in lines written before it.
    #[serde(default)]
    pub upstream: Option<String>,
    /// Who sent it.
    pub user: String,
    /// How `user` was found.
    pub user_source: UserSource,
    /// The requested model (`model` in the body), if any.
    pub model: Option<String>,
    /// HTTP method.
    pub method: String,
    /// Request path as the client sent it (query string excluded: it may carry secrets).
    pub path: String,
    /// The client's `User-Agent`, cut to [`MAX_USER_AGENT_CHARS`] characters.
    #[serde(default)]
    pub user_agent: Option<String>,
    /// The client's IP address, when `access_log_client_ip` is on.
    #[serde(default)]
    pub client_ip: Option<String>,
    /// Status sent to the client (`null` when the client left before a status was sent).
    pub status: Option<u16>,
    /// Whether the request asked for a stream (absent = false; `null` when not a boolean or not JSON).
    pub stream: Option<bool>,
    /// How the request ended.
    pub outcome: Outcome,
    /// The generation API of the route (`null` for every other route, `count_tokens` included).
    #[serde(default)]
    pub api: Option<Api>,
    /// Prompt (input) tokens, from the API's usage, cached ones included.
    pub prompt_tokens: Option<u64>,
    /// Completion (output) tokens, from the API's usage (summed over choices), or counted (see
    /// `tokens_source`).
    pub completion_tokens: Option<u64>,
    /// Of `prompt_tokens`, those served from the prefix cache, when the upstream says.
    #[serde(default)]
    pub cached_prompt_tokens: Option<u64>,
    /// Of `completion_tokens`, reasoning tokens, when the upstream says.
    #[serde(default)]
    pub reasoning_tokens: Option<u64>,
    /// Where the token counts came from.
    pub tokens_source: TokensSource,
    /// Number of choices requested (`n`), when given.
    pub n: Option<u32>,
    /// Milliseconds from arrival to the first response body byte from upstream.
    pub first_byte_ms: Option<f64>,
    /// Milliseconds from arrival to the first streamed event that carries generated output of
    /// any kind (text, reasoning, tool-call name or arguments).
    pub ttft_ms: Option<f64>,
    /// How `ttft_ms` was obtained: `"stream"` (the first event of the client's stream that
    /// showed output), `"upstream_stream"` (the same, on the stream the proxy sent upstream in
    /// place of a non-streamed request); `"stream_end"` and `"upstream_stream_end"` when the
    /// stream generated tokens (usage > 0) but showed no output before it ended (a tool call
    /// whose arguments never streamed): the first event reporting the end (a finish reason or
    /// the API's terminal event), and then no TPOT. `null` when there is no TTFT.
    #[serde(default)]
    pub ttft_source: Option<String>,
    /// Why a non-streamed request of an API with `ttft_for_non_streamed` on was not, or not to
    /// the end, answered from a stream (it then passed through unchanged); `null` otherwise.
    #[serde(default)]
    pub ttft_fallback: Option<String>,
    /// Chat and completions streams: milliseconds from arrival to the first event with a
    /// non-empty `choices` array, role-only ones included (where `vllm bench serve` takes TTFT).
    #[serde(default)]
    pub bench_ttft_ms: Option<f64>,
    /// Milliseconds from arrival to the last body byte handed to the client.
    pub e2e_ms: Option<f64>,
    /// (e2e - ttft) / (completion_tokens - 1); `null` for fewer than 2 tokens or no TTFT.
    pub tpot_ms: Option<f64>,
    /// Largest gap between two output-carrying events, milliseconds.
    pub itl_max_ms: Option<f64>,
    /// Mean gap between two output-carrying events, milliseconds (`vllm bench serve`'s ITL).
    #[serde(default)]
    pub itl_mean_ms: Option<f64>,
    /// Median gap between two output-carrying events, milliseconds (from the request's
    /// histogram: within 4.5 % of the exact value).
    #[serde(default)]
    pub itl_p50_ms: Option<f64>,
    /// 99th percentile of the gaps between output-carrying events, milliseconds (histogram).
    #[serde(default)]
    pub itl_p99_ms: Option<f64>,
    /// completion_tokens / e2e, tokens per second.
    pub tok_s: Option<f64>,
    /// (completion_tokens - 1) / (e2e - ttft), tokens per second.
    pub decode_tok_s: Option<f64>,
    /// Whether the request met the service level (`[slo]`, see `slo::judge`); `null` when it
    /// was not judged (the client's own mistake, or a client that left early without waiting
    /// past the TTFT bound).
    #[serde(default)]
    pub slo_ok: Option<bool>,
    /// What it missed: `ttft`, `pace`, `ttft_pace`, `e2e` (a non-streamed request without a
    /// TTFT) or `error`; `null` when met or not judged.
    #[serde(default)]
    pub slo_miss: Option<crate::slo::SloMiss>,
    /// Requests in flight when this one arrived, itself included.
    pub in_flight_at_start: u32,
    /// First request after an idle gap longer than `cold_start_idle_s` (or the first ever).
    pub cold_start: bool,
    /// Finish reason of the first choice that reported one.
    pub finish_reason: Option<String>,
    /// Request body bytes received from the client.
    pub bytes_in: u64,
    /// Response body bytes sent to the client.
    pub bytes_out: u64,
    /// A short, secret-free description of what went wrong, when something did.
    pub error: Option<String>,
    /// vLLM's own queue time for this request (its per-request `metrics` object), ms.
    pub server_queue_ms: Option<f64>,
    /// vLLM's own TTFT for this request, ms.
    pub server_ttft_ms: Option<f64>,
    /// vLLM's own mean inter-token latency for this request, ms.
    pub server_mean_itl_ms: Option<f64>,
    /// The request's output tokens over time, as the live meter placed them (`token_curve`):
    /// `[ms, tokens]` pairs, the first the first token event (ms since arrival, its tokens),
    /// each next one ms since the previous point and the tokens made evenly over them; within
    /// 0.1 token of the stream's count at every event. `null` when no token passed before the
    /// end (non-streamed requests); absent in lines written before it.
    #[serde(default)]
    pub token_curve: Option<Vec<u32>>,
    /// The agent session (docs/sessions.md; this and the session fields below are left out of
    /// the line when `null`, so a request without a session costs no byte): a pseudonym, `s-` and 12 hex digits of the
    /// SHA-256 of the id the agent sent, or `f-` and 12 hex digits of the fingerprint of the
    /// conversation's opening; `null` for a request without either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Where `session` came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_source: Option<SessionSource>,
    /// The turn within the conversation, from 1: 1 + the user messages that follow model output
    /// or a tool's result; `null` without a conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// The call's rank in its session as this proxy saw it, from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_call: Option<u32>,
    /// Milliseconds from the end of the session's previous call to this call's arrival (the
    /// agent's tools, its thinking, the human); `null` for a first call or overlapping calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_gap_ms: Option<f64>,
    /// Prompt tokens a prefix cache could have served: the previous call's prompt and output
    /// tokens in whole blocks, at most the prompt less one token; `null` unless the call extends
    /// its session's previous call and both usages are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_expected_tokens: Option<u64>,
    /// `prefix_expected_tokens` less `cached_prompt_tokens` (at least 0): tokens prefilled
    /// again; `null` when either is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_lost_tokens: Option<u64>,
    /// The audit's verdict: `kept`, `lost`, `first_call`, `not_an_extension`, `usage_unknown`,
    /// `cached_unknown` (the server reported no cached tokens, nor had an earlier call of the
    /// session or of the same upstream); `null` without a session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_audit: Option<String>,
    /// The request's ITL samples, for the meter's windows and the Prometheus histogram; not
    /// logged (the line has its summary figures).
    #[serde(skip)]
    pub itl: Option<Box<crate::itl::ItlHistogram>>,
    /// The client's valid W3C `traceparent`, which the request's OTLP span continues; not
    /// logged.
    #[serde(skip)]
    pub trace: Option<crate::traceparent::TraceParent>,
}

impl RequestRecord {
    /// What the service-level verdict reads from this record.
    pub fn slo_input(&self) -> crate::slo::SloInput {
        use crate::slo::Ending;
        let status = self.status.unwrap_or(0);
        // 408 and 429 are the box's: it timed the request out or was too busy to take it.
        let clients_fault = (400..500).contains(&status) && status != 408 && status != 429;
        let ending = match self.outcome {
            Outcome::Ok => Ending::Complete,
            Outcome::ClientAborted => Ending::ClientGaveUp,
            Outcome::ClientError => Ending::Refused,
            Outcome::UpstreamError | Outcome::ProxyError if clients_fault => Ending::Refused,
            Outcome::UpstreamError
            | Outcome::ProxyError
            | Outcome::UpstreamAborted
            | Outcome::Timeout => Ending::Failed,
        };
        crate::slo::SloInput {
            ending,
            ttft_ms: self.ttft_ms,
            e2e_ms: self.e2e_ms,
            completion_tokens: self.completion_tokens,
            prompt_tokens: self.prompt_tokens,
            cached_prompt_tokens: self.cached_prompt_tokens,
        }
    }

    /// Sets `slo_ok` and `slo_miss` from the verdict against `slo`; only generation requests
    /// are judged.
    pub fn judge(&mut self, slo: &crate::slo::SloConfig) {
        let verdict = if self.is_generation() {
            crate::slo::judge(slo, &self.slo_input())
        } else {
            None
        };
        self.slo_ok = verdict.map(|v| v.is_ok());
        self.slo_miss = verdict.and_then(Result::err);
    }

    /// Whether this request was a generation (chat or text completion) that windows and the
    /// capacity curve account for; `/v1/models`, `/health` and the like are logged, not metered.
    pub fn is_generation(&self) -> bool {
        is_generation_path(&self.path)
    }

    /// Arrival time on the timeline.
    pub fn start_ns(&self) -> UnixNanos {
        self.ts_ns
    }

    /// End time on the timeline (arrival + e2e), or arrival when e2e is unknown.
    pub fn end_ns(&self) -> UnixNanos {
        self.ts_ns
            .saturating_add(self.e2e_ms.map(ms_to_ns).unwrap_or(0))
    }

    /// TTFT time on the timeline, when known.
    pub fn ttft_ns(&self) -> Option<UnixNanos> {
        self.ttft_ms
            .map(|ms| self.ts_ns + (ms * 1e6).round() as u64)
    }

    /// The record as one JSON line, newline included.
    pub fn to_json_line(&self) -> Vec<u8> {
        // Room for a typical line (700-1,000 bytes), so it is not regrown on the way.
        let mut out = Vec::with_capacity(1024);
        // Writing to a Vec cannot fail, and the record serializes without error.
        let _ = self.write_json_line(&mut out);
        out
    }

    /// Writes the record as one JSON line, newline included, straight into `out` (the access
    /// log's buffer: no line is built on the side).
    pub fn write_json_line<W: std::io::Write>(&self, mut out: W) -> std::io::Result<()> {
        line::write(&mut out, self)
    }
}

/// Milliseconds to nanoseconds; negative, NaN or huge values (corrupt lines) saturate.
fn ms_to_ns(ms: f64) -> u64 {
    // `as` saturates for floats: NaN and negatives give 0, overflow gives u64::MAX.
    (ms * 1e6).round() as u64
}

/// Whether `path` (after any `/u/<name>` prefix was stripped) is a generation endpoint of one of
/// the APIs the proxy reads.
pub fn is_generation_path(path: &str) -> bool {
    crate::dialect::detect(path).is_some()
}

/// Derived timing figures, computed one way for the proxy and for anything re-deriving them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DerivedRates {
    /// (e2e - ttft) / (completion_tokens - 1).
    pub tpot_ms: Option<f64>,
    /// completion_tokens / e2e.
    pub tok_s: Option<f64>,
    /// (completion_tokens - 1) / (e2e - ttft).
    pub decode_tok_s: Option<f64>,
}

impl DerivedRates {
    /// Computes the rates from TTFT, e2e and completion tokens; unknown inputs give `None`.
    pub fn compute(
        ttft_ms: Option<f64>,
        e2e_ms: Option<f64>,
        completion_tokens: Option<u64>,
    ) -> Self {
        let mut r = DerivedRates::default();
        if let (Some(e2e), Some(tokens)) = (e2e_ms, completion_tokens) {
            if e2e > 0.0 && tokens > 0 {
                r.tok_s = Some(tokens as f64 / (e2e / 1e3));
            }
            if let Some(ttft) = ttft_ms {
                let decode_ms = e2e - ttft;
                if tokens >= 2 && decode_ms > 0.0 {
                    r.tpot_ms = Some(decode_ms / (tokens - 1) as f64);
                    r.decode_tok_s = Some((tokens - 1) as f64 / (decode_ms / 1e3));
                }
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_rates_follow_the_definitions() {
        let r = DerivedRates::compute(Some(100.0), Some(1100.0), Some(11));
        assert_eq!(r.tpot_ms, Some(100.0));
        assert_eq!(r.decode_tok_s, Some(10.0));
        assert!((r.tok_s.unwrap() - 10.0).abs() < 1e-9);
        let one = DerivedRates::compute(Some(100.0), Some(100.0), Some(1));
        assert_eq!(one.tpot_ms, None);
        assert_eq!(one.decode_tok_s, None);
        assert_eq!(one.tok_s, Some(10.0));
        assert_eq!(
            DerivedRates::compute(None, None, Some(3)),
            DerivedRates::default()
        );
    }

    #[test]
    fn client_faults_are_told_from_the_servers() {
        use Outcome::*;
        for (status, event, want) in [
            (Some(200), false, Ok),
            (Some(200), true, UpstreamError),
            (Some(400), false, ClientError),
            (Some(404), false, ClientError),
            (Some(422), true, ClientError),
            (Some(408), false, UpstreamError),
            (Some(429), false, UpstreamError),
            (Some(500), false, UpstreamError),
            (Some(503), false, UpstreamError),
            (None, false, Ok),
        ] {
            assert_eq!(
                Outcome::of_answer(status, event),
                want,
                "{status:?} {event}"
            );
        }
        assert!(!ClientError.is_error() && !ClientAborted.is_error() && !Ok.is_error());
        assert!(UpstreamError.is_error() && ProxyError.is_error() && Timeout.is_error());
    }

    #[test]
    fn generation_paths() {
        assert!(is_generation_path("/v1/chat/completions"));
        assert!(is_generation_path("/v1/completions"));
        assert!(!is_generation_path("/v1/models"));
        assert!(!is_generation_path("/health"));
        assert!(is_generation_path("/v1/responses"));
        assert!(is_generation_path("/v1/messages"));
        assert!(!is_generation_path("/v1/messages/count_tokens"));
    }
}
