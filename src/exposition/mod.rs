//! Metrics as declarations, and the Prometheus text written from them: every metric the program
//! exposes or reads is one `const` [`Metric`] (name, help, type, unit, labels, buckets), declared
//! beside the code that gives it its values; [`Text`] writes any of them. The simulator's
//! `/metrics` (vLLM's series, declared in [`vllm`], which the scraper reads by the same
//! declarations) and the meter's `/stats/metrics` (tokenmeter's) are both written so.

pub(crate) mod metric;
pub(crate) mod text;
pub mod vllm;

pub use metric::{Kind, Metric, Unit};
pub use text::{Style, Text, Value, NO_LABELS};

/// Time-to-first-token bucket upper bounds, seconds: vLLM 0.32's, for both.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Inter-token latency bucket upper bounds, seconds: vLLM 0.32's (the simulator's ITL, and the
/// per-request ITL counts in `itl.rs`, which compare with vLLM's bucket for bucket). An array, so
/// `itl.rs` can size its counts by it.
pub const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// Time-per-output-token bucket upper bounds, seconds (the meter's): vLLM's inter-token bounds,
/// extended to 640 s because a client-side TPOT includes queueing behind long prompts, and below
/// 10 ms down to 1 ms, where a fast decoder at low concurrency spends 3 to 8 ms per token.
pub const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.0075, 0.01, 0.0125, 0.015, 0.025, 0.03, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
    640.0,
];
/// Request-latency bucket upper bounds (end to end, queue time), seconds: vLLM 0.32's.
pub const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_tables_ascend_and_tpot_extends_vllms_itl() {
        for t in [TTFT_BUCKETS, &ITL_BUCKETS, TPOT_BUCKETS, REQUEST_BUCKETS] {
            assert!(t.windows(2).all(|w| w[0] < w[1]));
        }
        // Every vLLM inter-token bound is a TPOT bound too, so the two compare bucket by bucket.
        assert!(ITL_BUCKETS.iter().all(|b| TPOT_BUCKETS.contains(b)));
        assert!(TPOT_BUCKETS.iter().filter(|b| **b < 0.01).count() >= 6);
    }
}
