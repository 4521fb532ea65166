//! The load report: what each figure means and how it is computed from request results.

use serde::Serialize;

use super::dist::Dist;
use super::result::{RequestResult, TokensFrom};
use super::stats::ProxyReport;
use super::summary::summarize;
use super::summary::MinAvgMax;

/// Version of the JSON report layout.
pub const LOAD_REPORT_SCHEMA: u32 = 1;

/// Figures shared by a burst level and a sustained run, over its requests.
#[derive(Debug, Clone, Serialize)]
pub struct RequestFigures {
    /// Requests with a result (ok or failed; cancelled sustained requests are not here).
    pub requests: usize,
    /// Requests that failed (non-2xx, transport error, timeout, error event).
    pub failures: usize,
    /// Sum of `completion_tokens` over ok requests.
    pub completion_tokens: u64,
    /// Per-request `tok_s` (completion tokens / that request's wall) over ok requests.
    pub per_request_tok_s: Option<MinAvgMax>,
    /// Per-request TTFT in ms over ok streamed requests.
    pub ttft_ms: Option<MinAvgMax>,
    /// Per-request wall in ms over ok requests.
    pub e2e_ms: Option<MinAvgMax>,
    /// True when some ok request had no usage and its tokens were counted from events.
    pub tokens_counted_from_events: bool,
    /// True when some ok request's token count is unknown (left out of the sums).
    pub tokens_unknown: bool,
}

impl RequestFigures {
    /// Computes the figures over `results`.
    pub fn of(results: &[RequestResult]) -> Self {
        let ok = || results.iter().filter(|r| r.ok);
        Self {
            requests: results.len(),
            failures: results.iter().filter(|r| !r.ok).count(),
            completion_tokens: ok().filter_map(|r| r.completion_tokens).sum(),
            per_request_tok_s: summarize(ok().filter_map(|r| r.tok_s)),
            ttft_ms: summarize(ok().filter_map(|r| r.ttft_ms)),
            e2e_ms: summarize(ok().map(|r| r.e2e_ms)),
            tokens_counted_from_events: ok().any(|r| r.tokens_from == TokensFrom::CountedEvents),
            tokens_unknown: ok().any(|r| r.completion_tokens.is_none()),
        }
    }
}

/// One concurrency level of the burst sweep.
#[derive(Debug, Clone, Serialize)]
pub struct LevelReport {
    /// Requests dispatched together.
    pub level: usize,
    /// Seconds from dispatching the batch to the end of its last request.
    pub wall_s: f64,
    /// Request figures of the batch.
    #[serde(flatten)]
    pub figures: RequestFigures,
    /// `completion_tokens / wall_s`: tokens of ok requests over the batch wall; null if wall is 0.
    pub aggregate_tok_s: Option<f64>,
    /// `aggregate_tok_s / aggregate_tok_s of the first level` (the first level is normally 1).
    pub scaling_vs_first: Option<f64>,
    /// `(aggregate_tok_s / previous level's aggregate_tok_s - 1) * 100`; null on the first level.
    pub marginal_gain_pct: Option<f64>,
    /// `level / previous level`, the user multiple the marginal gain was bought with.
    pub users_ratio: Option<f64>,
    /// Every request of the batch, failures included.
    pub results: Vec<RequestResult>,
}

impl LevelReport {
    /// Builds a level from its batch; `first` and `prev` are earlier levels' (level, aggregate).
    pub fn new(
        level: usize,
        wall_s: f64,
        results: Vec<RequestResult>,
        first: Option<f64>,
        prev: Option<(usize, Option<f64>)>,
    ) -> Self {
        let figures = RequestFigures::of(&results);
        let aggregate_tok_s = (wall_s > 0.0).then(|| figures.completion_tokens as f64 / wall_s);
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        Self {
            level,
            wall_s,
            aggregate_tok_s,
            scaling_vs_first: ratio(aggregate_tok_s, first),
            marginal_gain_pct: prev
                .and_then(|(_, p)| ratio(aggregate_tok_s, p))
                .map(|r| (r - 1.0) * 100.0),
            users_ratio: prev
                .filter(|(l, _)| *l > 0)
                .map(|(l, _)| level as f64 / l as f64),
            figures,
            results,
        }
    }
}

/// The burst sweep.
#[derive(Debug, Clone, Serialize)]
pub struct BurstReport {
    /// The discarded warm-up request (the first request after idle is slow).
    pub warmup: RequestResult,
    /// One entry per level, in the order run.
    pub levels: Vec<LevelReport>,
}

/// One client-side progress sample of the sustained run.
#[derive(Debug, Clone, Serialize)]
pub struct ClientTick {
    /// Seconds since the run started.
    pub t_s: f64,
    /// Requests finished so far (ok or failed).
    pub done: usize,
    /// Requests in flight at the sample.
    pub in_flight: usize,
    /// Streamed content events since the previous sample per second (≈ tok/s; 0 if not streaming).
    pub events_per_s: f64,
}

/// The sustained method.
#[derive(Debug, Clone, Serialize)]
pub struct SustainedReport {
    /// Requests kept in flight.
    pub concurrency: usize,
    /// Requested duration in seconds.
    pub duration_s: f64,
    /// Seconds from the start to the moment in-flight requests were cancelled.
    pub wall_s: f64,
    /// Requests started.
    pub started: usize,
    /// Requests still in flight at the deadline, cancelled and left out of every figure
    /// except `partial_content_events`.
    pub cancelled_at_deadline: usize,
    /// Figures over requests that finished before the deadline.
    #[serde(flatten)]
    pub figures: RequestFigures,
    /// `completion_tokens / wall_s`: tokens of requests completed ok before the deadline over the
    /// wall. Undercounts by the work of the requests cancelled at the deadline.
    pub client_aggregate_tok_s: Option<f64>,
    /// Streamed content events received by the cancelled requests before the deadline.
    pub partial_content_events: u64,
    /// `(completion_tokens + partial_content_events) / wall_s` when streaming: also credits the
    /// cancelled requests' streamed events (≈ tokens); null when not streaming.
    pub client_aggregate_incl_partial_tok_s: Option<f64>,
    /// Most requests in flight at once, as the client saw it.
    pub max_in_flight: usize,
    /// Why the run ended before its duration, if it did.
    pub stopped_early: Option<String>,
    /// Client-side samples, one per progress interval.
    pub ticks: Vec<ClientTick>,
    /// Every finished request, in finishing order.
    pub results: Vec<RequestResult>,
}

/// Everything one `tokenmeter load` run measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Always `"load_report"`.
    pub kind: &'static str,
    /// [`LOAD_REPORT_SCHEMA`].
    pub schema: u32,
    /// Server base URL (normalized, without `/v1`).
    pub base_url: String,
    /// Model requested.
    pub model: String,
    /// The generation API spoken (`chat`, `completions`, `responses`, `messages`).
    pub api: super::Api,
    /// Whether requests streamed.
    pub stream: bool,
    /// `max_tokens` of every request.
    pub max_tokens: u32,
    /// Whether `ignore_eos` was sent.
    pub ignore_eos: bool,
    /// The `user` sent, if any.
    pub user: Option<String>,
    /// Whether an API key was sent (the key itself is never reported).
    pub api_key_sent: bool,
    /// `"burst"`, `"sustained"`, `"agents"` or `"poisson"`.
    pub method: &'static str,
    /// The burst sweep, when run.
    pub burst: Option<BurstReport>,
    /// The sustained run, when run.
    pub sustained: Option<SustainedReport>,
    /// The agent-like run (`method` `"agents"` or `"poisson"`), when run.
    pub agents: Option<AgentsReport>,
    /// What a tokenmeter proxy in front of the server measured (sustained runs).
    pub proxy: Option<ProxyReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(ok: bool, tokens: u64, e2e_ms: f64) -> RequestResult {
        RequestResult {
            slot: 0,
            ok,
            status: Some(if ok { 200 } else { 500 }),
            ttft_ms: ok.then_some(10.0),
            e2e_ms,
            completion_tokens: ok.then_some(tokens),
            prompt_tokens: None,
            tokens_from: TokensFrom::Usage,
            content_events: 0,
            tok_s: ok.then(|| tokens as f64 / (e2e_ms / 1e3)),
            error: (!ok).then(|| "boom".into()),
            session_id: None,
            session_api: None,
            turn: None,
            cached_tokens: None,
        }
    }

    #[test]
    fn level_formulas() {
        let l1 = LevelReport::new(1, 1.0, vec![res(true, 100, 1000.0)], None, None);
        assert_eq!(l1.aggregate_tok_s, Some(100.0));
        assert_eq!(l1.scaling_vs_first, None);
        let rs = vec![
            res(true, 100, 1000.0),
            res(true, 100, 2000.0),
            res(false, 0, 5.0),
        ];
        let l4 = LevelReport::new(4, 2.0, rs, Some(100.0), Some((1, Some(100.0))));
        assert_eq!(l4.figures.failures, 1);
        assert_eq!(l4.figures.completion_tokens, 200);
        assert_eq!(l4.aggregate_tok_s, Some(100.0));
        assert_eq!(l4.scaling_vs_first, Some(1.0));
        assert_eq!(l4.marginal_gain_pct, Some(0.0));
        assert_eq!(l4.users_ratio, Some(4.0));
        let pr = l4.figures.per_request_tok_s.unwrap();
        assert_eq!((pr.min, pr.avg, pr.max, pr.n), (50.0, 75.0, 100.0, 2));
    }

    #[test]
    fn empty_summary_is_none() {
        assert_eq!(summarize(Vec::<f64>::new()), None);
        assert_eq!(summarize([f64::NAN]), None);
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Arrivals {
    /// N agents, each: think, send one request, wait for its answer, repeat.
    Agents {
        /// Number of agents.
        agents: usize,
    },
    /// Open loop: arrivals at exponential gaps (a Poisson process), whatever is in flight.
    Poisson {
        /// Mean arrivals per second.
        rate_per_s: f64,
        /// Arrivals while this many are in flight are skipped (and counted).
        max_in_flight: usize,
    },
}

/// The shape of agent-like traffic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentSpec {
    /// The APIs spoken in turn: agent i (Poisson: request i) speaks the (i mod n)-th; empty: the
    /// run's one API.
    pub apis: Vec<super::Api>,
    /// Think time between an answer and the agent's next request, ms (agents only).
    pub think_ms: Dist,
    /// Words in each prompt (about 1.3 tokens per word for most tokenizers).
    pub prompt_words: Dist,
    /// `max_tokens` of each request.
    pub output_tokens: Dist,
    /// Share of requests that stream (the rest ask for one JSON answer).
    pub stream_share: f64,
    /// Turns per session of an agent (`--agents`): after them the agent starts a new session.
    pub turns_per_session: Dist,
    /// Calls per turn: the first carries the user's message, each later one a tool result.
    pub calls_per_turn: Dist,
    /// Sessions each agent runs before it stops (`None`: until the deadline). With it the run
    /// ends when every agent has finished, so no call is cut at the deadline.
    pub sessions_per_agent: Option<u64>,
    /// Seed of every draw, so a run can be repeated.
    pub seed: u64,
}

impl Default for AgentSpec {
    fn default() -> Self {
        AgentSpec {
            apis: Vec::new(),
            think_ms: Dist::Uniform {
                min: 200,
                max: 3000,
            },
            prompt_words: Dist::Uniform { min: 10, max: 2000 },
            output_tokens: Dist::Uniform { min: 20, max: 300 },
            stream_share: 1.0,
            turns_per_session: Dist::Uniform { min: 1, max: 4 },
            calls_per_turn: Dist::Uniform { min: 1, max: 3 },
            sessions_per_agent: None,
            seed: 1,
        }
    }
}

/// An agent-like run.
#[derive(Debug, Clone, Serialize)]
pub struct AgentsReport {
    /// How requests arrived.
    pub arrivals: Arrivals,
    /// The traffic's shape.
    pub spec: AgentSpec,
    /// Requested duration, seconds.
    pub duration_s: f64,
    /// Seconds from the start to the cancellation of the requests still in flight.
    pub wall_s: f64,
    /// Requests started.
    pub started: usize,
    /// Requests in flight at the deadline, cancelled and left out of the figures.
    pub cancelled_at_deadline: usize,
    /// Poisson arrivals skipped because `max_in_flight` were in flight.
    pub skipped: usize,
    /// Figures over requests that finished before the deadline.
    #[serde(flatten)]
    pub figures: RequestFigures,
    /// `completion_tokens / wall_s` over requests completed ok before the deadline.
    pub client_aggregate_tok_s: Option<f64>,
    /// Load's own truth of the sessions (`--agents`; empty with Poisson arrivals): sessions,
    /// turns, calls, tokens in and out, cached tokens reported.
    pub sessions: super::session::SessionsTally,
    /// Most requests in flight at once, as the client saw it.
    pub max_in_flight: usize,
    /// Client-side samples, one per progress interval.
    pub ticks: Vec<ClientTick>,
    /// Every finished request, in finishing order.
    pub results: Vec<RequestResult>,
}
