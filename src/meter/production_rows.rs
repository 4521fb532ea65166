//! The production-traffic curve's rows from the attribution's per-level sums
//! ([`super::levels`]): clean seconds, the aggregate rate, the thin mark, scaling.
//!
//! The aggregate rate is the one the service-level table gives at N: the per-request pace
//! ([`LevelSums::pace`]: the streamed sequences' own, else every clean token's) × N, so the
//! curve has one set of numbers in every view. `tokens / seconds` (every token credited to the
//! clean time) reads low when a share of the requests is non-streamed (their tokens are spread
//! over their whole life, guarded stalls included); the row keeps both figures.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::clock::NANOS_PER_SEC;

use super::level_batches::LevelSums;
use super::step_model::MODEL_MIN_S;
use super::summary::Percentiles;

/// Per-request figures of one level that come from finished requests rather than from time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestFiguresAt {
    /// Lowest `tok_s` of a request whose mean in-flight level rounds to N.
    pub tok_s_min: Option<f64>,
    /// Highest such `tok_s`.
    pub tok_s_max: Option<f64>,
    /// TTFT of requests that arrived at N, cold starts excluded.
    pub ttft_ms: Percentiles,
}

/// Per-request throughput of a production row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ProductionPerRequest {
    /// Lowest `tok_s` of a request of this level (mean in-flight over its life rounds to N).
    pub min: Option<f64>,
    /// `gen_tok_s / N`: the per-request pace (the service-level table's `per_request_tok_s`);
    /// `null` when the row is thin.
    pub avg: Option<f64>,
    /// Highest `tok_s` of a request of this level.
    pub max: Option<f64>,
}

/// One row of the production-traffic curve: everything measured over all the clean time at N.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProductionRow {
    /// The level N.
    pub in_flight: u32,
    /// Clean seconds at N: the time base of the figures.
    pub seconds: f64,
    /// Seconds at N excluded by guards.
    pub guard_s: f64,
    /// `seconds` is below the minimum (`capacity_min_s`): the rates are `null`.
    pub thin: bool,
    /// Tokens credited to the clean seconds (every request's, non-streamed ones included).
    pub tokens: f64,
    /// Aggregate generation rate: the per-request pace at N × N (the service-level table's
    /// aggregate at N; equal to `tokens / seconds` when every request is streamed); `null`
    /// when thin.
    pub gen_tok_s: Option<f64>,
    /// The same over all the time at N, guarded included (shows what the guard removes); `null`
    /// when thin.
    pub gen_tok_s_unguarded: Option<f64>,
    /// Per-request throughput at N.
    pub per_request_tok_s: ProductionPerRequest,
    /// TTFT percentiles of requests that arrived at N, cold starts excluded.
    pub ttft_ms: Percentiles,
    /// `gen_tok_s / gen_tok_s at N = 1`; `null` without a non-thin N = 1 row.
    pub scaling: Option<f64>,
    /// `gen_tok_s / gen_tok_s of the previous non-thin row - 1`; `null` for the first one.
    pub marginal_gain: Option<f64>,
}

/// The production rows of `sums`, levels with less than `min_s` clean seconds marked thin;
/// `requests(N)` supplies the per-request figures of level N.
pub fn production_rows(
    sums: &BTreeMap<u32, LevelSums>,
    min_s: f64,
    requests: impl Fn(u32) -> RequestFiguresAt,
) -> Vec<ProductionRow> {
    let secs = |ns: u64| ns as f64 / NANOS_PER_SEC as f64;
    let mut rows: Vec<ProductionRow> = sums
        .iter()
        .filter(|(_, s)| s.clean_ns + s.guard_ns > 0)
        .map(|(&n, s)| {
            let seconds = secs(s.clean_ns);
            let thin = seconds < min_s || seconds <= 0.0;
            let all_s = secs(s.clean_ns + s.guard_ns);
            // The service-level table's pace at N (LevelSums::pace), so both views agree.
            let gen = (!thin)
                .then(|| s.pace(n, MODEL_MIN_S))
                .flatten()
                .map(|(pace, _)| pace * n as f64);
            let rq = requests(n);
            ProductionRow {
                in_flight: n,
                seconds,
                guard_s: secs(s.guard_ns),
                thin,
                tokens: s.clean_tokens,
                gen_tok_s: gen,
                gen_tok_s_unguarded: (!thin && all_s > 0.0)
                    .then(|| (s.clean_tokens + s.guard_tokens) / all_s),
                per_request_tok_s: ProductionPerRequest {
                    min: rq.tok_s_min,
                    avg: gen.map(|g| g / n as f64),
                    max: rq.tok_s_max,
                },
                ttft_ms: rq.ttft_ms,
                scaling: None,
                marginal_gain: None,
            }
        })
        .collect();
    let base = rows
        .iter()
        .find(|r| r.in_flight == 1)
        .and_then(|r| r.gen_tok_s)
        .filter(|g| *g > 0.0);
    let mut prev: Option<f64> = None;
    for r in rows.iter_mut() {
        let Some(g) = r.gen_tok_s else { continue };
        r.scaling = base.map(|b| g / b);
        r.marginal_gain = prev.filter(|p| *p > 0.0).map(|p| g / p - 1.0);
        prev = Some(g);
    }
    rows
}
