//! The report: every section `analyze` prints, as one serializable value.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::meter::capacity::CapacityRow;
use crate::meter::summary::{MinMeanMax, Percentiles};

use super::parse::BadReason;

/// Version of the `--json` report layout (see `schemas/analyze.schema.json`).
pub const REPORT_VERSION: u32 = 1;

/// Everything `analyze` found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always `"tokenmeter-analyze"`.
    pub report: &'static str,
    /// [`REPORT_VERSION`].
    pub version: u32,
    /// What was read.
    pub inputs: Inputs,
    /// Totals over the selected requests.
    pub summary: Summary,
    /// Per-second reconstruction and steady windows.
    pub timeline: TimelineReport,
    /// The capacity curve (steady seconds only), rows by N.
    pub capacity: Vec<CapacityRow>,
    /// The capacity curve from production traffic (all clean time at each level), rows by N;
    /// the `/stats` names.
    pub capacity_production: Vec<crate::meter::levels::ProductionRow>,
    /// Capacity at the service level: the same view `/stats` gives, from the same counts.
    pub service_level: crate::meter::service_level::ServiceLevelView,
    /// How the production curve placed the generation requests' tokens (which requests it
    /// reproduces exactly as live, which it spreads).
    pub capacity_production_tokens: TokenPlacement,
    /// TTFT by arrival level and the knee.
    pub saturation: Saturation,
    /// Per-user figures, by generated tokens descending.
    pub users: Vec<UserRow>,
    /// Per-API figures of generation requests, in the APIs' fixed order (only APIs seen).
    pub apis: Vec<ApiRow>,
    /// Cold-start requests, listed apart.
    pub cold_starts: ColdStarts,
    /// The proxy beside vLLM's own count (from `server_sample` lines); `null` when the logs hold
    /// none, or when a user or model filter makes the proxy side a subset of the server's.
    pub crosscheck: Option<CrossCheck>,
    /// KV-cache figures from the log's requests and `server_sample` lines (`docs/kv-cache.md`).
    pub kv: super::kv::AnalyzeKv,
    /// Agent sessions: the table, the wait per turn and the prefix-cache audit
    /// (docs/sessions.md).
    pub sessions: super::sessions::AnalyzeSessions,
    /// One capacity curve per upstream replica when the lines name more than one (each rebuilt
    /// from that replica's records alone, so N is its own concurrency); empty otherwise.
    pub upstreams: Vec<UpstreamCapacity>,
    /// The service level on the simulator's own account (`--sim-truth`); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sim_truth: Option<SimTruth>,
}

/// The service level from the simulator's per-request record (`sim::request_log`): the truth
/// the log's `service_level` is compared with.
#[derive(Debug, Clone, Serialize)]
pub struct SimTruth {
    /// The record read.
    pub file: String,
    /// Requests it holds (the engine's finished requests; aborted ones have no record).
    pub requests: u64,
    /// The headline and per-level verdicts from those records alone (no rates: the record
    /// holds no token times).
    pub service_level: crate::meter::service_level::ServiceLevelView,
}

/// How the production curve placed the tokens of the generation requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TokenPlacement {
    /// Requests whose line has a `token_curve`: their tokens placed in time as the live meter
    /// placed them.
    pub token_curve: u64,
    /// Requests with a first token but no `token_curve` (lines written before the field): their
    /// tokens spread evenly over `[TTFT, end]`, which reads low where arrivals are frequent.
    pub spread: u64,
    /// Requests no token of which passed before the end (non-streamed): spread over the time
    /// after the guard's cap, as live.
    pub no_first_token: u64,
}

impl TokenPlacement {
    pub(super) fn merge(&mut self, o: &TokenPlacement) {
        self.token_curve += o.token_curve;
        self.spread += o.spread;
        self.no_first_token += o.no_first_token;
    }
}

/// One replica's capacity curve.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamCapacity {
    /// The replica's name (`upstream` in the lines).
    pub upstream: String,
    /// Its generation requests.
    pub requests: u64,
    /// Its capacity rows, as the aggregate's.
    pub capacity: Vec<CapacityRow>,
}

/// "Proxy window vs server window": each steady window's proxy tok/s beside vLLM's
/// `generation_tokens_total` increase over the same interval (first to last sample inside it).
#[derive(Debug, Clone, Serialize)]
pub struct CrossCheck {
    /// Disagreements beyond this are flagged.
    pub threshold_pct: f64,
    /// `server_sample` lines used.
    pub samples: u64,
    /// One row per strict steady window (same order as `timeline.steady_strict_windows`).
    pub steady_windows: Vec<super::crosscheck::CrossRow>,
    /// From the first to the last sample.
    pub overall: Option<super::crosscheck::CrossRow>,
}

/// What was read and what was skipped.
#[derive(Debug, Clone, Serialize)]
pub struct Inputs {
    /// The inputs as named (`-` for stdin).
    pub files: Vec<String>,
    /// Lines read, blank ones included.
    pub lines: u64,
    /// Valid `request` lines, before filtering.
    pub request_lines: u64,
    /// Lines of other `type`s, skipped.
    pub other_lines: u64,
    /// Request lines the filters left out.
    pub filtered_out: u64,
    /// Bad lines skipped (all reasons).
    pub bad_lines: u64,
    /// Bad lines by reason.
    pub bad_by_reason: BTreeMap<BadReason, u64>,
    /// `file:line` of the first bad lines (at most 5), in reading order.
    pub bad_positions: Vec<String>,
    /// Inputs that could not be read to the end: `file: error`.
    pub read_errors: Vec<String>,
}

/// Totals over the selected requests (all paths unless said otherwise).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Earliest arrival, RFC 3339.
    pub first_arrival: Option<String>,
    /// Latest end (arrival + e2e), RFC 3339.
    pub last_end: Option<String>,
    /// `last_end - first_arrival`, seconds.
    pub duration_s: Option<f64>,
    /// Selected requests.
    pub requests: u64,
    /// Selected generation (chat/completions) requests.
    pub generation_requests: u64,
    /// Requests by outcome name.
    pub by_outcome: BTreeMap<String, u64>,
    /// Requests that ended in an error of the box (upstream_error, upstream_aborted, timeout,
    /// proxy_error).
    pub errors: u64,
    /// Requests refused for the client's own fault (`client_error`; lines written before it
    /// existed are read by their status), not in `errors`.
    pub client_errors: u64,
    /// Distinct users.
    pub users: u64,
    /// Requests per model (`(none)` for requests without one), by count descending.
    pub models: Vec<ModelCount>,
    /// Sum of prompt tokens.
    pub prompt_tokens: u64,
    /// Sum of completion tokens.
    pub completion_tokens: u64,
    /// Bad lines skipped (same as `inputs.bad_lines`).
    pub bad_lines: u64,
}

/// Requests of one model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCount {
    /// The model name, or `(none)`.
    pub model: String,
    /// Requests.
    pub requests: u64,
}

/// The reconstructed timeline.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineReport {
    /// Seconds during which a request was in flight or to which tokens were attributed.
    pub active_seconds: u64,
    /// Seconds steady at some N > 0: median level N, mean |level - N| at most
    /// `steady_tolerance_pct` % of N (the live windows' definition).
    pub steady_seconds: u64,
    /// The tolerance of `steady`, % of N.
    pub steady_tolerance_pct: f64,
    /// Seconds at one constant N > 0 throughout (no start or end inside them).
    pub steady_strict_seconds: u64,
    /// Minimum length of a steady window, seconds.
    pub steady_min_s: u64,
    /// Maximal runs of at least `steady_min_s` consecutive seconds steady at one N.
    pub steady_windows: Vec<SteadyWindow>,
    /// Maximal runs of at least `steady_min_s` consecutive seconds strictly steady at one N
    /// (the windows of vLLM's log lines under lockstep load; the cross-check uses these).
    pub steady_strict_windows: Vec<SteadyWindow>,
    /// Every active second (only with `--per-second`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_second: Option<Vec<SecondRow>>,
    /// Every active second, always kept for the plots.
    #[serde(skip)]
    pub series: Vec<SecondRow>,
}

/// A steady window.
#[derive(Debug, Clone, Serialize)]
pub struct SteadyWindow {
    /// Start of its first second, RFC 3339.
    pub start: String,
    /// Length, seconds.
    pub seconds: u64,
    /// The level N it was steady at (strict windows: in flight throughout).
    pub in_flight: u32,
    /// Exact time-weighted mean in-flight level over the window.
    pub in_flight_mean: f64,
    /// Completion tokens attributed to the window / its length.
    pub gen_tok_s: f64,
}

/// One second of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct SecondRow {
    /// Unix second.
    pub t: u64,
    /// Completion tokens attributed to the second.
    pub gen_tokens: f64,
    /// Prompt tokens attributed to the second.
    pub prompt_tokens: f64,
    /// Exact time-weighted mean in-flight level over the second.
    pub in_flight_mean: f64,
    /// Lowest level (exact when steady, else a lower bound).
    pub in_flight_min: u32,
    /// Highest level (exact when steady, else an upper bound).
    pub in_flight_max: u32,
    /// Whether the second was steady (tolerant: see `steady_seconds`).
    pub steady: bool,
    /// Whether the second was strictly steady (no start or end inside it, level > 0).
    pub steady_strict: bool,
    /// Requests that arrived in the second.
    pub started: u32,
    /// Requests that ended in the second.
    pub finished: u32,
}

/// TTFT versus arrival concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct Saturation {
    /// The knee threshold factor.
    pub knee_factor: f64,
    /// Which levels the knee was sought among: `"steady"` (levels of the steady curve with at
    /// least `--capacity-min-s` seconds, when two or more), `"production"` (non-thin levels of
    /// the production curve, when the steady one is too thin), `"arrivals"` (every level seen).
    pub knee_basis: &'static str,
    /// `--capacity-min-s`: a level of the steady curve with fewer steady seconds is thin — marked
    /// `(thin)` in its table, left out of the plot, never the knee's basis — as a level of the
    /// production curve with fewer clean seconds is.
    pub capacity_min_s: u64,
    /// One row per observed `in_flight_at_start`.
    pub levels: Vec<SaturationLevel>,
    /// The first eligible level whose TTFT p90 exceeds `knee_factor` x the p90 at the lowest
    /// eligible level.
    pub knee: Option<Knee>,
}

/// TTFT of the generation requests that arrived at one level.
#[derive(Debug, Clone, Serialize)]
pub struct SaturationLevel {
    /// `in_flight_at_start`.
    pub in_flight: u32,
    /// Generation requests that arrived at this level (cold starts included).
    pub requests: u64,
    /// Their TTFT percentiles, cold starts excluded.
    pub ttft_ms: Percentiles,
}

/// Where TTFT starts to climb.
#[derive(Debug, Clone, Serialize)]
pub struct Knee {
    /// The first level over the threshold.
    pub in_flight: u32,
    /// Its TTFT p90, ms.
    pub ttft_p90_ms: f64,
    /// The lowest level with a TTFT p90.
    pub baseline_in_flight: u32,
    /// TTFT p90 at the baseline level, ms.
    pub baseline_ttft_p90_ms: f64,
}

/// One user.
#[derive(Debug, Clone, Serialize)]
pub struct UserRow {
    /// The user.
    pub user: String,
    /// Requests of any path.
    pub requests: u64,
    /// Generation requests.
    pub generation_requests: u64,
    /// Completion tokens of generation requests.
    pub completion_tokens: u64,
    /// Per-request tok/s of generation requests.
    pub tok_s: MinMeanMax,
    /// TTFT p50 of generation requests, ms (cold starts included).
    pub ttft_p50_ms: Option<f64>,
    /// TTFT p90, ms.
    pub ttft_p90_ms: Option<f64>,
    /// Percentage of all generated (completion) tokens; `null` when nothing was generated.
    pub share_pct: Option<f64>,
    /// Contexts (prompt + completion tokens) of its generation requests; `max` is the largest
    /// context it reached.
    pub contexts: crate::meter::kv::ContextView,
}

/// One generation API.
#[derive(Debug, Clone, Serialize)]
pub struct ApiRow {
    /// `chat`, `completions`, `responses` or `messages`.
    pub api: &'static str,
    /// Generation requests.
    pub requests: u64,
    /// Of those, errors.
    pub errors: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Per-request tok/s.
    pub tok_s: MinMeanMax,
    /// TTFT percentiles, ms (cold starts included).
    pub ttft_ms: Percentiles,
    /// Percentage of all completion tokens; `null` when nothing was generated.
    pub share_pct: Option<f64>,
}

/// Cold starts.
#[derive(Debug, Clone, Serialize)]
pub struct ColdStarts {
    /// How many selected generation requests were cold starts.
    pub count: u64,
    /// The earliest ones (at most 1000), by arrival.
    pub listed: Vec<ColdStartRow>,
}

/// One cold-start request.
#[derive(Debug, Clone, Serialize)]
pub struct ColdStartRow {
    /// Arrival, RFC 3339.
    pub ts: String,
    /// Who sent it.
    pub user: String,
    /// TTFT, ms.
    pub ttft_ms: Option<f64>,
    /// End-to-end latency, ms.
    pub e2e_ms: Option<f64>,
}
