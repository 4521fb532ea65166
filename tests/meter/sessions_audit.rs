//! The prefix-cache audit per in-flight level and per user (docs/sessions.md, "The audit per
//! user and per in-flight level") against the truth of a `load --agents` run through the proxy
//! to the simulator, for `sessions_vs_sim`:
//! - each call's expected prefix recomputed from the conversation load sent (every call of a
//!   load session extends the previous one: its prompt and output, in whole blocks, at most the
//!   prompt's last full block), never from the proxy's audit;
//! - each call's cached tokens as the simulator served them (their sum is asserted equal to the
//!   simulator's `prompt_tokens_cached` by the caller), its lost tokens max(0, expected − cached);
//! - grouped by the line's `in_flight_at_start` and `user`, equal exactly to `/stats`
//!   `sessions.audit` (live) and to `analyze`'s (offline), and live equal to offline.

use std::collections::BTreeMap;

use crate::meter_support::{close, json_close};
use serde_json::Value;

const B: u64 = 16;

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// One group's truth.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Truth {
    pub kept: u64,
    pub lost: u64,
    pub first: u64,
    pub expected: u64,
    pub cached: u64,
    pub lost_tokens: u64,
    pub ttft_kept: Vec<f64>,
    pub ttft_lost: Vec<f64>,
}

impl Truth {
    fn add(&mut self, expected: Option<u64>, cached: u64, ttft: Option<f64>) {
        let Some(e) = expected else {
            self.first += 1;
            return;
        };
        let lost = e.saturating_sub(cached);
        self.expected += e;
        self.cached += cached;
        self.lost_tokens += lost;
        let (n, t) = if lost == 0 {
            (&mut self.kept, &mut self.ttft_kept)
        } else {
            (&mut self.lost, &mut self.ttft_lost)
        };
        *n += 1;
        t.extend(ttft);
    }
}

/// The truth per level and per user, from the log's generation lines of load's sessions.
pub fn truth(lines: &[Value]) -> (BTreeMap<u64, Truth>, BTreeMap<String, Truth>, Truth) {
    let mut sessions: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for l in lines.iter().filter(|l| l["session"].is_string()) {
        sessions
            .entry(l["session"].as_str().unwrap())
            .or_default()
            .push(l);
    }
    let (mut levels, mut users, mut total) = (BTreeMap::new(), BTreeMap::new(), Truth::default());
    for calls in sessions.values_mut() {
        calls.sort_by_key(|l| u(&l["session_call"]));
        let mut prev: Option<&Value> = None;
        for l in calls.iter() {
            let p = u(&l["prompt_tokens"]);
            let expected = prev.map(|q| {
                let reusable = (u(&q["prompt_tokens"]) + u(&q["completion_tokens"])) / B * B;
                reusable.min((p - 1) / B * B)
            });
            // The audit's own figure agrees with the conversation's, call by call.
            assert_eq!(
                l["prefix_expected_tokens"].as_u64(),
                expected,
                "expected prefix of {l}"
            );
            let cached = u(&l["cached_prompt_tokens"]);
            let ttft = l["ttft_ms"].as_f64();
            for t in [
                levels.entry(u(&l["in_flight_at_start"])).or_default(),
                users
                    .entry(l["user"].as_str().unwrap().to_string())
                    .or_default(),
                &mut total,
            ] {
                t.add(expected, cached, ttft);
            }
            prev = Some(l);
        }
    }
    (levels, users, total)
}

/// One audit row (live or offline) equals its truth.
fn row_equals(row: &Value, t: &Truth, what: &str) {
    let v = &row["by_verdict"];
    assert_eq!(
        (u(&v["kept"]), u(&v["lost"]), u(&v["first_call"])),
        (t.kept, t.lost, t.first),
        "{what}: verdicts"
    );
    assert_eq!(u(&v["cached_unknown"]), 0, "{what}");
    assert_eq!(u(&row["expected_tokens"]), t.expected, "{what}: expected");
    let judged = t.kept + t.lost > 0;
    // Unknown, never 0: a group without a judged call has no cached figure.
    assert_eq!(
        row["cached_tokens"].as_u64(),
        judged.then_some(t.cached),
        "{what}: cached"
    );
    assert_eq!(
        row["lost_tokens"].as_u64(),
        judged.then_some(t.lost_tokens),
        "{what}: lost"
    );
    for (s, v) in [
        (&row["ttft_kept"], &t.ttft_kept),
        (&row["ttft_lost"], &t.ttft_lost),
    ] {
        assert_eq!(u(&s["count"]), v.len() as u64, "{what}: TTFT count");
        if !v.is_empty() {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            assert!(close(s["mean_ms"].as_f64().unwrap(), mean), "{what}: mean");
            let max = v.iter().copied().fold(f64::MIN, f64::max);
            assert_eq!(s["max_ms"].as_f64(), Some(max), "{what}: max");
        }
    }
}

/// Two JSON documents equal, numbers within 1e-9 relative (sums in another order).
/// The audit per level and per user, live and offline, against the truth; live equals offline
/// (the audit and the wait per turn). Returns the truth per level.
pub fn audit_equals_truth(stats: &Value, analyze: &Value, lines: &[Value]) -> BTreeMap<u64, Truth> {
    let (levels, users, total) = truth(lines);
    let live = &stats["sessions"]["audit"];
    json_close(live, &analyze["audit"], "audit: live vs analyze");
    json_close(
        &stats["sessions"]["wait_per_turn"],
        &analyze["wait_per_turn"],
        "wait per turn: live vs analyze",
    );
    row_equals(live, &total, "total");
    let by_level = live["by_level"].as_array().unwrap();
    assert_eq!(
        by_level
            .iter()
            .map(|r| u(&r["in_flight"]))
            .collect::<Vec<_>>(),
        levels.keys().copied().collect::<Vec<_>>(),
        "every level seen, ascending"
    );
    for r in by_level {
        let n = u(&r["in_flight"]);
        row_equals(r, &levels[&n], &format!("level {n}"));
    }
    let by_user = live["by_user"].as_array().unwrap();
    assert_eq!(by_user.len(), users.len().min(20));
    assert_eq!(
        u(&live["users_other"]["users"]),
        users.len().saturating_sub(20) as u64
    );
    for r in by_user {
        let name = r["user"].as_str().unwrap();
        row_equals(r, &users[name], &format!("user {name}"));
    }
    for w in by_user.windows(2) {
        assert!(
            u(&w[0]["lost_tokens"]) >= u(&w[1]["lost_tokens"]),
            "by lost tokens"
        );
    }
    levels
}
