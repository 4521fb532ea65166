//! Capacity at the service level: per in-flight level, the share of requests that met `[slo]`
//! (attainment, with its interval), the goodput, the rates with their intervals and a fitted
//! decode-step model; and the one headline figure every view shows. Shared by the live meter
//! and `analyze`, so both give the same answer from the same counts.
//!
//! * A request belongs to its rounded mean in-flight level over its life (the level whose pace
//!   it saw; with turnover in lockstep, a request arriving at 8 runs at 10).
//! * Attainment at N = met / judged, with the Wilson score interval at 95 %.
//! * A level is *thin* below `slo.min_requests` judged requests: shown, never concluded from.
//! * Capacity at the service level = the highest N at which attainment ≥ `slo.attainment_pct`
//!   while every non-thin level below N meets it too; when no non-thin level misses, it is
//!   "at least" the highest non-thin level (not reached).
//! * Rates come from the production-traffic attribution ([`super::levels`]) over the clean
//!   time at N; goodput = rate × the met requests' share of the judged requests' output tokens.
//! * The model beside the measured levels: [`super::step_model`].

use std::collections::BTreeMap;

use serde::Serialize;

use crate::clock::NANOS_PER_SEC;
use crate::slo::{SloConfig, SloMiss, Verdict};

use super::levels::LevelSums;
use super::step_model::{StepModel, MODEL_MIN_S};
use super::summary::Z95;

/// Verdicts counted at one level.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VerdictCounts {
    /// Judged requests.
    pub judged: u64,
    /// Judged requests that met the level.
    pub met: u64,
    /// Misses by kind, in [`SloMiss::ALL`]'s order.
    pub missed: [u64; 5],
    /// Output tokens of the judged requests.
    pub judged_tokens: f64,
    /// Output tokens of the requests that met the level.
    pub met_tokens: f64,
}

/// Verdicts by level (the request's rounded mean in-flight level over its life).
#[derive(Debug, Clone, Default)]
pub struct VerdictsByLevel {
    levels: BTreeMap<u32, VerdictCounts>,
}

impl VerdictsByLevel {
    /// Empty.
    pub fn new() -> Self {
        VerdictsByLevel::default()
    }

    /// Counts one request of `level` (unjudged ones are not counted).
    pub fn add(&mut self, level: u32, verdict: Option<Verdict>, completion_tokens: Option<u64>) {
        let (Some(v), true) = (verdict, level > 0) else {
            return;
        };
        let c = self.levels.entry(level).or_default();
        let tokens = completion_tokens.unwrap_or(0) as f64;
        c.judged += 1;
        c.judged_tokens += tokens;
        match v {
            Ok(()) => {
                c.met += 1;
                c.met_tokens += tokens;
            }
            Err(m) => {
                if let Some(i) = SloMiss::ALL.iter().position(|x| *x == m) {
                    c.missed[i] += 1;
                }
            }
        }
    }

    /// Counts of one record (`slo_ok`/`slo_miss` as logged).
    pub fn add_logged(
        &mut self,
        level: u32,
        slo_ok: Option<bool>,
        slo_miss: Option<SloMiss>,
        completion_tokens: Option<u64>,
    ) {
        self.add(
            level,
            crate::slo::logged(slo_ok, slo_miss),
            completion_tokens,
        );
    }

    /// The counts by level.
    pub fn levels(&self) -> &BTreeMap<u32, VerdictCounts> {
        &self.levels
    }
}

/// Misses of one level by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MissCounts {
    /// TTFT only.
    pub ttft: u64,
    /// Pace only.
    pub pace: u64,
    /// Both.
    pub ttft_pace: u64,
    /// Non-streamed, judged on the whole time.
    pub e2e: u64,
    /// Failed by the box.
    pub error: u64,
}

impl MissCounts {
    fn of(m: &[u64; 5]) -> Self {
        MissCounts {
            ttft: m[0],
            pace: m[1],
            ttft_pace: m[2],
            e2e: m[3],
            error: m[4],
        }
    }

    /// What binds: the kind behind most misses (`ttft_pace` counts for both), `None` without
    /// misses.
    pub fn binds(&self) -> Option<&'static str> {
        let candidates = [
            ("ttft", self.ttft + self.ttft_pace),
            ("pace", self.pace + self.ttft_pace),
            ("e2e", self.e2e),
            ("error", self.error),
        ];
        candidates
            .iter()
            .filter(|(_, n)| *n > 0)
            .max_by_key(|(_, n)| *n)
            .map(|(k, _)| *k)
    }
}

/// One level of the service-level table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceLevelRow {
    /// The level N (requests in flight at arrival, the newcomer included).
    pub in_flight: u32,
    /// Judged requests that arrived at N.
    pub requests: u64,
    /// Of which met the service level.
    pub met: u64,
    /// Fewer than `slo.min_requests` judged: no conclusion is drawn from this level.
    pub thin: bool,
    /// `met / requests × 100`.
    pub attainment_pct: Option<f64>,
    /// Wilson score 95 % interval of the attainment, %.
    pub attainment_ci_pct: Option<[f64; 2]>,
    /// Misses by kind.
    pub missed: MissCounts,
    /// Clean seconds at N in the production attribution (the rates' time base).
    pub seconds: f64,
    /// Aggregate generation rate over the clean time at N, tokens/s; `null` without clean time.
    pub gen_tok_s: Option<f64>,
    /// Half-width of its 95 % interval (from 1-second batches); `null` with fewer than 2.
    pub gen_tok_s_ci: Option<f64>,
    /// `gen_tok_s / N`: what each request got.
    pub per_request_tok_s: Option<f64>,
    /// Goodput: `gen_tok_s × met output tokens / judged output tokens`, tokens/s.
    pub goodput_tok_s: Option<f64>,
    /// The fitted model's per-request pace at N, tokens/s.
    pub model_per_request_tok_s: Option<f64>,
    /// Its 95 % band, tokens/s.
    pub model_band_tok_s: Option<[f64; 2]>,
}

/// The headline: capacity at the service level.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceCapacity {
    /// The highest level served at the objective (see the module); when `reached` is false, a
    /// lower bound. `null` when no level can be concluded from (see `reason`).
    pub in_flight: Option<u32>,
    /// Whether a non-thin level above it missed (the limit was seen); false: "at least".
    pub reached: bool,
    /// What made the first missing level miss: `ttft`, `pace`, `e2e` or `error`.
    pub binds: Option<&'static str>,
    /// The first non-thin level that missed the objective.
    pub first_miss: Option<u32>,
    /// Why `in_flight` is `null`, when it is.
    pub reason: Option<String>,
    /// One line for people: "10 (pace binds at 11)", "at least 6 (not reached)".
    pub text: String,
}

/// Everything about the service level, as `/stats` and `analyze --json` give it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceLevelView {
    /// Which curve this is (the production-traffic one).
    pub curve: &'static str,
    /// The objective judged against.
    pub objective: SloConfig,
    /// The objective in words ([`SloConfig::describe`]), so every view states it alike.
    pub objective_text: String,
    /// The headline.
    pub capacity: ServiceCapacity,
    /// One row per level with judged requests or clean time.
    pub levels: Vec<ServiceLevelRow>,
    /// The fitted decode-step model; `null` with `model_reason`.
    pub model: Option<StepModel>,
    /// Why there is no model, when there is none.
    pub model_reason: Option<String>,
}

/// Wilson score interval of `k` successes in `n`, as percentages.
pub fn wilson95(k: u64, n: u64) -> Option<[f64; 2]> {
    if n == 0 {
        return None;
    }
    let n = n as f64;
    let p = k as f64 / n;
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    Some([
        ((centre - half) * 100.0).max(0.0),
        ((centre + half) * 100.0).min(100.0),
    ])
}

/// The headline from the rows.
pub fn capacity(rows: &[ServiceLevelRow], slo: &SloConfig) -> ServiceCapacity {
    let mut best: Option<u32> = None;
    let mut any = false;
    for r in rows.iter().filter(|r| !r.thin) {
        any = true;
        let meets = r.attainment_pct.is_some_and(|a| a >= slo.attainment_pct);
        if meets {
            best = Some(r.in_flight);
            continue;
        }
        let binds = r.missed.binds();
        let (in_flight, reason) = match best {
            Some(b) => (Some(b), None),
            None if r.in_flight == 1 => (Some(0), None),
            None => (
                None,
                Some(format!(
                    "the lowest level with {} judged requests, {}, already misses; the levels \
                     below it are thin",
                    slo.min_requests, r.in_flight
                )),
            ),
        };
        let text = match in_flight {
            Some(n) => format!(
                "{n} ({} binds at {})",
                binds.unwrap_or("attainment"),
                r.in_flight
            ),
            None => format!("below {} (levels below are thin)", r.in_flight),
        };
        return ServiceCapacity {
            in_flight,
            reached: true,
            binds,
            first_miss: Some(r.in_flight),
            reason,
            text,
        };
    }
    match best {
        Some(b) => ServiceCapacity {
            in_flight: Some(b),
            reached: false,
            binds: None,
            first_miss: None,
            reason: None,
            text: format!("at least {b} (not reached)"),
        },
        None => {
            let reason = if any {
                "no level met the objective".to_string()
            } else {
                format!(
                    "no level has {} judged requests yet (slo.min_requests)",
                    slo.min_requests
                )
            };
            ServiceCapacity {
                in_flight: None,
                reached: false,
                binds: None,
                first_miss: None,
                text: format!("not known yet: {reason}"),
                reason: Some(reason),
            }
        }
    }
}

/// The view from verdict counts by arrival level and the attribution's per-level sums.
pub fn service_level_view(
    slo: &SloConfig,
    verdicts: &VerdictsByLevel,
    sums: &BTreeMap<u32, LevelSums>,
) -> ServiceLevelView {
    let (model, model_reason) = match StepModel::fit(sums, slo) {
        Ok(m) => (Some(m), None),
        Err(e) => (None, Some(e)),
    };
    let mut levels: Vec<u32> = verdicts
        .levels()
        .keys()
        .chain(sums.iter().filter(|(_, s)| s.clean_ns > 0).map(|(n, _)| n))
        .copied()
        .filter(|n| *n > 0)
        .collect();
    levels.sort_unstable();
    levels.dedup();
    let rows: Vec<ServiceLevelRow> = levels
        .into_iter()
        .map(|n| {
            let c = verdicts.levels().get(&n).copied().unwrap_or_default();
            let s = sums.get(&n).copied().unwrap_or_default();
            let seconds = s.clean_ns as f64 / NANOS_PER_SEC as f64;
            // Less clean time than the model takes is a handful of decode steps: no rate. The
            // pace is the streamed sequences' own where they had time (LevelSums::pace).
            let pace = (seconds >= MODEL_MIN_S)
                .then(|| s.pace(n, MODEL_MIN_S))
                .flatten();
            let gen = pace.map(|(p, _)| p * n as f64);
            let token_share = (c.judged_tokens > 0.0).then(|| c.met_tokens / c.judged_tokens);
            let (model_pace, band) = match &model {
                Some(m) => {
                    let (p, b) = m.pace(n as f64);
                    (Some(p), Some(b))
                }
                None => (None, None),
            };
            ServiceLevelRow {
                in_flight: n,
                requests: c.judged,
                met: c.met,
                thin: c.judged < u64::from(slo.min_requests),
                attainment_pct: (c.judged > 0).then(|| c.met as f64 * 100.0 / c.judged as f64),
                attainment_ci_pct: wilson95(c.met, c.judged),
                missed: MissCounts::of(&c.missed),
                seconds,
                gen_tok_s: gen,
                gen_tok_s_ci: pace.and_then(|(_, ci)| ci).map(|c| c * n as f64),
                per_request_tok_s: pace.map(|(p, _)| p),
                goodput_tok_s: gen.zip(token_share).map(|(g, f)| g * f),
                model_per_request_tok_s: model_pace,
                model_band_tok_s: band,
            }
        })
        .collect();
    ServiceLevelView {
        curve: "production",
        objective: *slo,
        objective_text: slo.describe(),
        capacity: capacity(&rows, slo),
        levels: rows,
        model,
        model_reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: u32, judged: u64, met: u64, pace_misses: u64) -> ServiceLevelRow {
        let mut v = VerdictsByLevel::new();
        for i in 0..judged {
            let verdict = if i < met {
                Ok(())
            } else if i < met + pace_misses {
                Err(SloMiss::Pace)
            } else {
                Err(SloMiss::Ttft)
            };
            v.add(n, Some(verdict), Some(10));
        }
        service_level_view(&SloConfig::default(), &v, &BTreeMap::new())
            .levels
            .remove(0)
    }

    #[test]
    fn wilson_interval_matches_the_formula() {
        // 19 of 20: centre (0.95 + 0.096) / 1.192 = 0.8776, half-width 0.1250.
        let [lo, hi] = wilson95(19, 20).unwrap();
        assert!((lo - 76.39).abs() < 0.05, "{lo}");
        assert!((hi - 99.11).abs() < 0.05, "{hi}");
        assert_eq!(wilson95(0, 0), None);
        let [lo, hi] = wilson95(0, 50).unwrap();
        assert_eq!(lo, 0.0);
        assert!(hi > 0.0 && hi < 10.0);
    }

    #[test]
    fn the_headline_is_the_last_level_before_the_first_non_thin_miss() {
        let slo = SloConfig::default();
        let rows = vec![
            row(1, 30, 30, 0),
            row(2, 5, 0, 5), // thin: ignored
            row(3, 40, 39, 1),
            row(4, 40, 30, 8),
            row(5, 40, 40, 0), // above a miss: not counted
        ];
        let c = capacity(&rows, &slo);
        assert_eq!(c.in_flight, Some(3));
        assert!(c.reached);
        assert_eq!(c.binds, Some("pace"));
        assert_eq!(c.first_miss, Some(4));
        assert_eq!(c.text, "3 (pace binds at 4)");
    }

    #[test]
    fn without_a_miss_it_is_a_lower_bound_and_without_data_a_reason() {
        let slo = SloConfig::default();
        let c = capacity(
            &[row(1, 30, 30, 0), row(2, 25, 25, 0), row(3, 3, 0, 0)],
            &slo,
        );
        assert_eq!(c.in_flight, Some(2));
        assert!(!c.reached);
        assert_eq!(c.text, "at least 2 (not reached)");
        let c = capacity(&[row(1, 3, 3, 0)], &slo);
        assert_eq!(c.in_flight, None);
        assert!(c.reason.unwrap().contains("min_requests"));
        let c = capacity(&[row(1, 30, 10, 0)], &slo);
        assert_eq!(c.in_flight, Some(0));
        assert_eq!(c.binds, Some("ttft"));
    }

    #[test]
    fn goodput_is_the_rate_times_the_met_token_share() {
        let mut v = VerdictsByLevel::new();
        v.add(2, Some(Ok(())), Some(30));
        v.add(2, Some(Err(SloMiss::Pace)), Some(10));
        v.add(2, None, Some(100)); // not judged: not counted
        let mut sums = BTreeMap::new();
        sums.insert(
            2,
            LevelSums {
                clean_ns: 10 * NANOS_PER_SEC,
                clean_tokens: 400.0,
                ..Default::default()
            },
        );
        let view = service_level_view(&SloConfig::default(), &v, &sums);
        let r = &view.levels[0];
        assert_eq!((r.requests, r.met), (2, 1));
        assert_eq!(r.gen_tok_s, Some(40.0));
        assert_eq!(r.per_request_tok_s, Some(20.0));
        assert_eq!(r.goodput_tok_s, Some(30.0));
        assert_eq!(r.missed.pace, 1);
        assert!(r.thin);
    }
}
