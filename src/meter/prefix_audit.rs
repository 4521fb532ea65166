//! The prefix-cache audit summed (docs/sessions.md, "The audit per user and per in-flight
//! level"): over agent calls, the calls by verdict, the prompt tokens the cache could have
//! served against those the server reported cached and those prefilled again, and the TTFT of
//! the calls that kept their prefix against those that lost it; in total, per user and per
//! in-flight level (`in_flight_at_start`). The live meter (`/stats` `sessions.audit`) and
//! `analyze` fill the same [`AuditBook`] from the same fields, so offline equals live.

use std::collections::BTreeMap;

use serde::Serialize;

use super::labels::OTHER;
use super::spread::{Spread, SpreadAcc};

/// Users the view lists one by one (by lost tokens, descending); the rest are summed.
pub const TOP_AUDIT_USERS: usize = 20;

/// What the audit reads of one finished agent call.
#[derive(Debug, Clone, Copy)]
pub struct AuditCall<'a> {
    /// The call's user.
    pub user: &'a str,
    /// `in_flight_at_start`: generation requests in flight when it arrived, itself included.
    pub level: u32,
    /// `prefix_audit`.
    pub verdict: Option<&'a str>,
    /// `prefix_expected_tokens`.
    pub expected: Option<u64>,
    /// `cached_prompt_tokens` (the server's count).
    pub cached: Option<u64>,
    /// `prefix_lost_tokens`.
    pub lost: Option<u64>,
    /// `ttft_ms`.
    pub ttft_ms: Option<f64>,
}

/// Calls by the audit's verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Verdicts {
    /// Extending calls whose cache kept the whole expected prefix.
    pub kept: u64,
    /// Extending calls that lost part of it.
    pub lost: u64,
    /// A session's first call.
    pub first_call: u64,
    /// Calls that do not extend their session's previous call.
    pub not_an_extension: u64,
    /// This call's or the previous call's usage missing.
    pub usage_unknown: u64,
    /// The server did not report cached tokens (and never had, for the session or upstream).
    pub cached_unknown: u64,
}

impl Verdicts {
    fn add(&mut self, verdict: &str) {
        let n = match verdict {
            "kept" => &mut self.kept,
            "lost" => &mut self.lost,
            "first_call" => &mut self.first_call,
            "not_an_extension" => &mut self.not_an_extension,
            "usage_unknown" => &mut self.usage_unknown,
            "cached_unknown" => &mut self.cached_unknown,
            _ => return,
        };
        *n += 1;
    }

    fn merge(&mut self, o: &Verdicts) {
        self.kept += o.kept;
        self.lost += o.lost;
        self.first_call += o.first_call;
        self.not_an_extension += o.not_an_extension;
        self.usage_unknown += o.usage_unknown;
        self.cached_unknown += o.cached_unknown;
    }
}

/// One group's audit (all calls, a user's, or a level's).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditRow {
    /// Calls by verdict.
    pub by_verdict: Verdicts,
    /// Σ `prefix_expected_tokens` of the calls judged `kept` or `lost`.
    pub expected_tokens: u64,
    /// Σ `cached_prompt_tokens` of those calls (a judged call without the field had 0, as the
    /// audit read it); `null` when no call was judged: unknown, not 0.
    pub cached_tokens: Option<u64>,
    /// Σ `prefix_lost_tokens` of those calls: prompt tokens prefilled again; `null` likewise.
    pub lost_tokens: Option<u64>,
    /// 100 × lost / expected; `null` when nothing was expected of a judged call.
    pub lost_pct: Option<f64>,
    /// Σ `prefix_expected_tokens` of the `cached_unknown` calls: reusable tokens whose fate the
    /// server did not report.
    pub unknown_expected_tokens: u64,
    /// TTFT of the `kept` calls (streamed ones).
    pub ttft_kept: Spread,
    /// TTFT of the `lost` calls.
    pub ttft_lost: Spread,
}

/// A group's sums, from which its [`AuditRow`] is read.
#[derive(Debug, Clone, Default)]
struct AuditAcc {
    verdicts: Verdicts,
    expected: u64,
    cached: u64,
    lost: u64,
    unknown_expected: u64,
    ttft_kept: SpreadAcc,
    ttft_lost: SpreadAcc,
}

impl AuditAcc {
    fn add(&mut self, c: &AuditCall<'_>) {
        let Some(verdict) = c.verdict else {
            return;
        };
        self.verdicts.add(verdict);
        match verdict {
            "kept" | "lost" => {
                self.expected += c.expected.unwrap_or(0);
                self.cached += c.cached.unwrap_or(0);
                self.lost += c.lost.unwrap_or(0);
                if let Some(t) = c.ttft_ms {
                    match verdict {
                        "kept" => self.ttft_kept.add(t),
                        _ => self.ttft_lost.add(t),
                    }
                }
            }
            "cached_unknown" => self.unknown_expected += c.expected.unwrap_or(0),
            _ => {}
        }
    }

    fn merge(&mut self, o: &AuditAcc) {
        self.verdicts.merge(&o.verdicts);
        self.expected += o.expected;
        self.cached += o.cached;
        self.lost += o.lost;
        self.unknown_expected += o.unknown_expected;
        self.ttft_kept.merge(&o.ttft_kept);
        self.ttft_lost.merge(&o.ttft_lost);
    }

    fn row(&self) -> AuditRow {
        let judged = self.verdicts.kept + self.verdicts.lost > 0;
        AuditRow {
            by_verdict: self.verdicts,
            expected_tokens: self.expected,
            cached_tokens: judged.then_some(self.cached),
            lost_tokens: judged.then_some(self.lost),
            lost_pct: (judged && self.expected > 0)
                .then(|| 100.0 * self.lost as f64 / self.expected as f64),
            unknown_expected_tokens: self.unknown_expected,
            ttft_kept: self.ttft_kept.spread(),
            ttft_lost: self.ttft_lost.spread(),
        }
    }

    fn calls(&self) -> u64 {
        let v = &self.verdicts;
        v.kept + v.lost + v.first_call + v.not_an_extension + v.usage_unknown + v.cached_unknown
    }
}

/// One user's audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UserAudit {
    /// The user, as in the access log.
    pub user: String,
    /// Its figures.
    #[serde(flatten)]
    pub row: AuditRow,
}

/// The users not listed, summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct UsersAuditOther {
    /// Users summed here (the live meter's `other` user, beyond `meter.max_tracked_users`,
    /// counts as one).
    pub users: u64,
    /// Their figures.
    #[serde(flatten)]
    pub row: AuditRow,
}

/// One in-flight level's audit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelAudit {
    /// `in_flight_at_start` of the calls.
    pub in_flight: u32,
    /// Their figures.
    #[serde(flatten)]
    pub row: AuditRow,
}

/// The audit: in total, per user (the top [`TOP_AUDIT_USERS`] by lost tokens, the rest summed)
/// and per in-flight level (every level seen).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditView {
    /// Over every agent call.
    #[serde(flatten)]
    pub total: AuditRow,
    /// Per user, by lost tokens (descending), then expected tokens, then name.
    pub by_user: Vec<UserAudit>,
    /// The other users, summed.
    pub users_other: UsersAuditOther,
    /// Per `in_flight_at_start`, ascending.
    pub by_level: Vec<LevelAudit>,
}

/// The audit's sums: in total, per user (at most `user_cap` by name, the rest under `other`)
/// and per level (bounded by the most requests ever in flight).
#[derive(Debug, Clone)]
pub struct AuditBook {
    total: AuditAcc,
    users: BTreeMap<String, AuditAcc>,
    user_cap: usize,
    levels: BTreeMap<u32, AuditAcc>,
}

impl AuditBook {
    /// A book keeping at most `user_cap` users by name.
    pub fn new(user_cap: usize) -> Self {
        AuditBook {
            total: AuditAcc::default(),
            users: BTreeMap::new(),
            user_cap: user_cap.max(1),
            levels: BTreeMap::new(),
        }
    }

    /// Adds a finished agent call (nothing without a verdict).
    pub fn add(&mut self, c: &AuditCall<'_>) {
        if c.verdict.is_none() {
            return;
        }
        self.total.add(c);
        self.levels.entry(c.level).or_default().add(c);
        if let Some(u) = self.users.get_mut(c.user) {
            u.add(c);
            return;
        }
        let named = self.users.len() - usize::from(self.users.contains_key(OTHER));
        let key = if named < self.user_cap { c.user } else { OTHER };
        self.users.entry(key.to_string()).or_default().add(c);
    }

    /// Adds another book's calls (`analyze`'s per-file passes).
    pub fn merge(&mut self, o: &AuditBook) {
        self.total.merge(&o.total);
        for (k, a) in &o.levels {
            self.levels.entry(*k).or_default().merge(a);
        }
        for (k, a) in &o.users {
            self.users.entry(k.clone()).or_default().merge(a);
        }
    }

    /// The view: sorting at most the users kept.
    pub fn view(&self) -> AuditView {
        let mut users: Vec<(&String, &AuditAcc)> = self.users.iter().collect();
        users.sort_by(|a, b| {
            (b.1.lost, b.1.expected, b.1.calls())
                .cmp(&(a.1.lost, a.1.expected, a.1.calls()))
                .then_with(|| a.0.cmp(b.0))
        });
        let mut other = AuditAcc::default();
        let mut others = 0;
        for (_, a) in users.iter().skip(TOP_AUDIT_USERS) {
            other.merge(a);
            others += 1;
        }
        AuditView {
            total: self.total.row(),
            by_user: users
                .iter()
                .take(TOP_AUDIT_USERS)
                .map(|(u, a)| UserAudit {
                    user: (*u).clone(),
                    row: a.row(),
                })
                .collect(),
            users_other: UsersAuditOther {
                users: others,
                row: other.row(),
            },
            by_level: self
                .levels
                .iter()
                .map(|(n, a)| LevelAudit {
                    in_flight: *n,
                    row: a.row(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(
        user: &'a str,
        level: u32,
        verdict: &'a str,
        e: u64,
        c: Option<u64>,
    ) -> AuditCall<'a> {
        let judged = matches!(verdict, "kept" | "lost");
        AuditCall {
            user,
            level,
            verdict: Some(verdict),
            expected: (verdict != "first_call").then_some(e),
            cached: c,
            lost: judged.then(|| e.saturating_sub(c.unwrap_or(0))),
            ttft_ms: Some(if verdict == "lost" { 900.0 } else { 90.0 }),
        }
    }

    #[test]
    fn per_user_and_level_with_unknown_never_zero() {
        let mut b = AuditBook::new(2);
        b.add(&call("a", 1, "first_call", 0, None));
        b.add(&call("a", 2, "kept", 160, Some(160)));
        b.add(&call("b", 2, "lost", 160, Some(32)));
        b.add(&call("b", 3, "lost", 320, None));
        b.add(&call("c", 3, "cached_unknown", 64, None));
        let v = b.view();
        let t = &v.total;
        assert_eq!((t.by_verdict.kept, t.by_verdict.lost), (1, 2));
        assert_eq!(
            (t.expected_tokens, t.cached_tokens, t.lost_tokens),
            (640, Some(192), Some(448))
        );
        assert_eq!(t.lost_pct, Some(70.0));
        assert_eq!(t.unknown_expected_tokens, 64);
        assert_eq!((t.ttft_kept.count, t.ttft_lost.count), (1, 2));
        let lv: Vec<(u32, Option<u64>, Option<u64>)> = v
            .by_level
            .iter()
            .map(|l| (l.in_flight, l.row.cached_tokens, l.row.lost_tokens))
            .collect();
        // Level 1 judged nothing: unknown, not 0.
        assert_eq!(
            lv,
            [
                (1, None, None),
                (2, Some(192), Some(128)),
                (3, Some(0), Some(320))
            ]
        );
        // "c" went past the cap of 2 users: under `other`.
        let users: Vec<&str> = v.by_user.iter().map(|u| u.user.as_str()).collect();
        assert_eq!(users, ["b", "a", "other"]);
        let o = &v.by_user[2].row;
        assert_eq!((o.cached_tokens, o.unknown_expected_tokens), (None, 64));
        // Merged halves equal the whole.
        let mut h1 = AuditBook::new(2);
        let mut h2 = AuditBook::new(2);
        h1.add(&call("a", 1, "first_call", 0, None));
        h1.add(&call("a", 2, "kept", 160, Some(160)));
        h2.add(&call("b", 2, "lost", 160, Some(32)));
        h2.add(&call("b", 3, "lost", 320, None));
        h2.add(&call("other", 3, "cached_unknown", 64, None));
        h1.merge(&h2);
        assert_eq!(h1.view(), v);
    }
}
