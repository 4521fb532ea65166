//! The capacity curve: throughput and latency as a function of the number of requests in flight,
//! built only from steady seconds (the level did not change during the whole second).

use std::collections::BTreeMap;

use serde::Serialize;

use super::histogram::LogHistogram;
use super::summary::Percentiles;
use super::timeline::SecondBucket;

/// What the curve needs to know about one finished request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLevel {
    /// Time-weighted mean in-flight level over the request's life, rounded to the nearest integer.
    pub level: u32,
    /// The request's `tok_s` (completion tokens / e2e), when known.
    pub tok_s: Option<f64>,
    /// The request's TTFT, ms, when known.
    pub ttft_ms: Option<f64>,
    /// Requests in flight when it arrived, itself included.
    pub in_flight_at_start: u32,
    /// Whether it was the first request after an idle gap (kept out of TTFT percentiles).
    pub cold_start: bool,
}

/// Mean and sample standard deviation of per-second generation throughput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MeanStdev {
    /// Mean over the steady seconds of completion tokens attributed per second.
    pub mean: f64,
    /// Sample standard deviation (n - 1) over those seconds; `null` for a single second.
    pub stdev: Option<f64>,
}

/// Per-request throughput at one level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PerRequestTokS {
    /// Lowest `tok_s` of a request of this level (mean in-flight over its life rounds to N);
    /// `null` when no such request finished.
    pub min: Option<f64>,
    /// `gen_tok_s.mean / N`: the share of the steady throughput each request got.
    pub avg: f64,
    /// Highest `tok_s` of a request of this level; `null` when none finished.
    pub max: Option<f64>,
}

/// One row of the curve: everything measured while exactly `in_flight` requests were running.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityRow {
    /// The level N.
    pub in_flight: u32,
    /// Number of steady seconds at N.
    pub seconds: u64,
    /// Aggregate generation throughput over those seconds, tokens/s.
    pub gen_tok_s: MeanStdev,
    /// Per-request throughput at N.
    pub per_request_tok_s: PerRequestTokS,
    /// TTFT percentiles of requests that arrived at N (`in_flight_at_start == N`), cold starts excluded.
    pub ttft_ms: Percentiles,
    /// `gen_tok_s.mean / mean at N=1`; `null` without an N = 1 row.
    pub scaling: Option<f64>,
    /// `gen_tok_s.mean / mean of the previous row - 1`; `null` for the first row.
    pub marginal_gain: Option<f64>,
}

#[derive(Debug, Clone, Default)]
struct LevelAcc {
    seconds: u64,
    mean: f64,
    m2: f64,
    tok_s_min: Option<f64>,
    tok_s_max: Option<f64>,
    ttft_ms: LogHistogram,
}

/// Accumulates steady seconds and finished requests into the curve (memory: one entry per level).
#[derive(Debug, Clone, Default)]
pub struct CapacityAccumulator {
    levels: BTreeMap<u32, LevelAcc>,
}

impl CapacityAccumulator {
    /// An empty curve.
    pub fn new() -> Self {
        CapacityAccumulator::default()
    }

    /// Files a complete second under its level when it was steady; other seconds are ignored.
    pub fn add_second(&mut self, bucket: &SecondBucket) {
        if let Some(n) = bucket.steady_level() {
            self.add_steady_second(n, bucket.gen_tokens);
        }
    }

    /// Files one steady second at level `n` that generated `gen_tokens` tokens.
    pub fn add_steady_second(&mut self, n: u32, gen_tokens: f64) {
        let acc = self.levels.entry(n).or_default();
        // Welford's update: exact zero spread for identical seconds, stable for long runs.
        acc.seconds += 1;
        let delta = gen_tokens - acc.mean;
        acc.mean += delta / acc.seconds as f64;
        acc.m2 += delta * (gen_tokens - acc.mean);
    }

    /// Files a finished request: its `tok_s` under its life level, its TTFT under its arrival level.
    pub fn add_request(&mut self, r: &RequestLevel) {
        if let Some(v) = r.tok_s.filter(|v| v.is_finite()) {
            if r.level > 0 {
                let acc = self.levels.entry(r.level).or_default();
                acc.tok_s_min = Some(acc.tok_s_min.map_or(v, |m| m.min(v)));
                acc.tok_s_max = Some(acc.tok_s_max.map_or(v, |m| m.max(v)));
            }
        }
        if let (Some(t), false) = (r.ttft_ms, r.cold_start) {
            if r.in_flight_at_start > 0 {
                self.levels
                    .entry(r.in_flight_at_start)
                    .or_default()
                    .ttft_ms
                    .record(t);
            }
        }
    }

    /// The per-request figures of level `n` (tok/s min/max by life level, TTFT by arrival level).
    pub fn request_figures(&self, n: u32) -> super::levels::RequestFiguresAt {
        let acc = self.levels.get(&n);
        super::levels::RequestFiguresAt {
            tok_s_min: acc.and_then(|a| a.tok_s_min),
            tok_s_max: acc.and_then(|a| a.tok_s_max),
            ttft_ms: acc.map_or_else(
                || Percentiles::of(&LogHistogram::new()),
                |a| Percentiles::of(&a.ttft_ms),
            ),
        }
    }

    /// The rows, ordered by N: only levels with at least one steady second.
    pub fn rows(&self) -> Vec<CapacityRow> {
        let mean_1 = self
            .levels
            .get(&1)
            .filter(|a| a.seconds > 0)
            .map(|a| a.mean);
        let mut prev: Option<f64> = None;
        let mut rows = Vec::new();
        for (&n, acc) in self.levels.iter().filter(|(_, a)| a.seconds > 0) {
            let stdev =
                (acc.seconds > 1).then(|| (acc.m2.max(0.0) / (acc.seconds - 1) as f64).sqrt());
            rows.push(CapacityRow {
                in_flight: n,
                seconds: acc.seconds,
                gen_tok_s: MeanStdev {
                    mean: acc.mean,
                    stdev,
                },
                per_request_tok_s: PerRequestTokS {
                    min: acc.tok_s_min,
                    avg: acc.mean / n as f64,
                    max: acc.tok_s_max,
                },
                ttft_ms: Percentiles::of(&acc.ttft_ms),
                scaling: mean_1.filter(|m| *m > 0.0).map(|m| acc.mean / m),
                marginal_gain: prev.filter(|p| *p > 0.0).map(|p| acc.mean / p - 1.0),
            });
            prev = Some(acc.mean);
        }
        rows
    }
}

/// The curve of a sequence of complete seconds and the requests that finished in them.
pub fn capacity_curve<'a>(
    seconds: impl IntoIterator<Item = &'a SecondBucket>,
    requests: impl IntoIterator<Item = &'a RequestLevel>,
) -> Vec<CapacityRow> {
    let mut acc = CapacityAccumulator::new();
    seconds.into_iter().for_each(|b| acc.add_second(b));
    requests.into_iter().for_each(|r| acc.add_request(r));
    acc.rows()
}
