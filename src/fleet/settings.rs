//! The settings of several upstreams (`upstreams`, `routing`), read by `config` and used here.

use serde::{Deserialize, Serialize};

/// One named upstream replica.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Name shown in the access log (`upstream`), `/stats` and the `upstream` metric label.
    pub name: String,
    /// Base URL (`http://host:port[/base]` or `https://`).
    pub url: String,
    /// This replica's `/metrics` for the cross-check; overrides `upstream_metrics_url` (same
    /// values: `""` = off, `"auto"`, or an `http://` URL).
    #[serde(default)]
    pub metrics_url: Option<String>,
}

/// Routing over several upstreams.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// Seconds between two reads of each upstream's `/v1/models` (0 = never: every upstream
    /// serves every model).
    pub models_refresh_s: f64,
    /// First ejection of a failing upstream, milliseconds; each further failure in a row doubles it.
    pub eject_base_ms: u64,
    /// Longest ejection, milliseconds.
    pub eject_max_ms: u64,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        RoutingConfig {
            models_refresh_s: 30.0,
            eject_base_ms: 1_000,
            eject_max_ms: 30_000,
        }
    }
}

/// An upstream as the proxy uses it: validated URL pieces and the scrape target.
#[derive(Debug, Clone)]
pub struct ResolvedUpstream {
    /// Its name.
    pub name: String,
    /// Its configured URL, as written.
    pub url: String,
    /// `http[s]://host:port[/base]`, without a trailing slash.
    pub base: String,
    /// `host:port`, sent as `Host`.
    pub authority: String,
    /// Its `/metrics` to scrape, when the cross-check is on for it.
    pub metrics: Option<http::Uri>,
}
