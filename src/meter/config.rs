//! Settings of the live meter (the `[meter]` table of the config file).

use serde::{Deserialize, Serialize};

/// Largest accepted horizon: one day of 1-second buckets.
pub const MAX_HORIZON_S: u64 = 86_400;

/// Settings of the live meter.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MeterConfig {
    /// Seconds of 1-second buckets kept per scope (windows and the live capacity feed read these).
    pub horizon_s: u64,
    /// Window lengths reported by `/stats`, seconds (each shown as `"<W>s"`).
    pub windows_s: Vec<u64>,
    /// Users tracked individually; further users are folded into `"other"`.
    pub max_tracked_users: usize,
    /// A user with nothing in flight and no event for this long leaves the live view.
    pub user_idle_expiry_s: u64,
    /// Idle gap after which the next request counts as a cold start (the proxy decides and sets
    /// `RequestRecord::cold_start`; the meter only reads that flag).
    pub cold_start_idle_s: u64,
    /// Whether Prometheus counters carry a `user` label (capped at `max_tracked_users`).
    pub metrics_user_label: bool,
    /// A window is `steady` when the level's mean absolute deviation from its median N is at
    /// most this percentage of N (see `WindowStats::steady`).
    pub steady_tolerance_pct: u32,
    /// Production-traffic curve: levels with fewer clean seconds than this are shown as thin
    /// (no rate).
    pub capacity_min_s: u64,
    /// An arrival's guard closes at this age when the newcomer passed no token yet (non-streamed
    /// requests), milliseconds.
    pub capacity_guard_max_ms: u64,
    /// Guard added after a newcomer's first token and after each departure, milliseconds.
    pub capacity_guard_extra_ms: u64,
    /// The KV-cache headroom warns when the blocks in use reach this percentage of the cache.
    pub kv_headroom_threshold_pct: u32,
    /// The upstream's `--max-num-seqs`, when known: vLLM does not export it, so it is told here
    /// (unset: `null` in the live table).
    pub max_num_seqs: Option<u32>,
    /// The service level the capacity headline is read against: the config's `[slo]` table,
    /// copied here by the composition root (not a key of `[meter]`).
    #[serde(skip)]
    pub slo: crate::slo::SloConfig,
}

impl Default for MeterConfig {
    fn default() -> Self {
        MeterConfig {
            horizon_s: 3600,
            windows_s: vec![10, 60, 300],
            max_tracked_users: 1000,
            user_idle_expiry_s: 900,
            cold_start_idle_s: 300,
            metrics_user_label: false,
            steady_tolerance_pct: 5,
            capacity_min_s: 10,
            capacity_guard_max_ms: 1000,
            capacity_guard_extra_ms: 0,
            kv_headroom_threshold_pct: 90,
            max_num_seqs: None,
            slo: crate::slo::SloConfig::default(),
        }
    }
}

impl MeterConfig {
    /// Checks the settings; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if self.horizon_s == 0 || self.horizon_s > MAX_HORIZON_S {
            return Err(format!(
                "meter.horizon_s must be 1..={MAX_HORIZON_S}, got {}",
                self.horizon_s
            ));
        }
        if self.windows_s.is_empty() {
            return Err("meter.windows_s must not be empty".into());
        }
        let mut seen = std::collections::HashSet::new();
        for &w in &self.windows_s {
            if w == 0 || w > self.horizon_s {
                return Err(format!(
                    "meter.windows_s: {w} must be 1..=horizon_s ({})",
                    self.horizon_s
                ));
            }
            if !seen.insert(w) {
                return Err(format!("meter.windows_s: {w} is listed twice"));
            }
        }
        if self.max_tracked_users == 0 {
            return Err("meter.max_tracked_users must be at least 1".into());
        }
        if self.steady_tolerance_pct > 100 {
            return Err(format!(
                "meter.steady_tolerance_pct must be 0..=100, got {}",
                self.steady_tolerance_pct
            ));
        }
        if self.user_idle_expiry_s == 0 {
            return Err("meter.user_idle_expiry_s must be at least 1".into());
        }
        if !(1..=100).contains(&self.kv_headroom_threshold_pct) {
            return Err(format!(
                "meter.kv_headroom_threshold_pct must be 1..=100, got {}",
                self.kv_headroom_threshold_pct
            ));
        }
        if self.max_num_seqs == Some(0) {
            return Err("meter.max_num_seqs must be at least 1 (or unset)".into());
        }
        Ok(())
    }

    /// The guard settings of the production-traffic curve.
    pub fn guard(&self) -> super::levels::GuardConfig {
        super::levels::GuardConfig {
            guard_max_ns: self.capacity_guard_max_ms.saturating_mul(1_000_000),
            guard_extra_ns: self.capacity_guard_extra_ms.saturating_mul(1_000_000),
        }
    }

    /// The window names, `"<W>s"`, in configured order.
    pub fn window_names(&self) -> Vec<String> {
        self.windows_s.iter().map(|w| format!("{w}s")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        assert_eq!(MeterConfig::default().validate(), Ok(()));
        let c: MeterConfig = toml::from_str("windows_s = [5]\nmetrics_user_label = true").unwrap();
        assert_eq!(c.windows_s, vec![5]);
        assert_eq!(c.horizon_s, 3600);
        assert!(toml::from_str::<MeterConfig>("window = [5]").is_err());
        let bad = |c: MeterConfig| c.validate().unwrap_err();
        assert!(bad(MeterConfig {
            windows_s: vec![],
            ..Default::default()
        })
        .contains("windows_s"));
        assert!(bad(MeterConfig {
            windows_s: vec![7200],
            ..Default::default()
        })
        .contains("7200"));
        assert!(bad(MeterConfig {
            windows_s: vec![10, 10],
            ..Default::default()
        })
        .contains("twice"));
        assert!(bad(MeterConfig {
            horizon_s: 0,
            ..Default::default()
        })
        .contains("horizon_s"));
        assert!(bad(MeterConfig {
            max_tracked_users: 0,
            ..Default::default()
        })
        .contains("users"));
    }
}
