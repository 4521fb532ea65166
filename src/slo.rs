//! The service level an interactive agent needs (`[slo]`), and the per-request verdict against
//! it: did the request wait too long for its first token, or decode too slowly?
//!
//! A leaf module: the record carries the verdict, the meter and `analyze` count verdicts per
//! in-flight level (`meter/service_level.rs`), and every view reads that one count.

use serde::{Deserialize, Serialize};

/// The service level: a TTFT bound that grows with the prompt the engine has to prefill, a
/// bound on the decode pace, and the share of requests that must meet both.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloConfig {
    /// TTFT bound for a request with nothing to prefill, ms. Agents wait on every call of a
    /// turn, so a second of queueing on top of the prefill is already felt.
    pub max_ttft_ms: f64,
    /// TTFT allowance per 1,000 prompt tokens not served from vLLM's prefix cache, ms. Agents
    /// resend their whole context on every call; a flat bound would fail every long uncached
    /// prompt on an idle box. 250 ms per 1,000 tokens is a prefill of 4,000 tokens/s.
    pub ttft_ms_per_1k_uncached_tokens: f64,
    /// Bound on the decode pace each request sees: time per output token after the first, ms
    /// (40 ms is 25 tokens/s per user, below which the benchmark write-up found a box
    /// "usable but noticeably slower").
    pub max_tpot_ms: f64,
    /// Share of the requests that must meet both bounds for a level to count as served, %.
    pub attainment_pct: f64,
    /// A level with fewer judged requests than this is thin: shown, never concluded from.
    pub min_requests: u32,
}

impl Default for SloConfig {
    fn default() -> Self {
        SloConfig {
            max_ttft_ms: 1_000.0,
            ttft_ms_per_1k_uncached_tokens: 250.0,
            max_tpot_ms: 40.0,
            attainment_pct: 95.0,
            min_requests: 20,
        }
    }
}

impl SloConfig {
    /// Every problem with the settings, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for (key, v) in [
            ("slo.max_ttft_ms", self.max_ttft_ms),
            ("slo.max_tpot_ms", self.max_tpot_ms),
        ] {
            if !(v.is_finite() && v > 0.0) {
                p.push(format!("{key}: must be a positive number of ms, got {v}"));
            }
        }
        let per_k = self.ttft_ms_per_1k_uncached_tokens;
        if !(per_k.is_finite() && per_k >= 0.0) {
            p.push(format!(
                "slo.ttft_ms_per_1k_uncached_tokens: must be 0 or more, got {per_k}"
            ));
        }
        let a = self.attainment_pct;
        if !(a.is_finite() && a > 0.0 && a <= 100.0) {
            p.push(format!("slo.attainment_pct: must be in (0, 100], got {a}"));
        }
        if self.min_requests == 0 {
            p.push("slo.min_requests: must be at least 1".into());
        }
        p
    }

    /// The TTFT bound of a request with `uncached` prompt tokens to prefill, ms.
    pub fn ttft_bound_ms(&self, uncached: u64) -> f64 {
        self.max_ttft_ms + self.ttft_ms_per_1k_uncached_tokens * uncached as f64 / 1_000.0
    }

    /// The pace bound as tokens per second per request.
    pub fn min_tok_s(&self) -> f64 {
        1_000.0 / self.max_tpot_ms
    }

    /// The objective in one line, as every view states it.
    pub fn describe(&self) -> String {
        format!(
            "TTFT ≤ {} ms + {} ms per 1,000 uncached prompt tokens, TPOT ≤ {} ms ({} tok/s per \
             request), for {} % of requests; levels with fewer than {} judged requests are thin",
            trim(self.max_ttft_ms),
            trim(self.ttft_ms_per_1k_uncached_tokens),
            trim(self.max_tpot_ms),
            trim(self.min_tok_s()),
            trim(self.attainment_pct),
            self.min_requests
        )
    }
}

/// A number without trailing zeros, at most one decimal.
fn trim(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Which part of the service level a request missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SloMiss {
    /// TTFT above its bound (or the client gave up after waiting longer than it).
    Ttft,
    /// Decode pace slower than the bound (TPOT above `max_tpot_ms`).
    Pace,
    /// Both.
    TtftPace,
    /// A non-streamed request without a TTFT: its whole time above what both bounds allow.
    E2e,
    /// The box failed it: an upstream 5xx or 429, an error event, a cut stream, a timeout.
    Error,
}

impl SloMiss {
    /// Every miss, in a stable order (for tables).
    pub const ALL: [SloMiss; 5] = [
        SloMiss::Ttft,
        SloMiss::Pace,
        SloMiss::TtftPace,
        SloMiss::E2e,
        SloMiss::Error,
    ];

    /// The snake_case name used in logs and views.
    pub fn as_str(self) -> &'static str {
        match self {
            SloMiss::Ttft => "ttft",
            SloMiss::Pace => "pace",
            SloMiss::TtftPace => "ttft_pace",
            SloMiss::E2e => "e2e",
            SloMiss::Error => "error",
        }
    }

    /// Whether the TTFT bound was among what was missed.
    pub fn ttft(self) -> bool {
        matches!(self, SloMiss::Ttft | SloMiss::TtftPace)
    }

    /// Whether the pace bound was among what was missed.
    pub fn pace(self) -> bool {
        matches!(self, SloMiss::Pace | SloMiss::TtftPace)
    }
}

/// How a request ended, as far as the service level cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Complete answer.
    Complete,
    /// The box's fault: upstream 5xx/429/408, an error event, a cut stream, a timeout, an
    /// unreachable upstream.
    Failed,
    /// The client's own mistake (a 4xx the box answered correctly): not judged.
    Refused,
    /// The client went away before the end.
    ClientGaveUp,
}

/// What the verdict reads from one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SloInput {
    /// How it ended.
    pub ending: Ending,
    /// TTFT, ms (`None`: no first token seen, or a non-streamed request without one).
    pub ttft_ms: Option<f64>,
    /// Arrival to end, ms.
    pub e2e_ms: Option<f64>,
    /// Output tokens.
    pub completion_tokens: Option<u64>,
    /// Prompt tokens (`None`: unknown; the TTFT bound then has no allowance).
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens vLLM served from its prefix cache (`None`: unknown, taken as 0).
    pub cached_prompt_tokens: Option<u64>,
}

/// The verdict on one request: `Ok(())` met, `Err(miss)` missed.
pub type Verdict = Result<(), SloMiss>;

/// The verdict a record logged (`slo_ok`, `slo_miss`); `None` when it was not judged. A miss
/// logged without its kind counts as an error.
pub fn logged(slo_ok: Option<bool>, slo_miss: Option<SloMiss>) -> Option<Verdict> {
    match slo_ok? {
        true => Some(Ok(())),
        false => Some(Err(slo_miss.unwrap_or(SloMiss::Error))),
    }
}

/// Judges one request; `None` when it is not judged (the client's own mistake, or a client
/// that left before the TTFT bound with no first token).
///
/// * TTFT bound: `max_ttft_ms + ttft_ms_per_1k_uncached_tokens × (prompt − cached) / 1000`.
/// * Pace: `TPOT = (e2e − TTFT) / (output − 1)` ≤ `max_tpot_ms`, judged only with 2 or more
///   output tokens (fewer: TTFT alone).
/// * Without a TTFT (non-streamed, not measured): `e2e ≤ TTFT bound + (output − 1) × max_tpot_ms`.
/// * A failure of the box misses (`error`); a client that gave up after waiting longer than the
///   TTFT bound without a first token misses on TTFT.
pub fn judge(cfg: &SloConfig, r: &SloInput) -> Option<Verdict> {
    let uncached = r
        .prompt_tokens
        .unwrap_or(0)
        .saturating_sub(r.cached_prompt_tokens.unwrap_or(0));
    let ttft_bound = cfg.ttft_bound_ms(uncached);
    match r.ending {
        Ending::Refused => return None,
        Ending::Failed => return Some(Err(SloMiss::Error)),
        Ending::ClientGaveUp if r.ttft_ms.is_none() => {
            return match r.e2e_ms {
                Some(e2e) if e2e > ttft_bound => Some(Err(SloMiss::Ttft)),
                _ => None,
            };
        }
        Ending::ClientGaveUp | Ending::Complete => {}
    }
    let tokens = r.completion_tokens.unwrap_or(0);
    let Some(ttft) = r.ttft_ms else {
        let e2e = r.e2e_ms?;
        let allowed = ttft_bound + tokens.saturating_sub(1) as f64 * cfg.max_tpot_ms;
        return Some(if e2e <= allowed {
            Ok(())
        } else {
            Err(SloMiss::E2e)
        });
    };
    let ttft_miss = ttft > ttft_bound;
    let pace_miss = match (tokens >= 2, r.e2e_ms) {
        (true, Some(e2e)) => (e2e - ttft) / (tokens - 1) as f64 > cfg.max_tpot_ms,
        _ => false,
    };
    Some(match (ttft_miss, pace_miss) {
        (false, false) => Ok(()),
        (true, false) => Err(SloMiss::Ttft),
        (false, true) => Err(SloMiss::Pace),
        (true, true) => Err(SloMiss::TtftPace),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(ttft: Option<f64>, e2e: f64, tokens: u64) -> SloInput {
        SloInput {
            ending: Ending::Complete,
            ttft_ms: ttft,
            e2e_ms: Some(e2e),
            completion_tokens: Some(tokens),
            prompt_tokens: Some(4_000),
            cached_prompt_tokens: Some(2_000),
        }
    }

    #[test]
    fn the_ttft_bound_grows_with_the_uncached_prompt() {
        let c = SloConfig::default();
        // 2,000 uncached tokens: 1,000 + 250 × 2 = 1,500 ms.
        assert_eq!(judge(&c, &input(Some(1_500.0), 1_500.0, 1)), Some(Ok(())));
        assert_eq!(
            judge(&c, &input(Some(1_500.1), 1_600.0, 1)),
            Some(Err(SloMiss::Ttft))
        );
    }

    #[test]
    fn pace_is_the_decode_time_per_token_after_the_first() {
        let c = SloConfig::default();
        // (100 + 40 × 10 − 100) / 10 = 40 ms: met; one ms more over 10 tokens: missed.
        assert_eq!(judge(&c, &input(Some(100.0), 500.0, 11)), Some(Ok(())));
        assert_eq!(
            judge(&c, &input(Some(100.0), 510.0, 11)),
            Some(Err(SloMiss::Pace))
        );
        assert_eq!(
            judge(&c, &input(Some(2_000.0), 2_410.0, 11)),
            Some(Err(SloMiss::TtftPace))
        );
    }

    #[test]
    fn without_a_ttft_the_whole_time_is_judged() {
        let c = SloConfig::default();
        // 1,500 + 40 × 9 = 1,860 ms allowed for 10 tokens.
        assert_eq!(judge(&c, &input(None, 1_860.0, 10)), Some(Ok(())));
        assert_eq!(
            judge(&c, &input(None, 1_861.0, 10)),
            Some(Err(SloMiss::E2e))
        );
    }

    #[test]
    fn failures_miss_refusals_and_early_leavers_are_not_judged() {
        let c = SloConfig::default();
        let mut r = input(None, 100.0, 0);
        r.ending = Ending::Failed;
        assert_eq!(judge(&c, &r), Some(Err(SloMiss::Error)));
        r.ending = Ending::Refused;
        assert_eq!(judge(&c, &r), None);
        r.ending = Ending::ClientGaveUp;
        assert_eq!(judge(&c, &r), None);
        r.e2e_ms = Some(1_600.0);
        assert_eq!(judge(&c, &r), Some(Err(SloMiss::Ttft)));
        // A client that left mid-stream is judged on what it saw.
        r.ttft_ms = Some(100.0);
        r.completion_tokens = Some(3);
        assert_eq!(judge(&c, &r), Some(Err(SloMiss::Pace)));
    }

    #[test]
    fn senseless_bounds_are_named() {
        let bad = SloConfig {
            max_ttft_ms: 0.0,
            max_tpot_ms: -1.0,
            ttft_ms_per_1k_uncached_tokens: f64::NAN,
            attainment_pct: 100.5,
            min_requests: 0,
        };
        let p = bad.problems().join("\n");
        for key in [
            "slo.max_ttft_ms",
            "slo.max_tpot_ms",
            "slo.ttft_ms_per_1k_uncached_tokens",
            "slo.attainment_pct",
            "slo.min_requests",
        ] {
            assert!(p.contains(key), "{key} not named in {p}");
        }
        assert!(SloConfig::default().problems().is_empty());
        let full = SloConfig {
            attainment_pct: 100.0,
            ..SloConfig::default()
        };
        assert!(full.problems().is_empty());
    }
}
