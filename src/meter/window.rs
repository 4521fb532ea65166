//! Window statistics over the last W complete seconds of one scope.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::clock::NANOS_PER_SEC;

use super::level_time::{level_mix, LevelTime};
use super::ring::Ring;
use super::summary::{MinMeanMax, Percentiles};
use super::timeline::FinishedStats;

/// The in-flight level over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InFlightStats {
    /// Lowest level at any instant of the window.
    pub min: u32,
    /// Highest level at any instant of the window.
    pub max: u32,
    /// Time-weighted mean level (integral / covered seconds).
    pub mean: f64,
    /// Time-weighted median level: the level the window spent most of its time around.
    pub median: u32,
    /// Time-weighted mean of |level - median|, requests.
    pub deviation: f64,
    /// Share of the window's time at each level, keyed by level (`"0"` is idle time).
    pub shares: BTreeMap<u32, f64>,
}

/// One window: the last `seconds` complete seconds before the snapshot's current second (the
/// partial current second is excluded so every window is comparable). Early in the meter's life
/// the window is clipped to the complete seconds since the meter started, and `seconds` says
/// how many were covered; rates divide by that. Everything is `null` when no second is covered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowStats {
    /// Complete seconds covered (the configured W, unless the meter is younger than W).
    pub seconds: u64,
    /// Completion tokens attributed to the window's seconds / `seconds`.
    pub gen_tok_s: Option<f64>,
    /// Prompt tokens attributed to the window's seconds / `seconds`.
    pub prompt_tok_s: Option<f64>,
    /// Requests that started in the window.
    pub requests_started: Option<u64>,
    /// Requests that finished in the window.
    pub requests_finished: Option<u64>,
    /// Requests that finished in the window with an error of the box (`Outcome::is_error`).
    pub errors: Option<u64>,
    /// Requests that finished in the window refused for the client's own fault
    /// (`client_error`: vLLM's 4xx for a bad request, the proxy's 400/401/408/413/431).
    pub client_errors: Option<u64>,
    /// In-flight level over the window.
    pub in_flight: Option<InFlightStats>,
    /// Steady at `steady_in_flight`: the (full-length) window's median level N is > 0 and the
    /// level's mean absolute deviation from N is at most `steady_tolerance_pct` % of N. Since
    /// aggregate throughput does not fall and per-request throughput does not rise with the
    /// level, the window's rate is then within that percentage of the rate at N.
    pub steady: bool,
    /// N when `steady`, else `null`.
    pub steady_in_flight: Option<u32>,
    /// The level never changed and was > 0 for the whole (full-length) window: vLLM's
    /// "Running: N reqs" throughout (lockstep load only).
    pub steady_strict: bool,
    /// min / mean / max of `tok_s` over requests that finished in the window.
    pub tok_s: MinMeanMax,
    /// TTFT percentiles over requests that finished in the window, ms.
    pub ttft_ms: Percentiles,
    /// TPOT percentiles over requests that finished in the window, ms.
    pub tpot_ms: Percentiles,
    /// End-to-end latency percentiles over requests that finished in the window, ms.
    pub e2e_ms: Percentiles,
    /// Inter-token latency percentiles over every gap of the requests that finished in the
    /// window, ms (`vllm bench serve`'s ITL; within 5 % of the exact values).
    pub itl_ms: Percentiles,
    /// vLLM's own counts over the window beside the proxy's (aggregate windows, when the
    /// cross-check is on; `null` otherwise). See [`crate::scrape::ServerWindow`].
    pub server: Option<crate::scrape::ServerWindow>,
    /// Contexts (prompt + completion tokens) of requests that finished in the window.
    pub context_tokens: super::kv::ContextView,
    /// Whether vLLM queued or preempted in the window, from its scrapes or, without one, the
    /// proxy's first tokens (aggregate windows; `null` in users and models). See
    /// [`super::saturation::SaturationWindow`].
    pub saturation: Option<super::saturation::SaturationWindow>,
}

/// Computes the window `[to - len, to)` of `ring` and `levels`, clipped to seconds `>= earliest`;
/// `tolerance` is the steady tolerance as a fraction (0.05 for 5 %).
pub fn window_stats(
    ring: &Ring,
    levels: &LevelTime,
    to: u64,
    len: u64,
    earliest: u64,
    tolerance: f64,
) -> WindowStats {
    let from = to.saturating_sub(len).max(earliest);
    let seconds = to.saturating_sub(from);
    if seconds == 0 {
        return WindowStats {
            seconds: 0,
            gen_tok_s: None,
            prompt_tok_s: None,
            requests_started: None,
            requests_finished: None,
            errors: None,
            client_errors: None,
            in_flight: None,
            steady: false,
            steady_in_flight: None,
            steady_strict: false,
            tok_s: MinMeanMax {
                min: None,
                mean: None,
                max: None,
            },
            ttft_ms: Percentiles::of(&Default::default()),
            tpot_ms: Percentiles::of(&Default::default()),
            e2e_ms: Percentiles::of(&Default::default()),
            itl_ms: Percentiles::of(&Default::default()),
            server: None,
            context_tokens: Default::default(),
            saturation: None,
        };
    }
    let (mut gen, mut prompt, mut area) = (0.0, 0.0, 0.0);
    let (mut started, mut finished, mut errors) = (0u64, 0u64, 0u64);
    let mut client_errors = 0u64;
    let (mut lo, mut hi) = (u32::MAX, 0u32);
    let mut present = 0u64;
    let mut steady_at: Option<Option<u32>> = None;
    let mut fin = FinishedStats::default();
    for (_, b) in ring.range(from, to) {
        present += 1;
        gen += b.gen_tokens;
        prompt += b.prompt_tokens;
        started += b.requests_started as u64;
        finished += b.requests_finished as u64;
        errors += b.errors as u64;
        client_errors += b.client_errors as u64;
        let (min, max, mean) = b.in_flight_complete();
        lo = lo.min(min);
        hi = hi.max(max);
        area += mean;
        let level = b.steady_level();
        steady_at = Some(match steady_at {
            None => level,
            Some(prev) if prev == level => prev,
            Some(_) => None,
        });
        if let Some(f) = &b.finished {
            fin.merge(f);
        }
    }
    if present < seconds {
        lo = 0; // an absent second was idle
    }
    let n = seconds as f64;
    let mix = level_mix(&levels.ns_by_level(from, to), seconds * NANOS_PER_SEC);
    let full = seconds == len;
    let steady_in_flight = mix.as_ref().and_then(|m| {
        (full && m.median > 0 && m.deviation <= tolerance * m.median as f64 + 1e-12)
            .then_some(m.median)
    });
    WindowStats {
        seconds,
        gen_tok_s: Some(gen / n),
        prompt_tok_s: Some(prompt / n),
        requests_started: Some(started),
        requests_finished: Some(finished),
        errors: Some(errors),
        client_errors: Some(client_errors),
        in_flight: Some(InFlightStats {
            min: lo,
            max: hi,
            mean: area / n,
            median: mix.as_ref().map_or(0, |m| m.median),
            deviation: mix.as_ref().map_or(0.0, |m| m.deviation),
            shares: mix.map(|m| m.shares).unwrap_or_default(),
        }),
        steady: steady_in_flight.is_some(),
        steady_in_flight,
        steady_strict: full && present == seconds && matches!(steady_at, Some(Some(_))),
        tok_s: MinMeanMax {
            min: (fin.tok_s.count > 0).then_some(fin.tok_s.min),
            mean: fin.tok_s.mean(),
            max: (fin.tok_s.count > 0).then_some(fin.tok_s.max),
        },
        ttft_ms: Percentiles::of(&fin.ttft_ms),
        tpot_ms: Percentiles::of(&fin.tpot_ms),
        e2e_ms: Percentiles::of(&fin.e2e_ms),
        itl_ms: Percentiles::of(&fin.itl_ms),
        server: None,
        context_tokens: Default::default(),
        saturation: None,
    }
}
