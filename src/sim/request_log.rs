//! The simulator's per-request record (`truth_log`): one JSON line per request the engine
//! finished, with the engine's own timings; and the service level computed from those records
//! alone: the truth a run's live (`/stats`) and offline (`analyze`) answers are compared with.
//!
//! The truth judges each request with `slo::judge` on the engine's account (TTFT and end on its
//! schedule; a non-streamed request on its whole time, as its client sees it) and counts it at
//! its mean in-flight level over its life, the level being the engine's own requests (waiting
//! or running, itself included). Requests the engine aborted (a client that left) have no
//! record.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::meter::replay::LevelSweep;
use crate::meter::service_level::{service_level_view, ServiceLevelView, VerdictsByLevel};
use crate::slo::{judge, Ending, SloConfig, SloInput, Verdict};

use super::engine::Timings;

/// One finished request as the engine saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TruthRecord {
    /// Arrival at the simulator, Unix ns (the process's clock: the proxy's timeline in `demo`).
    pub arrival_ns: u64,
    /// Arrival → start of the step that admitted it, ns.
    pub queue_ns: u64,
    /// Arrival → end of its prefill step (its first token), ns.
    pub ttft_ns: u64,
    /// Arrival → its last token, ns.
    pub e2e_ns: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Prompt tokens found in the prefix cache.
    pub cached_tokens: u64,
    /// Output tokens of every sequence.
    pub completion_tokens: u64,
    /// Streamed to its client (else answered at its end).
    pub stream: bool,
}

impl TruthRecord {
    /// The record of a request that arrived at `arrival_ns` and finished with `timings`.
    pub fn of(
        arrival_ns: u64,
        timings: &Timings,
        prompt_tokens: u64,
        completion_tokens: u64,
        stream: bool,
    ) -> Self {
        TruthRecord {
            arrival_ns,
            queue_ns: timings.queue_ns,
            ttft_ns: timings.ttft_ns,
            e2e_ns: timings.e2e_ns,
            prompt_tokens,
            cached_tokens: timings.cached_tokens,
            completion_tokens,
            stream,
        }
    }

    /// The verdict on the engine's account. A non-streamed request is judged on its whole time,
    /// as its client (and the proxy) sees it; `ttft_for_all` judges every request on the
    /// engine's TTFT and pace instead (what the e2e rule changes).
    pub fn verdict(&self, slo: &SloConfig, ttft_for_all: bool) -> Option<Verdict> {
        let ms = |ns: u64| ns as f64 / 1e6;
        judge(
            slo,
            &SloInput {
                ending: Ending::Complete,
                ttft_ms: (self.stream || ttft_for_all).then(|| ms(self.ttft_ns)),
                e2e_ms: Some(ms(self.e2e_ns)),
                completion_tokens: Some(self.completion_tokens),
                prompt_tokens: Some(self.prompt_tokens),
                cached_prompt_tokens: Some(self.cached_tokens),
            },
        )
    }
}

/// Where the simulator writes its records: one line per request, written whole as the request
/// finishes (a run cut short loses no finished request).
#[derive(Debug)]
pub struct TruthLog {
    file: Mutex<std::fs::File>,
}

impl TruthLog {
    /// Creates (truncates) the file at `path`.
    pub fn create(path: &Path) -> std::io::Result<Self> {
        Ok(TruthLog {
            file: Mutex::new(std::fs::File::create(path)?),
        })
    }

    /// Appends `r` as one JSON line. A failed write is logged: the truth would be short of it.
    pub fn write(&self, r: &TruthRecord) {
        let Ok(mut line) = serde_json::to_vec(r) else {
            return;
        };
        line.push(b'\n');
        let written = match self.file.lock() {
            Ok(mut f) => f.write_all(&line),
            Err(_) => Err(std::io::Error::other("truth log lock poisoned")),
        };
        if let Err(e) = written {
            tracing::warn!("simulator truth log: a record was not written: {e}");
        }
    }
}

/// Reads a truth log.
pub fn read(path: &Path) -> anyhow::Result<Vec<TruthRecord>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Each record's mean level over its life `[arrival, arrival + e2e]`, the level being the number
/// of the engine's requests (waiting or running) at each instant, itself included (a request
/// ending as another arrives does not overlap it); 1 for a request of no length.
pub fn mean_levels(records: &[TruthRecord]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| records[i].arrival_ns);
    let mut means = vec![1.0; records.len()];
    let mut visit = |i: usize, mean: f64| means[i] = mean;
    let mut sweep = LevelSweep::new();
    for i in order {
        let r = &records[i];
        sweep.push(r.arrival_ns, r.arrival_ns + r.e2e_ns, 1, i, &mut visit);
    }
    sweep.finish(&mut visit);
    means
}

/// The service-level view from the engine's own account (`ttft_for_all`: see
/// [`TruthRecord::verdict`]); without rates (the records hold no token times).
pub fn service_level_truth(
    slo: &SloConfig,
    records: &[TruthRecord],
    ttft_for_all: bool,
) -> ServiceLevelView {
    let mut v = VerdictsByLevel::new();
    for (r, level) in records.iter().zip(mean_levels(records)) {
        v.add(
            level.round() as u32,
            r.verdict(slo, ttft_for_all),
            Some(r.completion_tokens),
        );
    }
    service_level_view(slo, &v, &BTreeMap::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(arrival_ms: u64, e2e_ms: u64, ttft_ms: u64, tokens: u64, stream: bool) -> TruthRecord {
        TruthRecord {
            arrival_ns: arrival_ms * 1_000_000,
            queue_ns: 0,
            ttft_ns: ttft_ms * 1_000_000,
            e2e_ns: e2e_ms * 1_000_000,
            prompt_tokens: 100,
            cached_tokens: 0,
            completion_tokens: tokens,
            stream,
        }
    }

    #[test]
    fn levels_are_the_mean_over_each_life() {
        // A alone for 1 s, then B joins for 1 s: A's mean 1.5, B's 2; C arrives as A ends.
        let r = [
            rec(0, 2_000, 10, 10, true),
            rec(1_000, 1_000, 10, 10, true),
            rec(2_000, 1_000, 10, 10, true),
        ];
        let l = mean_levels(&r);
        assert!((l[0] - 1.5).abs() < 1e-12, "{l:?}");
        assert!((l[1] - 2.0).abs() < 1e-12, "{l:?}");
        // C overlaps B for 0 s (B ends at 2 s): alone.
        assert!((l[2] - 1.0).abs() < 1e-12, "{l:?}");
    }

    #[test]
    fn a_record_round_trips_and_non_streamed_ones_are_judged_on_their_whole_time() {
        let slo = SloConfig::default();
        // 11 tokens in 1,500 ms with a TTFT of 1,200 ms: streamed, the TTFT bound
        // (1,000 + 25 ms for 100 uncached tokens) misses; non-streamed, e2e ≤ 1,025 + 400 misses
        // too, by 75 ms; with 13 tokens (1,025 + 480) it is met.
        let s = rec(0, 1_500, 1_200, 11, true);
        assert_eq!(s.verdict(&slo, false), Some(Err(crate::slo::SloMiss::Ttft)));
        let n = TruthRecord { stream: false, ..s };
        assert_eq!(n.verdict(&slo, false), Some(Err(crate::slo::SloMiss::E2e)));
        let n = TruthRecord {
            completion_tokens: 13,
            ..n
        };
        assert_eq!(n.verdict(&slo, false), Some(Ok(())));
        let line = serde_json::to_string(&n).unwrap();
        assert_eq!(serde_json::from_str::<TruthRecord>(&line).unwrap(), n);
    }
}
