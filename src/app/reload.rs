//! SIGHUP reload, as nginx does it: the settings that can change under live traffic are swapped
//! (API keys, `require_known_key`, the stats token, the TLS certificates); anything else that
//! changed is named as needing a restart and keeps its running value. Requests in flight keep
//! the settings they started with, so no stream is cut. The upstream list (`upstream`,
//! `upstreams`) and `routing` are among those needing a restart: each replica's meter, scraper,
//! health slot and routing counters are built at start, and the running list keeps serving.

use std::sync::{Arc, Mutex};

use crate::config::ServeConfig;
use crate::meter::StatsToken;
use crate::proxy::LiveUsers;
use crate::tls::ListenerTls;

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    /// Settings now in effect that changed (dotted keys; secrets are named, never shown).
    pub applied: Vec<String>,
    /// Settings that changed in the file but need a restart; their running values stay.
    pub need_restart: Vec<String>,
    /// Why the certificate could not be reloaded (the old one stays), when that failed.
    pub tls_error: Option<String>,
}

/// Everything a reload may touch.
pub struct Reloader {
    running: Mutex<ServeConfig>,
    users: Arc<LiveUsers>,
    stats_token: StatsToken,
    tls: Option<Arc<ListenerTls>>,
}

impl Reloader {
    /// The reloadable parts of a proxy started with `running`.
    pub fn new(
        running: ServeConfig,
        users: Arc<LiveUsers>,
        stats_token: StatsToken,
        tls: Option<Arc<ListenerTls>>,
    ) -> Reloader {
        Reloader {
            running: Mutex::new(running),
            users,
            stats_token,
            tls,
        }
    }

    /// Applies the reloadable settings of `new` (a validated config) and re-reads the TLS files.
    pub fn apply(&self, new: &ServeConfig) -> ReloadReport {
        let mut running = match self.running.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut report = ReloadReport::default();
        if running.users.api_keys != new.users.api_keys {
            report.applied.push("users.api_keys".into());
        }
        if running.users.require_known_key != new.users.require_known_key {
            report.applied.push("users.require_known_key".into());
        }
        if running.stats_token != new.stats_token {
            report.applied.push("stats_token".into());
        }
        // The candidate: the running settings with only the reloadable ones taken from `new`.
        let mut next = running.clone();
        next.users.api_keys = new.users.api_keys.clone();
        next.users.require_known_key = new.users.require_known_key;
        next.stats_token = new.stats_token.clone();
        report.need_restart = changed_keys(&next, new);
        if next.users.require_known_key && next.users.api_keys.is_empty() {
            // Only possible when the key list comes from a setting that needs a restart.
            report.need_restart.push("users.require_known_key".into());
            next.users.require_known_key = false;
        }
        self.users.set(next.users.clone());
        self.stats_token
            .set(next.stats_token.as_ref().map(|s| s.0.as_str()));
        if let Some(tls) = &self.tls {
            match tls.reload() {
                Ok(()) => report.applied.push("tls certificate".into()),
                Err(e) => report.tls_error = Some(format!("{e:#}")),
            }
        }
        *running = next;
        report
    }
}

/// Dotted keys whose values differ between `a` and `b`. Secrets are compared as values (their
/// serialized form is redacted, so a change would not show there).
fn changed_keys(a: &ServeConfig, b: &ServeConfig) -> Vec<String> {
    let mut out = Vec::new();
    match (toml::Value::try_from(a), toml::Value::try_from(b)) {
        (Ok(x), Ok(y)) => diff("", &x, &y, &mut out),
        _ => out.push("(the settings could not be compared)".into()),
    }
    let key = "users.upstream_api_key";
    if a.users.upstream_api_key != b.users.upstream_api_key && !out.iter().any(|k| k == key) {
        out.push(key.into());
    }
    out
}

fn diff(prefix: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    match (a, b) {
        (toml::Value::Table(x), toml::Value::Table(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => diff(&path, p, q, out),
                    _ => out.push(path),
                }
            }
        }
        _ if a != b => out.push(prefix.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    #[test]
    fn only_the_reloadable_settings_change_and_the_rest_is_named() {
        let mut old = ServeConfig::default();
        old.users
            .api_keys
            .insert("alice".into(), Secret("sk-a".into()));
        let users = Arc::new(LiveUsers::new(old.users.clone()));
        let token = StatsToken::new(None);
        let r = Reloader::new(old.clone(), users.clone(), token, None);
        let mut new = old.clone();
        new.users.api_keys.clear();
        new.users
            .api_keys
            .insert("bob".into(), Secret("sk-b".into()));
        new.users.require_known_key = true;
        new.stats_token = Some(Secret("t".into()));
        new.timeouts.connect_ms = 1;
        new.users.upstream_api_key = Some(Secret("sk-up".into()));
        let report = r.apply(&new);
        assert_eq!(
            report.applied,
            vec!["users.api_keys", "users.require_known_key", "stats_token"]
        );
        assert_eq!(
            report.need_restart,
            vec!["timeouts.connect_ms", "users.upstream_api_key"]
        );
        let live = users.get();
        assert!(live.require_known_key);
        assert!(live.api_keys.contains_key("bob") && !live.api_keys.contains_key("alice"));
        assert_eq!(live.upstream_api_key, None, "kept the running value");
        // Applying the same file again changes nothing more.
        let again = r.apply(&new);
        assert!(again.applied.is_empty(), "{again:?}");
        assert_eq!(again.need_restart.len(), 2);
    }

    #[test]
    fn the_upstream_list_and_routing_need_a_restart() {
        let old = ServeConfig::default();
        let users = Arc::new(LiveUsers::new(old.users.clone()));
        let r = Reloader::new(old.clone(), users, StatsToken::new(None), None);
        let mut new = old.clone();
        new.upstreams = vec![
            crate::fleet::settings::UpstreamConfig {
                name: "a".into(),
                url: "http://127.0.0.1:9001".into(),
                metrics_url: None,
            },
            crate::fleet::settings::UpstreamConfig {
                name: "b".into(),
                url: "http://127.0.0.1:9002".into(),
                metrics_url: None,
            },
        ];
        new.routing.eject_max_ms = 5_000;
        let report = r.apply(&new);
        assert!(report.applied.is_empty(), "{report:?}");
        assert_eq!(
            report.need_restart,
            vec!["routing.eject_max_ms", "upstreams"]
        );
    }
}
