//! Parsing one access-log line into the few fields `analyze` needs, borrowing strings from the
//! line buffer whenever they carry no escapes.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::clock::{parse_rfc3339, UnixNanos};
use crate::dialect::Api;
use crate::record::{is_generation_path, Outcome, RequestRecord, RECORD_SCHEMA};

/// Longest plausible `e2e_ms` / `ttft_ms` (one day); larger values make the line bad.
pub const MAX_LATENCY_MS: f64 = 86_400_000.0;

/// A string borrowed from the line when possible, owned when it had escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Str<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Every field `analyze` reads, all optional so that lines of other types still parse.
#[derive(Debug, Deserialize)]
struct RawLine<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Str<'a>>,
    schema: Option<u64>,
    #[serde(borrow)]
    ts: Option<Str<'a>>,
    ts_ns: Option<u64>,
    #[serde(borrow)]
    user: Option<Str<'a>>,
    #[serde(borrow)]
    model: Option<Str<'a>>,
    #[serde(borrow)]
    upstream: Option<Str<'a>>,
    #[serde(borrow)]
    path: Option<Str<'a>>,
    stream: Option<bool>,
    status: Option<u16>,
    outcome: Option<Outcome>,
    #[serde(borrow)]
    api: Option<Str<'a>>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    ttft_ms: Option<f64>,
    e2e_ms: Option<f64>,
    tok_s: Option<f64>,
    in_flight_at_start: Option<u32>,
    cold_start: Option<bool>,
    cached_prompt_tokens: Option<u64>,
    /// `Some(None)`: the key is there with `null` (not judged); `None`: a line from before the
    /// verdict existed.
    #[serde(default, deserialize_with = "present")]
    slo_ok: Option<Option<bool>>,
    slo_miss: Option<crate::slo::SloMiss>,
    #[serde(borrow)]
    token_curve: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    session: Option<Str<'a>>,
    session_source: Option<crate::record::SessionSource>,
    turn: Option<u32>,
    session_gap_ms: Option<f64>,
    prefix_expected_tokens: Option<u64>,
    prefix_lost_tokens: Option<u64>,
    #[serde(borrow)]
    prefix_audit: Option<Str<'a>>,
}

/// A key that is present, whatever its value (`null` included).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Only the line type, for lines whose other fields did not fit [`RawLine`].
#[derive(Debug, Deserialize)]
struct TypeOnly<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<Str<'a>>,
}

/// Why a line was skipped as bad.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BadReason {
    /// Not a JSON object (random bytes, truncated line, invalid UTF-8).
    NotJson,
    /// A `request` line without a field every record has.
    MissingField,
    /// A `request` line with a `schema` other than the supported one.
    UnknownSchema,
    /// A field of the wrong type, or an impossible value (negative or non-finite latency, more
    /// than a day long).
    InvalidValue,
    /// A line longer than the reader's limit.
    TooLong,
}

impl BadReason {
    /// All reasons, in report order.
    pub const ALL: [BadReason; 5] = [
        BadReason::NotJson,
        BadReason::MissingField,
        BadReason::UnknownSchema,
        BadReason::InvalidValue,
        BadReason::TooLong,
    ];
}

/// The fields of one valid request line.
#[derive(Debug, Clone)]
pub struct LeanRecord<'a> {
    /// Arrival, Unix ns (`ts_ns`, else parsed from `ts`).
    pub ts_ns: UnixNanos,
    /// Who sent it.
    pub user: Cow<'a, str>,
    /// The requested model.
    pub model: Option<Cow<'a, str>>,
    /// The upstream replica that answered, when the line names one.
    pub upstream: Option<Cow<'a, str>>,
    /// Whether the path is a generation endpoint.
    pub generation: bool,
    /// The generation API: the line's `api`, else known by the path (lines written before the
    /// field existed).
    pub api: Option<Api>,
    /// Whether the request streamed.
    pub stream: Option<bool>,
    /// How it ended.
    pub outcome: Outcome,
    /// Prompt tokens.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens.
    pub completion_tokens: Option<u64>,
    /// TTFT, ms.
    pub ttft_ms: Option<f64>,
    /// End-to-end latency, ms.
    pub e2e_ms: Option<f64>,
    /// completion_tokens / e2e.
    pub tok_s: Option<f64>,
    /// Requests in flight at arrival, itself included.
    pub in_flight_at_start: u32,
    /// The upstream's (or the proxy's) status.
    pub status: Option<u16>,
    /// Prompt tokens served from vLLM's prefix cache.
    pub cached_prompt_tokens: Option<u64>,
    /// The logged service-level verdict: `Some(None)` logged as not judged, `None` a line
    /// written before the verdict existed.
    pub slo_ok: Option<Option<bool>>,
    /// What it missed.
    pub slo_miss: Option<crate::slo::SloMiss>,
    /// First request after an idle gap.
    pub cold_start: bool,
    /// The `token_curve` array's text, checked by [`curve_values`]; `None` when the line has
    /// none (`null`, or written before the field).
    pub token_curve: Option<&'a str>,
    /// The agent session's fields (docs/sessions.md); `None` for a line without a session.
    pub session: Option<LeanSession<'a>>,
}

/// A line's session fields.
#[derive(Debug, Clone)]
pub struct LeanSession<'a> {
    /// The pseudonym.
    pub name: Cow<'a, str>,
    /// Where it came from.
    pub source: Option<crate::record::SessionSource>,
    /// The turn.
    pub turn: Option<u32>,
    /// `session_gap_ms`.
    pub gap_ms: Option<f64>,
    /// `prefix_expected_tokens`.
    pub expected: Option<u64>,
    /// `prefix_lost_tokens`.
    pub lost: Option<u64>,
    /// `prefix_audit`.
    pub audit: Option<Cow<'a, str>>,
}

/// Calls `value` for each number of a `token_curve` array's text; whether the text is a curve
/// (integers that fit in 32 bits, whole pairs, at least one).
pub fn curve_values(text: &str, mut value: impl FnMut(u32)) -> bool {
    let Some(inner) = text
        .trim()
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
    else {
        return false;
    };
    let mut n = 0usize;
    for item in inner.split(',') {
        match item.trim().parse::<u32>() {
            Ok(v) => value(v),
            Err(_) => return false,
        }
        n += 1;
    }
    n % 2 == 0
}

/// What one line turned out to be.
#[derive(Debug)]
// One `Parsed` lives on the stack for one line; boxing the record would allocate per line.
#[allow(clippy::large_enum_variant)]
pub enum Parsed<'a> {
    /// A valid request record.
    Request(LeanRecord<'a>),
    /// A JSON object of another `type` (skipped silently).
    Other,
    /// Nothing but whitespace (skipped silently).
    Blank,
    /// A bad line.
    Bad(BadReason),
}

fn latency_ok(v: Option<f64>) -> bool {
    v.is_none_or(|v| v.is_finite() && (0.0..=MAX_LATENCY_MS).contains(&v))
}

/// Classifies and parses one line (without its newline).
pub fn parse_line(line: &[u8]) -> Parsed<'_> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Parsed::Blank;
    }
    // One fast whole-line UTF-8 check, so the JSON reader need not re-validate every string.
    let Ok(line) = std::str::from_utf8(line) else {
        return Parsed::Bad(BadReason::NotJson);
    };
    let raw: RawLine = match serde_json::from_str(line) {
        Ok(raw) => raw,
        Err(e) => {
            if e.is_data() {
                // A well-formed object whose fields did not fit: another type is still "other".
                if let Ok(TypeOnly { kind: Some(k) }) = serde_json::from_str::<TypeOnly>(line) {
                    if k.0 != "request" {
                        return Parsed::Other;
                    }
                }
                return Parsed::Bad(BadReason::InvalidValue);
            }
            return Parsed::Bad(BadReason::NotJson);
        }
    };
    match raw.kind.as_ref().map(|k| k.0.as_ref()) {
        Some("request") => {}
        Some(_) => return Parsed::Other,
        None => return Parsed::Bad(BadReason::MissingField),
    }
    match raw.schema {
        Some(s) if s == RECORD_SCHEMA as u64 => {}
        Some(_) => return Parsed::Bad(BadReason::UnknownSchema),
        None => return Parsed::Bad(BadReason::MissingField),
    }
    let ts_ns = raw
        .ts_ns
        .or_else(|| raw.ts.as_ref().and_then(|t| parse_rfc3339(&t.0)));
    let (Some(ts_ns), Some(user), Some(path), Some(outcome), Some(ifs), Some(cold)) = (
        ts_ns,
        raw.user,
        raw.path,
        raw.outcome,
        raw.in_flight_at_start,
        raw.cold_start,
    ) else {
        return Parsed::Bad(BadReason::MissingField);
    };
    let token_curve = raw
        .token_curve
        .map(serde_json::value::RawValue::get)
        .filter(|c| *c != "null");
    if !latency_ok(raw.e2e_ms)
        || !latency_ok(raw.ttft_ms)
        || raw.tok_s.is_some_and(|v| !v.is_finite())
        || token_curve.is_some_and(|c| !curve_values(c, |_| {}))
    {
        return Parsed::Bad(BadReason::InvalidValue);
    }
    Parsed::Request(LeanRecord {
        ts_ns,
        user: user.0,
        model: raw.model.map(|m| m.0),
        upstream: raw.upstream.map(|m| m.0),
        generation: is_generation_path(&path.0),
        api: raw
            .api
            .and_then(|a| Api::from_name(&a.0))
            .or_else(|| crate::dialect::detect(&path.0)),
        stream: raw.stream,
        outcome: with_client_faults(outcome, raw.status),
        prompt_tokens: raw.prompt_tokens,
        completion_tokens: raw.completion_tokens,
        ttft_ms: raw.ttft_ms,
        e2e_ms: raw.e2e_ms,
        tok_s: raw.tok_s,
        in_flight_at_start: ifs,
        status: raw.status,
        cached_prompt_tokens: raw.cached_prompt_tokens,
        slo_ok: raw.slo_ok,
        slo_miss: raw.slo_miss,
        cold_start: cold,
        token_curve,
        session: raw.session.map(|name| LeanSession {
            name: name.0,
            source: raw.session_source,
            turn: raw.turn,
            gap_ms: raw.session_gap_ms,
            expected: raw.prefix_expected_tokens,
            lost: raw.prefix_lost_tokens,
            audit: raw.prefix_audit.map(|a| a.0),
        }),
    })
}

/// A line written before `client_error` existed read as it would be written now: the
/// upstream's 4xx for a bad request was `upstream_error`, and the proxy's own refusals for the
/// client's fault (400, 401, 408, 413) were `proxy_error`; the status tells them apart.
fn with_client_faults(outcome: Outcome, status: Option<u16>) -> Outcome {
    match (outcome, status) {
        (Outcome::UpstreamError, Some(s)) if crate::record::is_client_fault(s) => {
            Outcome::ClientError
        }
        (Outcome::ProxyError, Some(s)) if (400..500).contains(&s) => Outcome::ClientError,
        (o, _) => o,
    }
}

impl LeanRecord<'_> {
    /// Copies the fields the shared attribution and accumulation read into a reusable
    /// `RequestRecord` (its strings are left alone, so nothing is allocated).
    pub fn fill(&self, r: &mut RequestRecord) {
        r.ts_ns = self.ts_ns;
        r.stream = self.stream;
        r.outcome = self.outcome;
        r.prompt_tokens = self.prompt_tokens;
        r.completion_tokens = self.completion_tokens;
        r.ttft_ms = self.ttft_ms;
        r.e2e_ms = self.e2e_ms;
        r.tok_s = self.tok_s;
        r.in_flight_at_start = self.in_flight_at_start;
        r.cold_start = self.cold_start;
        r.status = self.status;
        r.cached_prompt_tokens = self.cached_prompt_tokens;
        r.slo_ok = self.slo_ok.flatten();
        r.slo_miss = self.slo_miss;
    }
}

/// A blank `RequestRecord` used as the reusable scratch for [`LeanRecord::fill`].
pub fn scratch_record() -> RequestRecord {
    use crate::record::{TokensSource, UserSource};
    RequestRecord {
        kind: "request".into(),
        schema: RECORD_SCHEMA,
        ts: String::new(),
        ts_ns: 0,
        request_id: String::new(),
        client_request_id: None,
        upstream: None,
        user: String::new(),
        user_source: UserSource::Header,
        model: None,
        method: String::new(),
        path: "/v1/chat/completions".into(),
        user_agent: None,
        client_ip: None,
        status: None,
        stream: None,
        outcome: Outcome::Ok,
        api: Some(crate::dialect::Api::Chat),
        prompt_tokens: None,
        completion_tokens: None,
        cached_prompt_tokens: None,
        reasoning_tokens: None,
        tokens_source: TokensSource::Usage,
        n: None,
        first_byte_ms: None,
        ttft_ms: None,
        bench_ttft_ms: None,
        e2e_ms: None,
        tpot_ms: None,
        itl_max_ms: None,
        ttft_source: None,
        ttft_fallback: None,
        itl_mean_ms: None,
        itl_p50_ms: None,
        itl_p99_ms: None,
        tok_s: None,
        decode_tok_s: None,
        slo_ok: None,
        slo_miss: None,
        in_flight_at_start: 0,
        cold_start: false,
        finish_reason: None,
        bytes_in: 0,
        bytes_out: 0,
        error: None,
        server_queue_ms: None,
        server_ttft_ms: None,
        server_mean_itl_ms: None,
        token_curve: None,
        session: None,
        session_source: None,
        turn: None,
        session_call: None,
        session_gap_ms: None,
        prefix_expected_tokens: None,
        prefix_lost_tokens: None,
        prefix_audit: None,
        itl: None,
        trace: None,
    }
}
