//! Prometheus text exposition shared by the simulator's `/metrics` (vLLM's series) and the meter's
//! `/stats/metrics` (tokenmeter's): the one bucket table, the header lines, label escaping.

use std::fmt::Write as _;

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
/// Time-per-output-token bucket upper bounds, seconds: vLLM's inter-token bounds, extended to
/// 640 s because a client-side TPOT includes queueing behind long prompts.
pub const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0,
];
/// Request-latency bucket upper bounds (end to end, queue time), seconds: vLLM 0.32's.
pub const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Appends the `# HELP` and `# TYPE` lines of a series.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Escapes a label value: backslash, double quote and newline.
pub fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_tables_ascend_and_tpot_extends_vllms_itl() {
        for t in [TTFT_BUCKETS, &ITL_BUCKETS, TPOT_BUCKETS, REQUEST_BUCKETS] {
            assert!(t.windows(2).all(|w| w[0] < w[1]));
        }
        assert_eq!(&TPOT_BUCKETS[..ITL_BUCKETS.len()], &ITL_BUCKETS[..]);
    }

    #[test]
    fn labels_escape_and_headers_read_as_prometheus_wants() {
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let mut out = String::new();
        header(&mut out, "x_total", "counter", "Things.");
        assert_eq!(out, "# HELP x_total Things.\n# TYPE x_total counter\n");
    }
}
