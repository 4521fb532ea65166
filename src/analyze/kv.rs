//! `analyze`'s KV-cache figures: the contexts of the log's generation requests, the live table
//! at their p50/p90/p99 from the cache the `server_sample` lines give, and the saturation state
//! of each 10 s window of those samples. The same definitions as the live meter's
//! (`meter::kv`, `meter::saturation`; `docs/kv-cache.md`).

use serde::Serialize;

use crate::clock::{format_rfc3339_micros, NANOS_PER_SEC};
use crate::meter::kv::{table, ContextView, KvCache, KvTableRow};
use crate::meter::saturation::{saturation, SaturationState};

/// Length of the windows the saturation state is judged over, seconds (the meter's shortest
/// default window).
pub const SATURATION_WINDOW_S: u64 = 10;

/// Saturation over the log's scrape samples, in consecutive windows from the first sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SaturationSummary {
    /// Window length, seconds.
    pub window_s: u64,
    /// Windows with a known state.
    pub windows: u64,
    /// Of them, `queueing`.
    pub queueing: u64,
    /// Of them, `preempting`.
    pub preempting: u64,
    /// Start of the first window not `ok`, RFC 3339.
    pub first_saturated: Option<String>,
}

/// The `kv` object of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnalyzeKv {
    /// The cache from the last `server_sample` carrying it; `null` without one.
    pub cache: Option<KvCache>,
    /// Why `cache` is `null`.
    pub cache_reason: Option<&'static str>,
    /// Contexts of all selected generation requests.
    pub contexts: ContextView,
    /// The table at p50, p90 and p99 (`max_num_seqs` is not in the log: `null`).
    pub table: Vec<KvTableRow>,
    /// Saturation over the samples; `null` without samples.
    pub saturation: Option<SaturationSummary>,
}

/// The report's `kv` object from every request's context (`all`, in any order) and the log's
/// scrape samples.
pub fn analyze_kv(
    mut all: Vec<u64>,
    server_samples: &[crate::scrape::ServerSample],
    service_level_in_flight: Option<u32>,
) -> AnalyzeKv {
    let max = all.iter().copied().max();
    let contexts = ContextView::of(&mut all, max);
    let mut samples: Vec<&crate::scrape::ServerSample> = server_samples.iter().collect();
    samples.sort_by_key(|s| s.ts_ns);
    let cache = samples
        .iter()
        .rev()
        .map(|s| KvCache::of(&s.values.kv))
        .find(|c| c.basis.is_some());
    let cache_reason = match (&cache, samples.is_empty()) {
        (Some(_), _) => None,
        (None, true) => Some("the log holds no server_sample line"),
        (None, false) => Some("no server_sample line carries the cache's size (cache_config_info)"),
    };
    let saturation = samples.first().map(|first| {
        let len = SATURATION_WINDOW_S * NANOS_PER_SEC;
        let mut out = SaturationSummary {
            window_s: SATURATION_WINDOW_S,
            windows: 0,
            queueing: 0,
            preempting: 0,
            first_saturated: None,
        };
        let mut start = first.ts_ns;
        let mut i = 0;
        while i < samples.len() {
            let end = start + len;
            let j = i + samples[i..].partition_point(|s| s.ts_ns < end);
            let before = i.checked_sub(1).map(|b| samples[b]);
            if let Some(state) = saturation(before, samples[i..j].iter().copied()).state {
                out.windows += 1;
                match state {
                    SaturationState::Ok => {}
                    SaturationState::Queueing => out.queueing += 1,
                    SaturationState::Preempting => out.preempting += 1,
                }
                if state != SaturationState::Ok && out.first_saturated.is_none() {
                    out.first_saturated = Some(format_rfc3339_micros(start));
                }
            }
            i = j;
            start = end;
        }
        out
    });
    AnalyzeKv {
        table: table(cache.as_ref(), &contexts, service_level_in_flight, None),
        cache,
        cache_reason,
        contexts,
        saturation,
    }
}
