//! Small serializable summaries shared by `/stats`, the capacity curve and `analyze`.

use serde::Serialize;

use super::histogram::LogHistogram;

/// z of a two-sided 95 % interval of a normal distribution.
pub const Z95: f64 = 1.96;

/// Nearest-rank percentiles from a [`LogHistogram`] (each within 0.5% of the sample value);
/// `null` when there were no samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
}

impl Percentiles {
    /// The percentiles of `h`.
    pub fn of(h: &LogHistogram) -> Self {
        Percentiles {
            p50: h.percentile(0.5),
            p90: h.percentile(0.9),
            p99: h.percentile(0.99),
        }
    }
}

/// Minimum, mean and maximum; each `null` when there was nothing to summarize.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MinMeanMax {
    /// Smallest value.
    pub min: Option<f64>,
    /// Arithmetic mean.
    pub mean: Option<f64>,
    /// Largest value.
    pub max: Option<f64>,
}
