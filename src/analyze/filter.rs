//! Record selection: arrival-time range, users and models.

use crate::clock::{parse_rfc3339, UnixNanos, NANOS_PER_SEC};

use super::parse::LeanRecord;

/// Which records are analysed; everything else is counted as filtered out. The timeline and the
/// in-flight levels are rebuilt from the selected records only (with `--user`, the concurrency
/// is that user's, not the server's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    /// Keep records that arrived at or after this instant.
    pub from: Option<UnixNanos>,
    /// Keep records that arrived before this instant.
    pub to: Option<UnixNanos>,
    /// Keep only these users (empty: all).
    pub users: Vec<String>,
    /// Keep only these models (empty: all; a record without a model never matches a list).
    pub models: Vec<String>,
    /// Keep only these upstream replicas (empty: all; a record without one never matches).
    pub upstreams: Vec<String>,
}

impl Filter {
    /// Whether `r` is selected.
    pub fn keeps(&self, r: &LeanRecord<'_>) -> bool {
        if self.from.is_some_and(|f| r.ts_ns < f) || self.to.is_some_and(|t| r.ts_ns >= t) {
            return false;
        }
        if !self.users.is_empty() && !self.users.iter().any(|u| *u == r.user) {
            return false;
        }
        if !self.models.is_empty() {
            let Some(m) = r.model.as_deref() else {
                return false;
            };
            if !self.models.iter().any(|x| x == m) {
                return false;
            }
        }
        if !self.upstreams.is_empty() {
            let Some(u) = r.upstream.as_deref() else {
                return false;
            };
            if !self.upstreams.iter().any(|x| x == u) {
                return false;
            }
        }
        true
    }
}

/// Parses a time bound: RFC 3339, or relative to `now` as `-<n><unit>` with unit `s`, `m`, `h`
/// or `d` (e.g. `-2h`, `-30m`).
pub fn parse_time_bound(s: &str, now: UnixNanos) -> anyhow::Result<UnixNanos> {
    let s = s.trim();
    if let Some(rel) = s.strip_prefix('-') {
        let (num, unit) = rel.split_at(rel.len().saturating_sub(1));
        let n: u64 = num
            .parse()
            .map_err(|_| anyhow::anyhow!("bad relative time {s:?} (want e.g. -2h, -30m)"))?;
        let secs = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            _ => anyhow::bail!("bad unit in {s:?} (use s, m, h or d)"),
        };
        let back = n
            .checked_mul(secs)
            .and_then(|v| v.checked_mul(NANOS_PER_SEC))
            .ok_or_else(|| anyhow::anyhow!("relative time {s:?} too large"))?;
        return Ok(now.saturating_sub(back));
    }
    parse_rfc3339(s).ok_or_else(|| anyhow::anyhow!("bad time {s:?} (RFC 3339 or -2h/-30m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_bounds_parse_absolute_and_relative() {
        let now = 10_000 * NANOS_PER_SEC;
        assert_eq!(
            parse_time_bound("-30m", now).unwrap(),
            8_200 * NANOS_PER_SEC
        );
        assert_eq!(parse_time_bound("-2h", now).unwrap(), 2_800 * NANOS_PER_SEC);
        assert_eq!(parse_time_bound("-5s", now).unwrap(), 9_995 * NANOS_PER_SEC);
        assert_eq!(
            parse_time_bound("1970-01-01T00:00:10Z", now).unwrap(),
            10 * NANOS_PER_SEC
        );
        assert!(parse_time_bound("-2x", now).is_err());
        assert!(parse_time_bound("-h", now).is_err());
        assert!(parse_time_bound("yesterday", now).is_err());
    }
}
