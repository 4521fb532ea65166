//! Window statistics over the last W complete seconds of one scope.

use serde::Serialize;

use super::ring::Ring;
use super::summary::{MinMeanMax, Percentiles};
use super::timeline::FinishedStats;

/// The in-flight level over a window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct InFlightStats {
    /// Lowest level at any instant of the window.
    pub min: u32,
    /// Highest level at any instant of the window.
    pub max: u32,
    /// Time-weighted mean level (integral / covered seconds).
    pub mean: f64,
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
    /// Requests that finished in the window with an error outcome.
    pub errors: Option<u64>,
    /// In-flight level over the window.
    pub in_flight: Option<InFlightStats>,
    /// The level never changed and was > 0 for the whole (full-length) window: vLLM's
    /// "Running: N reqs" throughout.
    pub steady: bool,
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
}

/// Computes the window `[to - len, to)` of `ring`, clipped to seconds `>= earliest`.
pub fn window_stats(ring: &Ring, to: u64, len: u64, earliest: u64) -> WindowStats {
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
            in_flight: None,
            steady: false,
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
        };
    }
    let (mut gen, mut prompt, mut area) = (0.0, 0.0, 0.0);
    let (mut started, mut finished, mut errors) = (0u64, 0u64, 0u64);
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
    WindowStats {
        seconds,
        gen_tok_s: Some(gen / n),
        prompt_tok_s: Some(prompt / n),
        requests_started: Some(started),
        requests_finished: Some(finished),
        errors: Some(errors),
        in_flight: Some(InFlightStats {
            min: lo,
            max: hi,
            mean: area / n,
        }),
        steady: seconds == len && present == seconds && matches!(steady_at, Some(Some(_))),
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
    }
}
