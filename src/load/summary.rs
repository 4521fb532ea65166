//! Min/avg/max summaries, shared by the load report and the proxy's own figures (a leaf: both
//! import it, neither imports the other for it).

use serde::Serialize;

/// Minimum, arithmetic mean and maximum of a set of values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MinAvgMax {
    /// Smallest value.
    pub min: f64,
    /// Arithmetic mean.
    pub avg: f64,
    /// Largest value.
    pub max: f64,
    /// Number of values.
    pub n: usize,
}

/// Min/avg/max of `values`; None when there are none (never an invented zero).
pub fn summarize(values: impl IntoIterator<Item = f64>) -> Option<MinAvgMax> {
    let mut it = values.into_iter().filter(|v| v.is_finite());
    let first = it.next()?;
    let (mut min, mut max, mut sum, mut n) = (first, first, first, 1usize);
    for v in it {
        min = min.min(v);
        max = max.max(v);
        sum += v;
        n += 1;
    }
    Some(MinAvgMax {
        min,
        avg: sum / n as f64,
        max,
        n,
    })
}
