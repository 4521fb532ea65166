//! Percentiles and the paired-difference arithmetic of the overhead harness.

/// Nearest-rank percentile `q` (0..=100) of `v`; None when empty.
pub fn pct(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    Some(s[rank.min(s.len()) - 1])
}

/// Median.
pub fn median(v: &[f64]) -> Option<f64> {
    pct(v, 50.0)
}

/// Rank-paired differences of one round: the i-th smallest of `arm` minus the i-th smallest of `base`
/// (µs). With one stream per round this is the plain paired difference.
pub fn rank_paired_us(arm: &[u64], base: &[u64]) -> Vec<f64> {
    let mut a = arm.to_vec();
    let mut b = base.to_vec();
    a.sort_unstable();
    b.sort_unstable();
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (*x as f64 - *y as f64) / 1e3)
        .collect()
}

/// Checks the arithmetic on known inputs; run at every harness start (benches have no test harness).
pub fn self_check() {
    {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(pct(&v, 50.0), Some(50.0));
        assert_eq!(pct(&v, 99.0), Some(99.0));
        assert_eq!(pct(&[], 50.0), None);
        assert_eq!(rank_paired_us(&[3000, 1000], &[500, 2500]), vec![0.5, 0.5]);
    }
}
