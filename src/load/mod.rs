//! `tokenmeter load`: the burst sweep and the sustained method against any OpenAI-compatible
//! server reachable over `http://`.
//!
//! `--url` may be given with or without a trailing `/v1` (and with or without a trailing `/`):
//! requests go to `{base}/v1/chat/completions` (or the route of `--api`), models are listed from `{base}/v1/models`, and a
//! tokenmeter proxy is probed at `{base}/stats`.
//!
//! Definitions (per request, see [`RequestResult`]):
//! - `e2e_ms`: from just before the request is handed to the connection pool (so a new
//!   connection's setup is included) to the end of the response body;
//! - `ttft_ms` (streaming only): to the first event whose `choices` is non-empty (chat,
//!   completions), or the first output delta (Responses, Messages; see [`api`]);
//! - `completion_tokens`: the final `usage` (`stream_options.include_usage` is sent to chat and
//!   completions; Responses and Messages always report it); without it, streamed output events
//!   are counted and the result says so (`tokens_from`);
//! - `tok_s = completion_tokens / e2e`.
//!
//! Burst sweep (per level, see [`LevelReport`]): one warm-up request first (reported apart), then
//! all requests of the level dispatched at once with one distinct prompt per slot;
//! `aggregate_tok_s = Σ completion_tokens of ok requests / batch wall`,
//! `scaling_vs_first = aggregate / aggregate of the first level`,
//! `marginal_gain_pct = (aggregate / previous aggregate − 1) × 100`.
//!
//! Sustained (see [`SustainedReport`]): N requests in flight, each finished one replaced at once;
//! at the deadline the ones in flight are cancelled and left out;
//! `client_aggregate_tok_s = Σ completion_tokens of requests completed ok / wall`.
//! Behind a tokenmeter proxy, its 10 s windows are sampled; their steady `gen_tok_s` is the
//! stable figure, the client aggregate drifts with where the deadline cuts the requests.
//!
//! Agent-like (see [`agents`]): `--agents N` closed-loop agents with think time, or `--poisson
//! RATE` open-loop arrivals, prompt and output lengths from distributions; behind a proxy, its
//! production-traffic capacity table is printed beside the client's figures.

pub(crate) mod agents;
pub(crate) mod api;
pub(crate) mod burst;
pub(crate) mod client;
pub(crate) mod dist;
pub(crate) mod duration;
pub(crate) mod event;
pub(crate) mod progress;
pub mod prompts;
pub(crate) mod report;
pub(crate) mod result;
pub(crate) mod session;
pub(crate) mod stats;
pub(crate) mod summary;
pub(crate) mod sustained;
pub mod table;

use std::time::{Duration, Instant};

pub use api::Api;
pub use client::{ChatSpec, HttpClient};
pub use dist::Dist;
pub use progress::{NoProgress, Progress, ProgressEvent, StderrProgress};
pub use report::{AgentSpec, AgentsReport, Arrivals};
pub use report::{BurstReport, LevelReport, LoadReport, SustainedReport};
pub use result::{RequestResult, TokensFrom};

/// Default burst levels.
pub const DEFAULT_LEVELS: [usize; 4] = [1, 4, 8, 16];
/// Default `max_tokens` of the burst sweep.
pub const DEFAULT_BURST_MAX_TOKENS: u32 = 250;
/// Default `max_tokens` of the sustained method (long generations so steady state dominates).
pub const DEFAULT_SUSTAINED_MAX_TOKENS: u32 = 1500;
/// Largest burst level or sustained concurrency accepted.
pub const MAX_CONCURRENCY: usize = 4096;

/// Arguments of `tokenmeter load`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Server URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted).
    #[arg(long)]
    pub url: String,
    /// Burst sweep levels: all requests of a level are dispatched together.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_LEVELS)]
    pub levels: Vec<usize>,
    /// Run the sustained method instead of the burst sweep.
    #[arg(long)]
    pub sustained: bool,
    /// Requests kept in flight by the sustained method.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Length of the sustained run (e.g. 60s, 2m, 500ms).
    #[arg(long, default_value = "60s", value_parser = duration::parse_duration)]
    pub duration: Duration,
    /// The generation API to speak: chat, completions, responses (OpenAI Responses) or messages
    /// (Anthropic Messages, key sent as x-api-key). With --agents or --poisson also a
    /// comma-separated list spoken in turn (agent i speaks the (i mod n)-th), or `mix`
    /// (chat,responses,messages,completions).
    #[arg(long, value_parser = api::parse_api_list, default_value = "chat")]
    pub api: api::ApiList,
    /// Stream responses (the default).
    #[arg(long, overrides_with = "no_stream")]
    pub stream: bool,
    /// Do not stream: tokens from usage, TTFT unknown.
    #[arg(long, overrides_with = "stream")]
    pub no_stream: bool,
    /// max_tokens per request (default 250 for the burst sweep, 1500 sustained).
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Model name (default: the first id of GET /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// API key, sent as `Authorization: Bearer`; never printed.
    #[arg(long, env = "TOKENMETER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// User name, sent as header x-tokenmeter-user and body field `user`.
    #[arg(long)]
    pub user: Option<String>,
    /// Send vLLM's "ignore_eos": true so every request generates max_tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print the report as JSON on stdout (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
    /// Per-request timeout.
    #[arg(long, default_value = "600s", value_parser = duration::parse_duration)]
    pub timeout: Duration,
    /// Where a tokenmeter proxy serves /stats when not at --url: its admin_listen address, e.g.
    /// http://127.0.0.1:9090 (default: the --url server itself).
    #[arg(long)]
    pub stats_url: Option<String>,
    /// How often the sustained method samples a tokenmeter proxy's /stats and prints progress.
    #[arg(long, default_value = "10s", value_parser = duration::parse_duration)]
    pub stats_interval: Duration,
    /// Agent-like load: this many agents, each thinking between its requests (runs --duration).
    #[arg(long, conflicts_with_all = ["sustained", "poisson"])]
    pub agents: Option<usize>,
    /// Agent-like load, open loop: Poisson arrivals at this mean rate, requests per second.
    #[arg(long, conflicts_with = "sustained")]
    pub poisson: Option<f64>,
    /// Poisson arrivals are skipped (and counted) while this many requests are in flight.
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// Think time between an agent's answer and its next request, ms: N, MIN..MAX or exp:MEAN.
    #[arg(long, default_value = "200..3000", value_parser = Dist::parse)]
    pub think_ms: Dist,
    /// Prompt length in words (agents, Poisson): N, MIN..MAX or exp:MEAN.
    #[arg(long, default_value = "10..2000", value_parser = Dist::parse)]
    pub prompt_words: Dist,
    /// max_tokens of each request (agents, Poisson): N, MIN..MAX or exp:MEAN; --max-tokens fixes it.
    #[arg(long, value_parser = Dist::parse)]
    pub output_tokens: Option<Dist>,
    /// Share of agent requests that stream, 0..1 (--no-stream: 0).
    #[arg(long, default_value_t = 1.0)]
    pub stream_share: f64,
    /// Turns per session of an agent (`--agents`), then a new session: N, MIN..MAX or exp:MEAN.
    #[arg(long, default_value = "1..4", value_parser = Dist::parse)]
    pub turns_per_session: Dist,
    /// Calls per turn (the first carries the user's message, each later one a tool result).
    #[arg(long, default_value = "1..3", value_parser = Dist::parse)]
    pub calls_per_turn: Dist,
    /// Sessions each agent runs, then stops; the run ends when all have (or at --duration), so
    /// no call is cut at the deadline.
    #[arg(long)]
    pub sessions_per_agent: Option<u64>,
    /// Seed of the agents' draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Which method to run.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadMethod {
    /// The burst sweep over these levels.
    Burst {
        /// Requests per level.
        levels: Vec<usize>,
    },
    /// The sustained method.
    Sustained {
        /// Requests kept in flight.
        concurrency: usize,
        /// Length of the run.
        duration: Duration,
    },
    /// Agent-like load.
    Agents {
        /// Agents or Poisson arrivals.
        arrivals: Arrivals,
        /// The traffic's shape.
        spec: AgentSpec,
        /// Length of the run.
        duration: Duration,
    },
}

/// An API key; its `Debug` never shows it.
#[derive(Clone)]
pub struct ApiKey(pub String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Everything a load run needs (the library form of [`LoadArgs`]).
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Server URL (normalized by [`client::normalize_base_url`]).
    pub url: String,
    /// Method and its parameters.
    pub method: LoadMethod,
    /// The generation API spoken.
    pub api: Api,
    /// Stream responses.
    pub stream: bool,
    /// max_tokens; None picks the method's default.
    pub max_tokens: Option<u32>,
    /// Model; None asks `GET /v1/models`.
    pub model: Option<String>,
    /// Bearer token.
    pub api_key: Option<ApiKey>,
    /// User sent as header and body field.
    pub user: Option<String>,
    /// Send `ignore_eos`.
    pub ignore_eos: bool,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Sustained: proxy `/stats` poll and progress interval.
    pub stats_interval: Duration,
    /// Where the proxy's `/stats` is, when not at `url` (its `admin_listen`).
    pub stats_url: Option<String>,
}

impl LoadOptions {
    /// A default burst sweep of `levels` against `url`.
    pub fn burst(url: impl Into<String>, levels: &[usize]) -> Self {
        Self::with_method(
            url.into(),
            LoadMethod::Burst {
                levels: levels.to_vec(),
            },
        )
    }

    /// A default sustained run against `url`.
    pub fn sustained(url: impl Into<String>, concurrency: usize, duration: Duration) -> Self {
        Self::with_method(
            url.into(),
            LoadMethod::Sustained {
                concurrency,
                duration,
            },
        )
    }

    /// A default agent-like run against `url`.
    pub fn agents(
        url: impl Into<String>,
        arrivals: Arrivals,
        spec: AgentSpec,
        duration: Duration,
    ) -> Self {
        Self::with_method(
            url.into(),
            LoadMethod::Agents {
                arrivals,
                spec,
                duration,
            },
        )
    }

    fn with_method(url: String, method: LoadMethod) -> Self {
        Self {
            url,
            method,
            api: Api::Chat,
            stream: true,
            max_tokens: None,
            model: None,
            api_key: None,
            user: None,
            ignore_eos: false,
            timeout: Duration::from_secs(600),
            stats_interval: Duration::from_secs(10),
            stats_url: None,
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        let ok_n = |n: usize| (1..=MAX_CONCURRENCY).contains(&n);
        match &self.method {
            LoadMethod::Burst { levels } if levels.is_empty() => anyhow::bail!("--levels is empty"),
            LoadMethod::Burst { levels } if !levels.iter().all(|&l| ok_n(l)) => {
                anyhow::bail!("--levels must be between 1 and {MAX_CONCURRENCY}")
            }
            LoadMethod::Sustained { concurrency, .. } if !ok_n(*concurrency) => {
                anyhow::bail!("--concurrency must be between 1 and {MAX_CONCURRENCY}")
            }
            LoadMethod::Agents {
                arrivals: Arrivals::Agents { agents },
                ..
            } if !ok_n(*agents) => {
                anyhow::bail!("--agents must be between 1 and {MAX_CONCURRENCY}")
            }
            LoadMethod::Agents {
                arrivals:
                    Arrivals::Poisson {
                        rate_per_s,
                        max_in_flight,
                    },
                ..
            } if !(rate_per_s.is_finite() && *rate_per_s > 0.0 && ok_n(*max_in_flight)) => {
                anyhow::bail!(
                    "--poisson must be a positive rate and --max-in-flight 1..={MAX_CONCURRENCY}"
                )
            }
            LoadMethod::Agents { spec, .. } if !(0.0..=1.0).contains(&spec.stream_share) => {
                anyhow::bail!("--stream-share must be between 0 and 1")
            }
            _ => {}
        }
        if self.max_tokens == Some(0) {
            anyhow::bail!("--max-tokens must be at least 1");
        }
        if self.timeout.is_zero() {
            anyhow::bail!("--timeout must be positive");
        }
        Ok(())
    }
}

impl TryFrom<LoadArgs> for LoadOptions {
    type Error = anyhow::Error;

    fn try_from(a: LoadArgs) -> anyhow::Result<Self> {
        let apis = a.api.0;
        let Some(&api) = apis.first() else {
            anyhow::bail!("--api names no API");
        };
        if apis.len() > 1 && a.agents.is_none() && a.poisson.is_none() {
            anyhow::bail!(
                "several APIs (--api {}) need --agents or --poisson",
                join_apis(&apis)
            );
        }
        let output_tokens = match (a.output_tokens, a.max_tokens) {
            (Some(d), _) => d,
            (None, Some(m)) => Dist::Fixed { value: m as u64 },
            (None, None) => AgentSpec::default().output_tokens,
        };
        let spec = AgentSpec {
            apis: if apis.len() > 1 { apis } else { Vec::new() },
            think_ms: a.think_ms,
            prompt_words: a.prompt_words,
            output_tokens,
            stream_share: if a.no_stream { 0.0 } else { a.stream_share },
            seed: a.seed,
            turns_per_session: a.turns_per_session,
            calls_per_turn: a.calls_per_turn,
            sessions_per_agent: a.sessions_per_agent,
        };
        let method = if let Some(agents) = a.agents {
            LoadMethod::Agents {
                arrivals: Arrivals::Agents { agents },
                spec,
                duration: a.duration,
            }
        } else if let Some(rate_per_s) = a.poisson {
            LoadMethod::Agents {
                arrivals: Arrivals::Poisson {
                    rate_per_s,
                    max_in_flight: a.max_in_flight,
                },
                spec,
                duration: a.duration,
            }
        } else if a.sustained {
            LoadMethod::Sustained {
                concurrency: a.concurrency,
                duration: a.duration,
            }
        } else {
            LoadMethod::Burst { levels: a.levels }
        };
        Ok(Self {
            url: a.url,
            method,
            api,
            stream: !a.no_stream,
            max_tokens: a.max_tokens,
            model: a.model,
            api_key: a.api_key.map(ApiKey),
            user: a.user,
            ignore_eos: a.ignore_eos,
            timeout: a.timeout,
            stats_interval: a.stats_interval,
            stats_url: a.stats_url,
        })
    }
}

/// `apis` as `--api` spells them.
fn join_apis(apis: &[Api]) -> String {
    apis.iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs the load described by `opts`, reporting progress as it goes.
pub async fn run(opts: LoadOptions, progress: impl Progress) -> anyhow::Result<LoadReport> {
    opts.validate()?;
    let base = client::normalize_base_url(&opts.url)?;
    let client = HttpClient::new(
        base.clone(),
        opts.api_key.as_ref().map(|k| k.0.clone()),
        opts.user.clone(),
        opts.timeout,
    );
    // The proxy's /stats: on the server itself, or on its admin address.
    let stats_client = match &opts.stats_url {
        Some(u) => HttpClient::new(
            client::normalize_base_url(u).map_err(|e| anyhow::anyhow!("--stats-url: {e}"))?,
            opts.api_key.as_ref().map(|k| k.0.clone()),
            None,
            opts.timeout,
        ),
        None => client.clone(),
    };
    let model = match &opts.model {
        Some(m) => m.clone(),
        None => client.first_model().await?,
    };
    let default_max = match &opts.method {
        LoadMethod::Burst { .. } => DEFAULT_BURST_MAX_TOKENS,
        LoadMethod::Sustained { .. } => DEFAULT_SUSTAINED_MAX_TOKENS,
        LoadMethod::Agents { spec, .. } => spec.output_tokens.mean().round() as u32,
    };
    let spec = ChatSpec {
        api: opts.api,
        model: model.clone(),
        prompt: String::new(),
        max_tokens: opts.max_tokens.unwrap_or(default_max),
        stream: opts.stream,
        ignore_eos: opts.ignore_eos,
    };
    let mut report = LoadReport {
        kind: "load_report",
        schema: report::LOAD_REPORT_SCHEMA,
        base_url: base,
        model,
        api: spec.api,
        stream: spec.stream,
        max_tokens: spec.max_tokens,
        ignore_eos: spec.ignore_eos,
        user: opts.user.clone(),
        api_key_sent: opts.api_key.is_some(),
        method: "burst",
        burst: None,
        sustained: None,
        agents: None,
        proxy: None,
    };
    match &opts.method {
        LoadMethod::Burst { levels } => {
            report.burst = Some(burst::run_burst(&client, &spec, levels, &progress).await);
        }
        LoadMethod::Sustained {
            concurrency,
            duration,
        } => {
            report.method = "sustained";
            let run = sustained::run_sustained(
                &client,
                &spec,
                *concurrency,
                *duration,
                opts.stats_interval,
                &progress,
            );
            let (s, proxy) = with_proxy_stats(&stats_client, opts.stats_interval, run).await;
            report.proxy = Some(proxy);
            report.sustained = Some(s);
        }
        LoadMethod::Agents {
            arrivals,
            spec: shape,
            duration,
        } => {
            report.method = match arrivals {
                Arrivals::Agents { .. } => "agents",
                Arrivals::Poisson { .. } => "poisson",
            };
            let run = agents::run_agents(
                &client,
                &spec,
                opts.user.as_deref(),
                *arrivals,
                shape.clone(),
                *duration,
                opts.stats_interval,
                &progress,
            );
            let (a, proxy) = with_proxy_stats(&stats_client, opts.stats_interval, run).await;
            report.proxy = Some(proxy);
            report.agents = Some(a);
        }
    }
    Ok(report)
}

/// Runs `run` while sampling a tokenmeter proxy's `/stats` every `interval` (when the server
/// is one), then reads the window that closed with the run and the final capacity table.
async fn with_proxy_stats<T>(
    client: &HttpClient,
    interval: Duration,
    run: impl std::future::Future<Output = T>,
) -> (T, stats::ProxyReport) {
    let (detected, note) = stats::probe(client).await;
    let start = Instant::now();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let poller =
        detected.then(|| tokio::spawn(stats::poll_until(client.clone(), start, interval, stop_rx)));
    let out = run.await;
    let _ = stop_tx.send(());
    let mut samples = match poller {
        Some(h) => h.await.unwrap_or_default(),
        None => Vec::new(),
    };
    if detected {
        // One sample after the run: the window that closed with it.
        if let Some(last) = stats::sample(client, start).await {
            stats::push_final(&mut samples, last, interval);
        }
    }
    let (capacity_production, service_level) = final_capacity(client, detected).await;
    let proxy = stats::ProxyReport {
        detected,
        note,
        steady_10s: stats::steady_summary(&samples),
        capacity_production,
        service_level,
        samples,
    };
    (out, proxy)
}

/// The proxy's production-traffic curve and service-level headline after a run: read once the
/// meter's current second is over, so the segments of the requests that just ended (or were
/// cancelled) are final.
async fn final_capacity(
    client: &HttpClient,
    detected: bool,
) -> (
    Option<Vec<stats::ProxyCapacityRow>>,
    Option<stats::ProxyServiceCapacity>,
) {
    if !detected {
        return (None, None);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    stats::capacity(client).await
}

/// Runs `tokenmeter load` and prints the report (tables, or JSON with `--json`).
pub async fn run_cli(args: LoadArgs) -> anyhow::Result<()> {
    let json = args.json;
    let report = run(LoadOptions::try_from(args)?, StderrProgress::default()).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table::render(&report));
    }
    Ok(())
}
