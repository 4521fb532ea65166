//! `tokenmeter serve` settings: a TOML file, overridden by `TOKENMETER_*` environment variables,
//! overridden by flags. Unknown keys are errors that name the key.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::fleet::settings::{RoutingConfig, UpstreamConfig};
use crate::record::UserSource;
use crate::tls::{ListenTlsConfig, UpstreamTlsConfig};

mod read;
mod sections;
mod upstreams;
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
    /// The service level requests are judged against (`[slo]`).
    pub slo: crate::slo::SloConfig,
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
    /// Also export one OTLP span per generation request to `<otlp_endpoint>/v1/traces`.
    pub otlp_traces: bool,
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
            slo: crate::slo::SloConfig::default(),
            upstream_metrics_url: None,
            metrics_scrape_interval_s: 10.0,
            disagreement_threshold_pct: 5.0,
            otlp_endpoint: None,
            otlp_export_interval_ms: 10_000,
            otlp_traces: false,
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
        match read::one_error(self.problems()) {
            Some(e) => Err(e),
            None => Ok(()),
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
        p.extend(self.slo.problems());
        // One bad `upstream` fails the upstream, `/metrics` and fleet checks alike: say it once.
        let mut seen = std::collections::HashSet::new();
        p.retain(|m| seen.insert(m.clone()));
        p
    }

    /// The listen address.
    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        self.listen
            .parse()
            .with_context(|| format!("listen: `{}` is not host:port", self.listen))
    }
}

/// A flag's help with the value it has when neither the flag, the environment nor the file sets
/// it (the flags are options so an absent one leaves the file's value; a clap default would not).
fn default_help(text: &str, value: &str) -> String {
    format!("{text} [default: {value}]")
}

/// Flags of `tokenmeter serve`; each overrides the file and the environment.
#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (see config/tokenmeter.toml); also `TOKENMETER_CONFIG`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on, e.g. 0.0.0.0:8080 (port 0 picks a free port).
    #[arg(long, help = default_help("Address to listen on, e.g. 0.0.0.0:8080 (port 0 picks a free port)", &ServeConfig::default().listen))]
    pub listen: Option<String>,
    /// vLLM base URL, e.g. http://127.0.0.1:8000.
    #[arg(long, help = default_help("vLLM base URL", &ServeConfig::default().upstream))]
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

/// Builds the effective config: file < environment < flags. Errors carry [`InvalidConfig`] and
/// name every problem found: unknown keys, ill-typed values and invalid values, in one run.
pub fn load(
    args: &ServeArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<ServeConfig> {
    let (config, mut problems) = read::build(args, env).map_err(|e| e.context(InvalidConfig))?;
    if let Some(c) = &config {
        problems.extend(c.problems());
    }
    read::finish(config, problems)
}

/// What `--check-config` does: builds the config like [`load`], then reports every problem at
/// once, including whether the access log can be opened for append.
pub fn check(
    args: &ServeArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<ServeConfig> {
    let (config, mut problems) = read::build(args, env).map_err(|e| e.context(InvalidConfig))?;
    if let Some(c) = &config {
        problems.extend(c.problems());
    }
    if let Some(path) = config.as_ref().and_then(|c| c.access_log.as_ref()) {
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
    read::finish(config, problems)
}

impl ServeConfig {
    /// The settings as a TOML document that `--config` accepts again; secrets are redacted.
    pub fn to_toml(&self) -> anyhow::Result<String> {
        toml::to_string(self).context("printing the config as TOML")
    }
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
    fn each_problem_is_reported_once_and_all_in_one_run() {
        let mut a = args();
        a.upstream = Some("127.0.0.1:8000".into());
        let err = format!("{:#}", load(&a, Vec::new()).unwrap_err());
        assert_eq!(err.matches("upstream:").count(), 1, "{err}");
        assert!(!err.contains("problems"), "{err}");
        assert!(
            err.contains("did you mean `http://127.0.0.1:8000`"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("tm-config-all-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "lisen = \"127.0.0.1:1\"\nmax_header_bytes = \"big\"\nserving_threads = 5000\n",
        )
        .unwrap();
        let mut a = args();
        a.config = Some(file);
        let err = format!("{:#}", load(&a, Vec::new()).unwrap_err());
        assert!(err.contains("3 problems"), "{err}");
        for key in ["lisen:", "max_header_bytes:", "serving_threads:"] {
            assert_eq!(err.matches(key).count(), 1, "{key} once: {err}");
        }
        assert!(!err.contains("\nin `"), "no toml location lines: {err}");
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
