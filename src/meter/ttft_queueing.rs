//! Saturation without a scrape: from the proxy's own first-token events, the share of requests
//! whose time to first token holds a wait that the server's steps do not explain.
//!
//! Without queueing, a request's first token comes at the end of the step that admits it, one
//! step (and its prefill) after the step running at its arrival; the other streams see that
//! step's prefill as one long ITL gap. A request queued in vLLM waits many ordinary steps while
//! the others' pace holds. So each first token is judged against the gaps the other streams
//! reported while it waited: its `excess = ttft − longest gap` (the step that admitted it, with
//! its own prefill, or a long prefill it waited behind) is queueing when it reaches
//! [`QUEUED_PACES`] mean gaps. One long prompt is one first-token event, and the requests that
//! wait behind its prefill see it as the longest gap, so it does not trip the state.
//! Definitions: `docs/kv-cache.md`.

use std::collections::VecDeque;

use serde::Serialize;

use crate::clock::UnixNanos;
use crate::itl::Gaps;

use super::timeline::second_of;

/// A first token is queued when its TTFT exceeds the longest gap by this many mean gaps.
pub const QUEUED_PACES: f64 = 2.0;
/// Judged first tokens a window needs before it is named `ok` or `queueing`.
pub const MIN_JUDGED: u64 = 3;
/// Share of a window's judged first tokens that must be queued for it to be `queueing`.
pub const QUEUED_SHARE: f64 = 0.5;

/// One second's gaps and judged first tokens.
#[derive(Debug, Clone, Copy, Default)]
struct Second {
    sec: u64,
    /// The longest ITL gap reported in the second, ns (a report's gaps share one log bin, and
    /// are reported one by one while any request waits for its first token: `sum / count`).
    gap_max_ns: u64,
    gap_sum_ns: u64,
    gap_count: u64,
    /// First tokens of the second: judged, of them queued, and their TTFT and excess sums.
    judged: u64,
    queued: u64,
    unjudged: u64,
    ttft_ns: u64,
    excess_ns: u64,
}

/// A first token not judged yet: the gaps reported up to the second after it are needed.
#[derive(Debug, Clone, Copy)]
struct Pending {
    arrival_ns: UnixNanos,
    first_ns: UnixNanos,
    /// Other requests were in flight at its arrival (it could wait behind them).
    behind_others: bool,
}

/// The seconds of gaps and judged first tokens of the aggregate scope, oldest first.
#[derive(Debug, Clone, Default)]
pub struct FirstTokenTrack {
    seconds: VecDeque<Second>,
    pending: VecDeque<Pending>,
}

/// The first-token figures of one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FirstTokenWindow {
    /// First tokens judged in the window (its seconds, up to the second before the window's
    /// last: each waits for the gaps of the second after it).
    pub judged: u64,
    /// Of them, queued: `ttft − longest gap ≥ QUEUED_PACES × mean gap`, over the gaps reported
    /// from the second of its arrival to the second after its first token.
    pub queued: u64,
    /// First tokens not judged: no other request in flight at its arrival, or no gap reported
    /// while it waited (nothing to measure the server's pace by).
    pub unjudged: u64,
    /// `queued / judged`; `null` without a judged first token.
    pub queued_share: Option<f64>,
    /// The queueing share of TTFT: `Σ max(0, ttft − longest gap) / Σ ttft` over the judged.
    pub ttft_queueing_share: Option<f64>,
    /// Mean ITL gap of the window's seconds, ms (the per-request decode pace).
    pub pace_ms: Option<f64>,
}

impl FirstTokenWindow {
    /// `queueing` when at least [`MIN_JUDGED`] first tokens are judged and at least
    /// [`QUEUED_SHARE`] of them are queued, else `ok`; `None` with fewer judged.
    pub fn queueing(&self) -> Option<bool> {
        (self.judged >= MIN_JUDGED).then(|| self.queued_share.unwrap_or(0.0) >= QUEUED_SHARE)
    }
}

impl FirstTokenTrack {
    fn second_mut(&mut self, sec: u64) -> &mut Second {
        let i = self.seconds.partition_point(|s| s.sec < sec);
        if self.seconds.get(i).is_none_or(|s| s.sec != sec) {
            self.seconds.insert(
                i,
                Second {
                    sec,
                    ..Second::default()
                },
            );
        }
        &mut self.seconds[i]
    }

    /// The seconds in `[from, to)`.
    fn range(&self, from: u64, to: u64) -> impl Iterator<Item = &Second> {
        let i = self.seconds.partition_point(|s| s.sec < from);
        self.seconds.range(i..).take_while(move |s| s.sec < to)
    }

    /// ITL `gaps` reported at `now`.
    pub fn gaps(&mut self, now: UnixNanos, gaps: Gaps) {
        if gaps.count == 0 {
            return;
        }
        let s = self.second_mut(second_of(now));
        s.gap_max_ns = s.gap_max_ns.max(gaps.sum_ns / u64::from(gaps.count));
        s.gap_sum_ns = s.gap_sum_ns.saturating_add(gaps.sum_ns);
        s.gap_count += u64::from(gaps.count);
    }

    /// A request that arrived at `arrival_ns`, with other requests in flight then or not, passed
    /// its first token at `first_ns`.
    pub fn first_token(&mut self, arrival_ns: UnixNanos, first_ns: UnixNanos, behind_others: bool) {
        self.pending.push_back(Pending {
            arrival_ns,
            first_ns,
            behind_others,
        });
    }

    /// Judges the first tokens whose next second is complete at second `now_sec`.
    pub fn settle(&mut self, now_sec: u64) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = self.pending[i];
            let last = second_of(p.first_ns) + 1;
            if last >= now_sec {
                i += 1;
                continue;
            }
            self.pending.remove(i);
            let from = second_of(p.arrival_ns);
            let (mut max, mut sum, mut count) = (0u64, 0u64, 0u64);
            for s in self.range(from, last + 1) {
                max = max.max(s.gap_max_ns);
                sum = sum.saturating_add(s.gap_sum_ns);
                count += s.gap_count;
            }
            let ttft = p.first_ns.saturating_sub(p.arrival_ns);
            let s = self.second_mut(second_of(p.first_ns));
            if !p.behind_others || count == 0 {
                s.unjudged += 1;
                continue;
            }
            let excess = ttft.saturating_sub(max);
            let pace = sum as f64 / count as f64;
            s.judged += 1;
            s.queued += (excess as f64 >= QUEUED_PACES * pace) as u64;
            s.ttft_ns = s.ttft_ns.saturating_add(ttft);
            s.excess_ns = s.excess_ns.saturating_add(excess);
        }
    }

    /// Forgets seconds before `floor_sec` (first tokens still pending keep theirs only while
    /// they stay within the horizon).
    pub fn evict_before(&mut self, floor_sec: u64) {
        while self.seconds.front().is_some_and(|s| s.sec < floor_sec) {
            self.seconds.pop_front();
        }
    }

    /// The figures of the seconds `[from_sec, to_sec)`.
    pub fn window(&self, from_sec: u64, to_sec: u64) -> FirstTokenWindow {
        let mut w = FirstTokenWindow::default();
        let (mut ttft, mut excess, mut gap_sum, mut gap_count) = (0u64, 0u64, 0u64, 0u64);
        for s in self.range(from_sec, to_sec) {
            w.judged += s.judged;
            w.queued += s.queued;
            w.unjudged += s.unjudged;
            ttft = ttft.saturating_add(s.ttft_ns);
            excess = excess.saturating_add(s.excess_ns);
            gap_sum = gap_sum.saturating_add(s.gap_sum_ns);
            gap_count += s.gap_count;
        }
        w.queued_share = (w.judged > 0).then(|| w.queued as f64 / w.judged as f64);
        w.ttft_queueing_share = (ttft > 0).then(|| excess as f64 / ttft as f64);
        w.pace_ms = (gap_count > 0).then(|| gap_sum as f64 / gap_count as f64 / 1e6);
        w
    }

    /// The figures of the window of `len_s` seconds ending at second `to_sec`.
    pub fn window_ending(&self, to_sec: u64, len_s: u64) -> FirstTokenWindow {
        self.window(to_sec.saturating_sub(len_s), to_sec)
    }
}
