//! Saturation, named when it starts: per window, whether requests queue in vLLM (its
//! `num_requests_waiting` above 0 in a sustained share of the window's scrapes) and whether it
//! preempts (its `num_preemptions_total` rose). Both read the server's own gauges, which count
//! requests waiting for a slot or blocks, so one long prompt in prefill (running, not waiting)
//! does not trip it. Definitions: `docs/kv-cache.md`.

use serde::Serialize;

use crate::scrape::crosscheck::increase;
use crate::scrape::ServerSample;

/// Share of a window's scrapes with requests waiting from which the window is `queueing`.
pub const QUEUEING_SHARE: f64 = 0.5;

/// The state of one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SaturationState {
    /// No sustained queueing, no preemption.
    Ok,
    /// Requests waited in vLLM in at least [`QUEUEING_SHARE`] of the window's scrapes.
    Queueing,
    /// vLLM preempted at least one sequence in the window (its KV cache ran out).
    Preempting,
}

impl SaturationState {
    /// The gauge's value: 0 ok, 1 queueing, 2 preempting.
    pub fn level(self) -> u8 {
        match self {
            SaturationState::Ok => 0,
            SaturationState::Queueing => 1,
            SaturationState::Preempting => 2,
        }
    }
}

/// The `saturation` object of an aggregate window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SaturationWindow {
    /// The state; `null` when unknown (see `reason`).
    pub state: Option<SaturationState>,
    /// Scrapes inside the window carrying `vllm:num_requests_waiting`.
    pub samples: u64,
    /// Share of them with `num_requests_waiting > 0`.
    pub waiting_share: Option<f64>,
    /// Largest `num_requests_waiting` seen.
    pub waiting_max: Option<f64>,
    /// Increase of `vllm:num_preemptions_total` from the last scrape before the window to its
    /// last scrape (counter resets counted from 0); `null` without two scrapes carrying it.
    pub preemptions: Option<f64>,
    /// Why `state` is `null`, when it is.
    pub reason: Option<&'static str>,
}

/// The state of a window from its scrapes (oldest first) and the last scrape before it
/// (`before`): preemptions are the counter's increase from `before` (else the window's first
/// scrape) to its last, so one counted between two windows' scrapes is the later window's.
pub fn saturation<'a>(
    before: Option<&'a ServerSample>,
    samples: impl Iterator<Item = &'a ServerSample>,
) -> SaturationWindow {
    let (mut n, mut waiting_n, mut waiting_max) = (0u64, 0u64, None::<f64>);
    let mut preempt: Vec<f64> = before
        .and_then(|b| b.values.kv.preemptions_total)
        .into_iter()
        .collect();
    for s in samples {
        if let Some(w) = s.values.waiting {
            n += 1;
            waiting_n += (w > 0.0) as u64;
            waiting_max = Some(waiting_max.map_or(w, |m| m.max(w)));
        }
        if let Some(p) = s.values.kv.preemptions_total {
            preempt.push(p);
        }
    }
    let preemptions = (preempt.len() >= 2).then(|| increase(&preempt).0);
    let waiting_share = (n > 0).then(|| waiting_n as f64 / n as f64);
    let (state, reason) = match (waiting_share, preemptions) {
        (_, Some(p)) if p > 0.0 => (Some(SaturationState::Preempting), None),
        (Some(share), _) if share >= QUEUEING_SHARE => (Some(SaturationState::Queueing), None),
        (Some(_), _) => (Some(SaturationState::Ok), None),
        (None, _) => (
            None,
            Some("no scrape of vllm:num_requests_waiting inside the window"),
        ),
    };
    SaturationWindow {
        state,
        samples: n,
        waiting_share,
        waiting_max,
        preemptions,
        reason,
    }
}

impl super::engine::Meter {
    /// The state over the shortest configured window ending at the current complete second;
    /// `None` while unknown (no cross-check, or no scrape in the window).
    pub fn saturation_now(&mut self, now: crate::clock::UnixNanos) -> Option<SaturationState> {
        use crate::clock::NANOS_PER_SEC;
        self.tick(now);
        let len = *self.config.windows_s.iter().min()?;
        let to = super::timeline::second_of(now) * NANOS_PER_SEC;
        let from = to.saturating_sub(len * NANOS_PER_SEC);
        let track = self.server.as_ref()?;
        let before = track.samples().take_while(|s| s.ts_ns < from).last();
        saturation(
            before,
            track.samples().filter(|s| (from..to).contains(&s.ts_ns)),
        )
        .state
    }
}
