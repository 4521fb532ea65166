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
use crate::tls::{ListenTlsConfig, UpstreamTlsConfig};

mod sections;
pub use sections::{Timeouts, UpgradeConfig};

/// Environment variables with this prefix override config keys (`__` separates nesting levels).
pub const ENV_PREFIX: &str = "TOKENMETER_";
/// Environment variables with the prefix that are not config keys.
const ENV_RESERVED: [&str; 3] = [
    "TOKENMETER_LOG",
    "TOKENMETER_CONFIG",
    "TOKENMETER_LOG_FORMAT",
];

/// Marks an error as the configuration's fault (exit status 2); the message is the context's.
#[derive(Debug, Clone, Copy)]
pub struct InvalidConfig;

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid configuration")
    }
}

/// What a secret prints and serializes as.
pub const REDACTED: &str = "<redacted>";

/// A secret string: deserialized as plain text, never printed; serialized (by `--check-config`)
/// as [`REDACTED`].
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// Everything `serve` needs.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// Separate address for `/stats*`, `/healthz` and `/readyz`; when set, `/stats` on `listen`
    /// passes through upstream.
    pub admin_listen: Option<String>,
    /// TLS on `listen` (and `admin_listen`): off unless a certificate and key are given.
    pub tls: ListenTlsConfig,
    /// Trust and client certificate for an `https://` upstream.
    pub upstream_tls: UpstreamTlsConfig,
    /// `/readyz` answers 503 while the last upstream connection attempt failed less than this
    /// many seconds ago (and nothing succeeded since); 0 = upstream failures never unready it.
    pub readiness_upstream_failure_s: u64,
    /// Header carrying the request id: taken from the client when valid, else made; forwarded
    /// upstream and returned to the client.
    pub request_id_header: String,
    /// Log the client's IP address in each access-log line (`client_ip`).
    pub access_log_client_ip: bool,
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
            tls: ListenTlsConfig::default(),
            upstream_tls: UpstreamTlsConfig::default(),
            readiness_upstream_failure_s: 10,
            request_id_header: "x-request-id".into(),
            access_log_client_ip: false,
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

/// How requests are attributed to users.
#[derive(Debug, Clone, Deserialize, Serialize)]
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
    /// Checks every value that deserialization alone cannot; the error lists every problem.
    pub fn validate(&self) -> anyhow::Result<()> {
        let problems = self.problems();
        match problems.len() {
            0 => Ok(()),
            1 => bail!("{}", problems[0]),
            n => bail!("{n} problems:\n  {}", problems.join("\n  ")),
        }
    }

    /// Every problem found, one message each (empty when the settings are usable).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let mut check = |r: anyhow::Result<()>| {
            if let Err(e) = r {
                p.push(format!("{e:#}"));
            }
        };
        check(self.listen_addr().map(drop));
        if let Some(a) = &self.admin_listen {
            check(
                a.parse::<SocketAddr>()
                    .map(drop)
                    .with_context(|| format!("admin_listen: `{a}` is not host:port")),
            );
        }
        check(self.upstream_uri().map(drop));
        check(self.metrics_uri().map(drop));
        check(self.fleet_problem());
        let mut fail = |cond: bool, msg: &str| {
            if cond {
                p.push(msg.to_string());
            }
        };
        fail(
            !(self.otlp_export_interval_ms >= 100 && self.otlp_export_interval_ms <= 3_600_000),
            "otlp_export_interval_ms: must be between 100 and 3600000",
        );
        fail(
            !(self.metrics_scrape_interval_s >= 0.1 && self.metrics_scrape_interval_s <= 3600.0),
            "metrics_scrape_interval_s: must be between 0.1 and 3600",
        );
        fail(
            !(self.disagreement_threshold_pct.is_finite()
                && self.disagreement_threshold_pct >= 0.0),
            "disagreement_threshold_pct: must be a non-negative number",
        );
        fail(
            self.max_header_bytes < 1024,
            "max_header_bytes: must be at least 1024",
        );
        fail(
            self.serving_threads > 1024,
            "serving_threads: must be at most 1024 (0 = one per core)",
        );
        fail(
            self.max_request_body_bytes == 0
                || self.access_log_buffer == 0
                || self.max_sse_event_bytes == 0,
            "max_request_body_bytes, access_log_buffer and max_sse_event_bytes must be positive",
        );
        let t = &self.timeouts;
        for (name, v) in [
            ("connect_ms", t.connect_ms),
            ("head_read_ms", t.head_read_ms),
            ("request_body_ms", t.request_body_ms),
            ("upstream_headers_ms", t.upstream_headers_ms),
            ("body_idle_ms", t.body_idle_ms),
        ] {
            fail(v == 0, &format!("timeouts.{name}: must be positive"));
        }
        fail(
            self.users.order.is_empty(),
            "users.order: must name at least one source",
        );
        let mut seen = Vec::new();
        for s in &self.users.order {
            fail(
                seen.contains(s),
                &format!("users.order: {s:?} appears twice"),
            );
            seen.push(*s);
        }
        for (key, name) in [
            ("users.header", &self.users.header),
            ("request_id_header", &self.request_id_header),
        ] {
            fail(
                http::HeaderName::from_bytes(name.as_bytes()).is_err(),
                &format!("{key}: `{name}` is not a header name"),
            );
        }
        fail(
            self.users.require_known_key && self.users.api_keys.is_empty(),
            "users.require_known_key needs users.api_keys",
        );
        fail(
            self.tls.cert_file.is_some() != self.tls.key_file.is_some(),
            "tls: cert_file and key_file go together",
        );
        if let Some((cert, key)) = self.tls.files() {
            if let Err(e) = crate::tls::server_config(cert, key) {
                p.push(format!("tls: {e:#}"));
            }
        }
        if let Err(e) = crate::tls::client_config(&self.upstream_tls) {
            p.push(format!("upstream_tls: {e:#}"));
        }
        if let Err(e) = self.meter.validate() {
            p.push(format!("meter: {e}"));
        }
        p
    }

    /// The first problem with `upstreams`, `routing` or `otlp_endpoint`.
    fn fleet_problem(&self) -> anyhow::Result<()> {
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
        if r.eject_base_ms == 0 || r.eject_max_ms < r.eject_base_ms {
            bail!("routing: eject_base_ms must be positive and at most eject_max_ms");
        }
        if let Some(e) = self.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
            let uri: http::Uri = e
                .parse()
                .with_context(|| format!("otlp_endpoint: `{e}` is not a URL"))?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                bail!("otlp_endpoint: `{e}` must be http://host:port[/base]");
            }
        }
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
                let scheme = uri.scheme_str().unwrap_or("http");
                let base = format!("{scheme}://{authority}{}", uri.path().trim_end_matches('/'));
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

    /// The upstream base URI (scheme http or https, with an authority) of the single-upstream
    /// shorthand.
    pub fn upstream_uri(&self) -> anyhow::Result<http::Uri> {
        parse_upstream("upstream", &self.upstream)
    }
}

/// Parses an upstream base URL (scheme http or https, with an authority); `key` names the
/// setting.
fn parse_upstream(key: &str, raw: &str) -> anyhow::Result<http::Uri> {
    let uri: http::Uri = raw
        .parse()
        .with_context(|| format!("{key}: `{raw}` is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        bail!("{key}: `{raw}` must be http://host:port or https://host:port");
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

/// Builds the effective config: file < environment < flags. Errors carry [`InvalidConfig`].
pub fn load(
    args: &ServeArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<ServeConfig> {
    let config = build(args, env).map_err(|e| e.context(InvalidConfig))?;
    config.validate().map_err(|e| e.context(InvalidConfig))?;
    Ok(config)
}

/// What `--check-config` does: builds the config like [`load`], then reports every problem at
/// once, including whether the access log can be opened for append.
pub fn check(
    args: &ServeArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<ServeConfig> {
    let config = build(args, env).map_err(|e| e.context(InvalidConfig))?;
    let mut problems = config.problems();
    if let Some(path) = &config.access_log {
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        if let Err(e) = opened {
            problems.push(format!(
                "access_log: cannot open {} for append: {e}",
                path.display()
            ));
        }
    }
    match problems.len() {
        0 => Ok(config),
        1 => Err(anyhow::anyhow!("{}", problems[0]).context(InvalidConfig)),
        n => Err(
            anyhow::anyhow!("{n} problems:\n  {}", problems.join("\n  ")).context(InvalidConfig),
        ),
    }
}

impl ServeConfig {
    /// The settings as a TOML document that `--config` accepts again; secrets are redacted.
    pub fn to_toml(&self) -> anyhow::Result<String> {
        toml::to_string(self).context("printing the config as TOML")
    }
}

/// Builds the config without checking values beyond their types.
fn build(
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
    ServeConfig::deserialize(toml::Value::Table(table))
        .map_err(|e| anyhow::anyhow!("config: {}", e.to_string().trim()))
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
        a.upstream = Some("ftp://x".into());
        assert!(format!("{:#}", load(&a, Vec::new()).unwrap_err()).contains("https://"));
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
