//! The decode-step model continuous batching implies: a step with N sequences in the batch
//! takes about `τ(N) = a + b·N`, so each request's pace is `1 / τ(N)` and the aggregate
//! `N / τ(N)`. `a` and `b` are fitted by least squares, weighted by clean seconds, to every
//! level's measured time per token per sequence `τ_N = 1 / pace_N` over the production
//! attribution's clean time ([`LevelSums::pace`]: the streamed sequences' own pace), so levels with little time still count; the
//! band is the fit's 95 % interval. Shown beside the measured levels, never instead of them.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::clock::NANOS_PER_SEC;
use crate::slo::SloConfig;

use super::level_batches::LevelSums;
use super::summary::Z95;

/// Levels with less clean time than this give the model no point (their τ is noise).
pub const MODEL_MIN_S: f64 = 0.5;

/// The fitted decode-step model `τ(N) = a + b·N` (ms per token per sequence).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepModel {
    /// Fixed part of a decode step, ms.
    pub a_ms: f64,
    /// Added per sequence in the batch, ms.
    pub b_ms: f64,
    /// Levels the fit used (at least [`MODEL_MIN_S`] clean seconds each).
    pub levels: u32,
    /// Clean seconds behind the fit.
    pub seconds: f64,
    /// Lowest and highest level used: outside them the model extrapolates.
    pub range: [u32; 2],
    /// Highest N whose modelled pace is at least the pace bound (`1000 / slo.max_tpot_ms`);
    /// `null` when even N = 1 is slower.
    pub pace_capacity: Option<u32>,
    #[serde(skip)]
    cov: [f64; 3],
}

impl StepModel {
    /// τ(N), ms.
    pub fn step_ms(&self, n: f64) -> f64 {
        self.a_ms + self.b_ms * n
    }

    /// Per-request pace at N and its 95 % band, tokens/s.
    pub fn pace(&self, n: f64) -> (f64, [f64; 2]) {
        let tau = self.step_ms(n);
        let var = self.cov[0] + 2.0 * n * self.cov[1] + n * n * self.cov[2];
        let d = Z95 * var.max(0.0).sqrt();
        let hi = if tau - d > 0.0 {
            1_000.0 / (tau - d)
        } else {
            f64::INFINITY
        };
        (1_000.0 / tau, [1_000.0 / (tau + d), hi])
    }

    /// Fits τ_N = 1000 / pace_N ms ([`LevelSums::pace`]) against N, weighted by clean seconds;
    /// `Err` says why not.
    pub fn fit(sums: &BTreeMap<u32, LevelSums>, slo: &SloConfig) -> Result<StepModel, String> {
        let pts: Vec<(f64, f64, f64)> = sums
            .iter()
            .filter_map(|(&n, s)| {
                let secs = s.clean_ns as f64 / NANOS_PER_SEC as f64;
                let (pace, _) = s.pace(n, MODEL_MIN_S)?;
                (n > 0 && secs >= MODEL_MIN_S && pace > 0.0)
                    .then(|| (n as f64, 1_000.0 / pace, secs))
            })
            .collect();
        if pts.len() < 3 {
            return Err(format!(
                "{} level(s) with {MODEL_MIN_S} s of clean time; the fit needs 3",
                pts.len()
            ));
        }
        let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
        for &(x, y, w) in &pts {
            sw += w;
            sx += w * x;
            sy += w * y;
            sxx += w * x * x;
            sxy += w * x * y;
        }
        let det = sw * sxx - sx * sx;
        if det.abs() < f64::EPSILON {
            return Err("the levels do not spread".into());
        }
        let b = (sw * sxy - sx * sy) / det;
        let a = (sy - b * sx) / sw;
        let rss: f64 = pts
            .iter()
            .map(|&(x, y, w)| w * (y - a - b * x).powi(2))
            .sum();
        // σ² per unit weight, then (XᵀWX)⁻¹ scaled by it.
        let sigma2 = rss / (pts.len() as f64 - 2.0);
        let cov = [sigma2 * sxx / det, -sigma2 * sx / det, sigma2 * sw / det];
        let lo = pts.first().map_or(0, |p| p.0 as u32);
        let hi = pts.last().map_or(0, |p| p.0 as u32);
        let mut m = StepModel {
            a_ms: a,
            b_ms: b,
            levels: pts.len() as u32,
            seconds: sw,
            range: [lo, hi],
            pace_capacity: None,
            cov,
        };
        let bound_ms = slo.max_tpot_ms;
        // A step that does not slow with the batch sets no pace limit.
        m.pace_capacity = (b > 0.0)
            .then(|| ((bound_ms - a) / b).floor())
            .filter(|n| *n >= 1.0)
            .map(|n| n.min(u32::MAX as f64) as u32);
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_recovers_a_linear_step_exactly() {
        // The simulator's default engine: τ(N) = 12.2 + 2.1·N ms.
        let mut sums = BTreeMap::new();
        for n in [2u32, 5, 9, 13] {
            let secs = 4.0 + n as f64;
            let tau = 12.2 + 2.1 * n as f64;
            sums.insert(
                n,
                LevelSums {
                    clean_ns: (secs * 1e9) as u64,
                    clean_tokens: n as f64 * secs * 1_000.0 / tau,
                    ..Default::default()
                },
            );
        }
        let slo = SloConfig {
            max_tpot_ms: 1_000.0 / 29.0,
            ..SloConfig::default()
        };
        let m = StepModel::fit(&sums, &slo).unwrap();
        assert!((m.a_ms - 12.2).abs() < 1e-6, "{m:?}");
        assert!((m.b_ms - 2.1).abs() < 1e-6, "{m:?}");
        // Pace 1000 / (12.2 + 2.1 N) ≥ 29 up to N = 10 (30.1), not at 11 (28.3).
        assert_eq!(m.pace_capacity, Some(10));
        let (p, [lo, hi]) = m.pace(10.0);
        assert!((p - 1_000.0 / 33.2).abs() < 1e-6);
        assert!(lo <= p && p <= hi && hi - lo < 1e-3);
        assert!(StepModel::fit(&BTreeMap::new(), &slo).is_err());
    }
}
