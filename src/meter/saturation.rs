//! Saturation, named when it starts: per window, whether requests queue in vLLM (its
//! `num_requests_waiting` above 0 in a sustained share of the window's scrapes) and whether it
//! preempts (its `num_preemptions_total` rose). Both read the server's own gauges, which count
//! requests waiting for a slot or blocks, so one long prompt in prefill (running, not waiting)
//! does not trip it. Definitions: `docs/kv-cache.md`.

use serde::Serialize;

use super::ttft_queueing::FirstTokenWindow;
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
    /// What `state` was read from: `"scrape"` (vLLM's gauges, when a scrape carrying
    /// `num_requests_waiting` fell in the window) or `"first_token"` (the proxy's own first-token
    /// events, without one); `null` when neither could name it.
    pub source: Option<&'static str>,
    /// The first-token figures of the window (always computed by the live meter, the state's
    /// source only without a scrape); `null` in `analyze`, which reads scrapes only.
    pub first_token: Option<FirstTokenWindow>,
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
        source: state.map(|_| "scrape"),
        state,
        samples: n,
        waiting_share,
        waiting_max,
        preemptions,
        reason,
        first_token: None,
    }
}

/// `w` (from the window's scrapes) with the window's first-token figures: when the scrapes did
/// not name the state, the first tokens do (`queueing` or `ok`; they cannot see a preemption).
pub fn with_first_token(mut w: SaturationWindow, ft: FirstTokenWindow) -> SaturationWindow {
    w.first_token = Some(ft);
    if w.state.is_none() {
        match ft.queueing() {
            Some(q) => {
                w.state = Some(if q {
                    SaturationState::Queueing
                } else {
                    SaturationState::Ok
                });
                w.source = Some("first_token");
                w.reason = None;
            }
            None => {
                w.reason = Some(
                    "no scrape of vllm:num_requests_waiting inside the window, and fewer than 3 first tokens judged against the other streams' gaps",
                );
            }
        }
    }
    w
}

impl super::engine::Meter {
    /// The state over the shortest configured window ending at the current complete second;
    /// `None` while unknown (no scrape in the window and too few first tokens judged).
    pub fn saturation_now(&mut self, now: crate::clock::UnixNanos) -> Option<SaturationState> {
        self.tick(now);
        let len = *self.config.windows_s.iter().min()?;
        self.saturation_window(super::timeline::second_of(now), len)
            .state
    }

    /// The `saturation` object of the aggregate window of `len` seconds ending at second
    /// `to_sec` (the meter ticked to it).
    pub(super) fn saturation_window(&self, to_sec: u64, len: u64) -> SaturationWindow {
        use crate::clock::NANOS_PER_SEC;
        let to = to_sec * NANOS_PER_SEC;
        let from = to.saturating_sub(len * NANOS_PER_SEC);
        let w = match self.server.as_ref() {
            Some(track) => {
                let (before, inside) = track.around(from, to);
                saturation(before, inside)
            }
            None => saturation(None, std::iter::empty()),
        };
        with_first_token(w, self.first_tokens.window_ending(to_sec, len))
    }
}
