//! `tokenmeter serve` settings: a TOML file, overridden by `TOKENMETER_*` environment variables,
//! overridden by flags. Unknown keys are errors that name the key.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::fleet::settings::{ResolvedUpstream, RoutingConfig, UpstreamConfig};
use crate::record::UserSource;

/// Environment variables with this prefix override config keys (`__` separates nesting levels).
pub const ENV_PREFIX: &str = "TOKENMETER_";
/// Environment variables with the prefix that are not config keys.
const ENV_RESERVED: [&str; 2] = ["TOKENMETER_LOG", "TOKENMETER_CONFIG"];

/// A secret string: deserialized as plain text, never printed.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// Everything `serve` needs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeConfig {
    /// Address the proxy listens on.
    pub listen: String,
    /// Base URL of the vLLM server (`http://host:port`): the single-replica shorthand, used
    /// when `upstreams` is empty (the upstream is then named by its `host:port`).
    pub upstream: String,
    /// Several named vLLM replicas; when non-empty it replaces `upstream`.
    pub upstreams: Vec<UpstreamConfig>,
    /// How requests are spread over the upstreams and how failing ones are set aside.
    pub routing: RoutingConfig,
    /// JSON-lines access log file; none when unset.
    pub access_log: Option<PathBuf>,
    /// Records the access log may queue before new ones are dropped (and counted).
    pub access_log_buffer: usize,
    /// Separate address for `/stats*`; when set, `/stats` on `listen` passes through upstream.
    pub admin_listen: Option<String>,
    /// Bearer token required for `/stats*` when set.
    pub stats_token: Option<Secret>,
    /// Ask the upstream for usage on chat and completions streams that did not, and hide it from
    /// the client (Responses and Messages streams carry usage unasked: never touched).
    pub inject_stream_usage: bool,
    /// Per API: send non-streamed generation requests upstream as streams, measure their TTFT,
    /// and answer with the JSON the client asked for (off by default).
    pub ttft_for_non_streamed: UpgradeConfig,
    /// The upstream vLLM runs with `--enable-force-include-usage`: it sends the usage event on
    /// every stream anyway, so the proxy neither asks for it nor removes it.
    pub upstream_force_include_usage: bool,
    /// Measure and meter responses; off makes tokenmeter a plain pass-through (for benchmarks).
    pub metering: bool,
    /// Largest request head (request line and headers) accepted; larger gets 431.
    pub max_header_bytes: usize,
    /// Largest request body accepted; larger gets 413.
    pub max_request_body_bytes: u64,
    /// Largest non-streamed response copied aside to read its `usage`; larger passes unread.
    pub max_response_scan_bytes: usize,
    /// Largest single SSE event parsed; larger events pass through unread.
    pub max_sse_event_bytes: usize,
    /// Seconds in-flight requests may take to finish after SIGTERM/SIGINT.
    pub shutdown_grace_s: u64,
    /// Threads accepting and serving connections, each with its own runtime; 0 = one per core.
    pub serving_threads: usize,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Who is the user.
    pub users: UsersConfig,
    /// The live meter: windows, user caps, cold starts.
    pub meter: crate::meter::MeterConfig,
    /// vLLM's `/metrics` to scrape for the cross-check: unset or `""` = off, `"auto"` = the
    /// upstream's `/metrics` (at the root of its host:port), or an `http://` URL.
    pub upstream_metrics_url: Option<String>,
    /// Seconds between two scrapes (the timeout is half of it, at most 5 s).
    pub metrics_scrape_interval_s: f64,
    /// A window's `server.disagreement` is true beyond this |proxy − server| / server, percent.
    pub disagreement_threshold_pct: f64,
    /// OTLP/HTTP receiver (`http://host:port[/base]`) for the GenAI metrics; unset = no export.
    pub otlp_endpoint: Option<String>,
    /// Milliseconds between two OTLP exports.
    pub otlp_export_interval_ms: u64,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            listen: "127.0.0.1:8080".into(),
            upstream: "http://127.0.0.1:8000".into(),
            upstreams: Vec::new(),
            routing: RoutingConfig::default(),
            access_log: None,
            access_log_buffer: 65_536,
            admin_listen: None,
            stats_token: None,
            inject_stream_usage: true,
            ttft_for_non_streamed: UpgradeConfig::default(),
            upstream_force_include_usage: false,
            metering: true,
            max_header_bytes: 64 * 1024,
            max_request_body_bytes: 64 * 1024 * 1024,
            max_response_scan_bytes: 4 * 1024 * 1024,
            max_sse_event_bytes: 1024 * 1024,
            shutdown_grace_s: 30,
            serving_threads: 0,
            timeouts: Timeouts::default(),
            users: UsersConfig::default(),
            meter: crate::meter::MeterConfig::default(),
            upstream_metrics_url: None,
            metrics_scrape_interval_s: 10.0,
            disagreement_threshold_pct: 5.0,
            otlp_endpoint: None,
            otlp_export_interval_ms: 10_000,
        }
    }
}

/// `ttft_for_non_streamed`: per API, whether its non-streamed requests are sent upstream as
/// streams to measure their TTFT. All off by default: the upstream then sees exactly the
/// client's request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpgradeConfig {
    /// `POST /v1/chat/completions`.
    pub chat: bool,
    /// `POST /v1/completions`.
    pub completions: bool,
    /// `POST /v1/messages`.
    pub messages: bool,
    /// `POST /v1/responses`.
    pub responses: bool,
}

impl UpgradeConfig {
    /// Whether `api`'s non-streamed requests are upgraded.
    pub fn enabled(&self, api: crate::dialect::Api) -> bool {
        use crate::dialect::Api;
        match api {
            Api::Chat => self.chat,
            Api::Completions => self.completions,
            Api::Messages => self.messages,
            Api::Responses => self.responses,
        }
    }
}

/// Timeouts, in milliseconds. Defaults never cut a long generation or a long queue wait.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// Establishing a TCP connection to the upstream (502 after it).
    pub connect_ms: u64,
    /// Reading a client's request head (slow-header clients are dropped after it).
    pub head_read_ms: u64,
    /// Reading a client's request body (408 after it).
    pub request_body_ms: u64,
    /// Waiting for the upstream's response headers (504 after it). Non-streamed responses only
    /// send headers when generation is done, so this bounds a whole non-streamed generation.
    pub upstream_headers_ms: u64,
    /// Longest silence between two response body frames (the response is cut after it).
    pub body_idle_ms: u64,
    /// How long an idle pooled upstream connection is kept.
    pub pool_idle_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: 5_000,
            head_read_ms: 30_000,
            request_body_ms: 300_000,
            upstream_headers_ms: 3_600_000,
            body_idle_ms: 900_000,
            pool_idle_ms: 90_000,
        }
    }
}

/// How requests are attributed to users.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UsersConfig {
    /// Sources tried in order; the first that yields a name wins.
    pub order: Vec<UserSource>,
    /// Header carrying the user name (stripped before forwarding).
    pub header: String,
    /// User name → API key (or `sha256:<hex of the key>` so the file need not hold the key).
    pub api_keys: BTreeMap<String, Secret>,
    /// Reject requests whose bearer key is missing or not in `api_keys` (401).
    pub require_known_key: bool,
    /// Key sent upstream instead of the client's: replaces `Authorization`, and `x-api-key` when
    /// the client sent its key there (Anthropic clients).
    pub upstream_api_key: Option<Secret>,
}

impl Default for UsersConfig {
    fn default() -> Self {
        UsersConfig {
            order: vec![
                UserSource::Path,
                UserSource::Header,
                UserSource::KeyMap,
                UserSource::Body,
                UserSource::KeyHash,
                UserSource::Ip,
            ],
            header: "x-tokenmeter-user".into(),
            api_keys: BTreeMap::new(),
            require_known_key: false,
            upstream_api_key: None,
        }
    }
}

impl ServeConfig {
    /// Checks every value that deserialization alone cannot.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.listen_addr()?;
        if let Some(a) = &self.admin_listen {
            a.parse::<SocketAddr>()
                .with_context(|| format!("admin_listen: `{a}` is not host:port"))?;
        }
        let ups = self.resolved_upstreams()?;
        let mut names = std::collections::HashSet::new();
        for u in &ups {
            if u.name.is_empty()
                || u.name.len() > 64
                || !u
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
            {
                bail!(
                    "upstreams: name `{}` must be 1 to 64 of A-Z a-z 0-9 - _ . :",
                    u.name
                );
            }
            if !names.insert(u.name.clone()) {
                bail!("upstreams: name `{}` appears twice", u.name);
            }
        }
        if ups.len() > 64 {
            bail!("upstreams: at most 64");
        }
        let r = &self.routing;
        if !(r.models_refresh_s == 0.0 || (0.1..=86_400.0).contains(&r.models_refresh_s)) {
            bail!("routing.models_refresh_s: must be 0 or between 0.1 and 86400");
        }
        if let Some(e) = self.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
            let uri: http::Uri = e
                .parse()
                .with_context(|| format!("otlp_endpoint: `{e}` is not a URL"))?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                bail!("otlp_endpoint: `{e}` must be http://host:port[/base]");
            }
        }
        if !(100..=3_600_000).contains(&self.otlp_export_interval_ms) {
            bail!("otlp_export_interval_ms: must be between 100 and 3600000");
        }
        if r.eject_base_ms == 0 || r.eject_max_ms < r.eject_base_ms {
            bail!("routing: eject_base_ms must be positive and at most eject_max_ms");
        }
        if !(self.metrics_scrape_interval_s >= 0.1 && self.metrics_scrape_interval_s <= 3600.0) {
            bail!("metrics_scrape_interval_s: must be between 0.1 and 3600");
        }
        if !(self.disagreement_threshold_pct.is_finite() && self.disagreement_threshold_pct >= 0.0)
        {
            bail!("disagreement_threshold_pct: must be a non-negative number");
        }
        if self.max_header_bytes < 1024 {
            bail!("max_header_bytes: must be at least 1024");
        }
        if self.serving_threads > 1024 {
            bail!("serving_threads: must be at most 1024 (0 = one per core)");
        }
        if self.max_request_body_bytes == 0
            || self.access_log_buffer == 0
            || self.max_sse_event_bytes == 0
        {
            bail!("max_request_body_bytes, access_log_buffer and max_sse_event_bytes must be positive");
        }
        let t = &self.timeouts;
        for (name, v) in [
            ("connect_ms", t.connect_ms),
            ("head_read_ms", t.head_read_ms),
            ("request_body_ms", t.request_body_ms),
            ("upstream_headers_ms", t.upstream_headers_ms),
            ("body_idle_ms", t.body_idle_ms),
        ] {
            if v == 0 {
                bail!("timeouts.{name}: must be positive");
            }
        }
        if self.users.order.is_empty() {
            bail!("users.order: must name at least one source");
        }
        let mut seen = Vec::new();
        for s in &self.users.order {
            if seen.contains(s) {
                bail!("users.order: {s:?} appears twice");
            }
            seen.push(*s);
        }
        http::HeaderName::from_bytes(self.users.header.as_bytes()).with_context(|| {
            format!("users.header: `{}` is not a header name", self.users.header)
        })?;
        if self.users.require_known_key && self.users.api_keys.is_empty() {
            bail!("users.require_known_key needs users.api_keys");
        }
        self.meter
            .validate()
            .map_err(|e| anyhow::anyhow!("meter: {e}"))?;
        Ok(())
    }

    /// The upstream as `/stats` names it: the `upstream` URL, or the `upstreams` URLs joined by
    /// commas.
    pub fn upstream_label(&self) -> String {
        if self.upstreams.is_empty() {
            return self.upstream.clone();
        }
        let urls: Vec<&str> = self.upstreams.iter().map(|u| u.url.as_str()).collect();
        urls.join(",")
    }

    /// The listen address.
    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listen
            .parse()
            .with_context(|| format!("listen: `{}` is not host:port", self.listen))
    }

    /// The upstreams: `upstreams` when given, else `upstream` named by its `host:port`.
    pub fn resolved_upstreams(&self) -> anyhow::Result<Vec<ResolvedUpstream>> {
        let list: Vec<(String, &str, Option<&str>)> = if self.upstreams.is_empty() {
            let uri = parse_upstream("upstream", &self.upstream)?;
            let name = uri
                .authority()
                .map_or("upstream", |a| a.as_str())
                .to_string();
            vec![(name, self.upstream.as_str(), None)]
        } else {
            self.upstreams
                .iter()
                .map(|u| (u.name.clone(), u.url.as_str(), u.metrics_url.as_deref()))
                .collect()
        };
        list.into_iter()
            .map(|(name, url, metrics)| {
                let key = format!("upstreams.{name}.url");
                let uri = parse_upstream(&key, url)?;
                let authority = uri.authority().context("upstream has no host")?.to_string();
                let base = format!("http://{authority}{}", uri.path().trim_end_matches('/'));
                let metrics =
                    metrics_target(metrics.or(self.upstream_metrics_url.as_deref()), &authority)?;
                Ok(ResolvedUpstream {
                    name,
                    url: url.to_string(),
                    base,
                    authority,
                    metrics,
                })
            })
            .collect()
    }

    /// The `/metrics` URL of the first upstream to scrape for the cross-check; `None` when
    /// scraping is off.
    pub fn metrics_uri(&self) -> anyhow::Result<Option<http::Uri>> {
        let up = self.upstream_uri()?;
        let authority = up.authority().context("upstream has no host")?;
        metrics_target(self.upstream_metrics_url.as_deref(), authority.as_str())
    }

    /// The upstream base URI (scheme http, with an authority) of the single-upstream shorthand.
    pub fn upstream_uri(&self) -> anyhow::Result<http::Uri> {
        parse_upstream("upstream", &self.upstream)
    }
}

/// Parses an upstream base URL (scheme http, with an authority); `key` names the setting.
fn parse_upstream(key: &str, raw: &str) -> anyhow::Result<http::Uri> {
    let uri: http::Uri = raw
        .parse()
        .with_context(|| format!("{key}: `{raw}` is not a URL"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        bail!("{key}: `{raw}` must be http://host:port (https is not supported)");
    }
    Ok(uri)
}

/// A `/metrics` setting (`None`/`""` off, `"auto"`, or a URL) for the upstream at `authority`.
fn metrics_target(setting: Option<&str>, authority: &str) -> anyhow::Result<Option<http::Uri>> {
    let raw = match setting.map(str::trim) {
        None | Some("") => return Ok(None),
        Some(r) => r,
    };
    if raw == "auto" {
        let uri = format!("http://{authority}/metrics")
            .parse()
            .context("upstream_metrics_url")?;
        return Ok(Some(uri));
    }
    let uri: http::Uri = raw
        .parse()
        .with_context(|| format!("upstream_metrics_url: `{raw}` is not a URL"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        bail!("upstream_metrics_url: `{raw}` must be \"auto\" or http://host:port/path");
    }
    Ok(Some(uri))
}

/// Flags of `tokenmeter serve`; each overrides the file and the environment.
#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (see config/tokenmeter.toml); also `TOKENMETER_CONFIG`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 0.0.0.0:8080 (port 0 picks a free port).
    #[arg(long)]
    pub listen: Option<String>,
    /// vLLM base URL, e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub upstream: Option<String>,
    /// JSON-lines access log file.
    #[arg(long)]
    pub access_log: Option<PathBuf>,
    /// Serve /stats* on this separate address instead.
    #[arg(long)]
    pub admin_listen: Option<String>,
    /// Any other setting, as KEY=VALUE with dotted keys (e.g. timeouts.connect_ms=2000); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Validate the configuration, print it (secrets redacted) and exit.
    #[arg(long)]
    pub check_config: bool,
}

/// Builds the effective config: file < environment < flags.
pub fn load(
    args: &ServeArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<ServeConfig> {
    let env: Vec<(String, String)> = env.into_iter().collect();
    let path = args.config.clone().or_else(|| {
        env.iter()
            .find(|(k, _)| k == "TOKENMETER_CONFIG")
            .map(|(_, v)| PathBuf::from(v))
    });
    let mut table = match &path {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            text.parse::<toml::Table>()
                .with_context(|| format!("parsing {}", p.display()))?
        }
        None => toml::Table::new(),
    };
    for (k, v) in &env {
        let Some(rest) = k.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if ENV_RESERVED.contains(&k.as_str()) || rest.is_empty() {
            continue;
        }
        let key = rest.to_ascii_lowercase().replace("__", ".");
        set_path(&mut table, &key, v).with_context(|| format!("environment variable {k}"))?;
    }
    let mut flag = |key: &str, v: Option<String>| -> anyhow::Result<()> {
        if let Some(v) = v {
            table_set(&mut table, key, toml::Value::String(v))?;
        }
        Ok(())
    };
    flag("listen", args.listen.clone())?;
    flag("upstream", args.upstream.clone())?;
    flag(
        "access_log",
        args.access_log.as_ref().map(|p| p.display().to_string()),
    )?;
    flag("admin_listen", args.admin_listen.clone())?;
    for kv in &args.set {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--set {kv}: expected KEY=VALUE"))?;
        set_path(&mut table, k.trim(), v).with_context(|| format!("--set {k}"))?;
    }
    let config = ServeConfig::deserialize(toml::Value::Table(table))
        .map_err(|e| anyhow::anyhow!("config: {}", e.to_string().trim()))?;
    config.validate()?;
    Ok(config)
}

/// Sets a dotted key to a raw value: TOML syntax when it parses as TOML, else a plain string.
fn set_path(table: &mut toml::Table, key: &str, raw: &str) -> anyhow::Result<()> {
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    table_set(table, key, value)
}

fn table_set(table: &mut toml::Table, key: &str, value: toml::Value) -> anyhow::Result<()> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts
        .pop()
        .filter(|s| !s.is_empty())
        .with_context(|| format!("empty key `{key}`"))?;
    let mut t = table;
    for p in parts {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        t = entry
            .as_table_mut()
            .with_context(|| format!("`{p}` is not a table"))?;
    }
    t.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ServeArgs {
        ServeArgs::default()
    }

    #[test]
    fn defaults_validate() {
        let c = load(&args(), Vec::new()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080");
        assert!(c.inject_stream_usage);
    }

    #[test]
    fn env_overrides_file_and_flags_override_env() {
        let dir = std::env::temp_dir().join(format!("tm-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:1\"\n[timeouts]\nconnect_ms = 7\n",
        )
        .unwrap();
        let mut a = args();
        a.config = Some(file);
        let env = vec![
            ("TOKENMETER_LISTEN".to_string(), "127.0.0.1:2".to_string()),
            (
                "TOKENMETER_TIMEOUTS__CONNECT_MS".to_string(),
                "9".to_string(),
            ),
            ("TOKENMETER_LOG".to_string(), "debug".to_string()),
        ];
        let c = load(&a, env.clone()).unwrap();
        assert_eq!(
            (c.listen.as_str(), c.timeouts.connect_ms),
            ("127.0.0.1:2", 9)
        );
        a.listen = Some("127.0.0.1:3".into());
        a.set = vec!["timeouts.connect_ms=11".into(), "users.header=x-who".into()];
        let c = load(&a, env).unwrap();
        assert_eq!(
            (
                c.listen.as_str(),
                c.timeouts.connect_ms,
                c.users.header.as_str()
            ),
            ("127.0.0.1:3", 11, "x-who")
        );
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = load(&args(), vec![("TOKENMETER_LISTNE".into(), "x".into())]).unwrap_err();
        assert!(format!("{err:#}").contains("listne"), "{err:#}");
        let mut a = args();
        a.set = vec!["timeouts.conect_ms=1".into()];
        let err = load(&a, Vec::new()).unwrap_err();
        assert!(format!("{err:#}").contains("conect_ms"), "{err:#}");
    }

    #[test]
    fn invalid_values_are_explained() {
        let mut a = args();
        a.upstream = Some("https://x".into());
        assert!(format!("{:#}", load(&a, Vec::new()).unwrap_err()).contains("https"));
        let mut a = args();
        a.set = vec!["max_header_bytes=100".into()];
        assert!(format!("{:#}", load(&a, Vec::new()).unwrap_err()).contains("1024"));
    }

    #[test]
    fn secrets_do_not_print() {
        let mut a = args();
        a.set = vec![
            "users.upstream_api_key=\"sk-canary-123\"".into(),
            "stats_token=tok-canary".into(),
        ];
        let c = load(&a, Vec::new()).unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains("canary"), "{shown}");
    }
}
