//! `tokenmeter sim`: a vLLM stand-in with continuous batching, vLLM 0.32's wire format and /metrics.
//!
//! Its token counts are exact ground truth: [`SimHandle::counters`] and
//! [`SimHandle::generated_tokens_in`] say precisely what was generated, and when.

pub(crate) mod api;
pub(crate) mod body;
pub(crate) mod config;
pub mod engine;
mod engine_kv;
pub(crate) mod http;
pub(crate) mod kv;
pub mod metrics;
pub mod prompt;
pub(crate) mod request;
pub mod request_log;
pub mod scheduler;
pub(crate) mod statslog;
pub(crate) mod tools;
pub mod truth;
pub(crate) mod wire_messages;
pub(crate) mod wire_openai;
pub(crate) mod wire_parts;
pub(crate) mod wire_responses;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use config::SimConfig;

use crate::clock::{Clock, NANOS_PER_SEC};

/// Arguments of `tokenmeter sim`; flags override the config file.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// TOML file with the simulator's settings (the flags' names with underscores, e.g.
    /// max_num_seqs = 64, served_model_name = "m"); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Flags that override config fields (boxed: keeps the CLI enum small).
    #[command(flatten)]
    pub overrides: Box<SimOverrides>,
}

/// `tokenmeter sim` flags that override [`SimConfig`] fields.
#[derive(Debug, Clone, clap::Args)]
pub struct SimOverrides {
    /// Maximum running sequences.
    #[arg(long, help = with_default("Maximum running sequences", SimConfig::default().max_num_seqs))]
    pub max_num_seqs: Option<u32>,
    /// Fixed part of a decode step, ms.
    #[arg(long, help = with_default("Fixed part of a decode step, ms", SimConfig::default().step_base_ms))]
    pub step_base_ms: Option<f64>,
    /// Per-sequence part of a decode step, ms.
    #[arg(long, help = with_default("Per-sequence part of a decode step, ms", SimConfig::default().step_per_seq_ms))]
    pub step_per_seq_ms: Option<f64>,
    /// Prefill speed, tokens/s.
    #[arg(long, help = with_default("Prefill speed, tokens/s", SimConfig::default().prefill_tok_s))]
    pub prefill_tok_s: Option<f64>,
    /// Extra time of the first prefill after start or idle, ms.
    #[arg(long, help = with_default("Extra time of the first prefill after start or idle, ms", SimConfig::default().cold_start_ms))]
    pub cold_start_ms: Option<f64>,
    /// Served model name.
    #[arg(long, help = with_default("Served model name", SimConfig::default().served_model_name))]
    pub model: Option<String>,
    /// Context length.
    #[arg(long, help = with_default("Context length", SimConfig::default().max_model_len))]
    pub max_model_len: Option<u64>,
    /// Fixed-pace mode (overhead benchmark): no batching model.
    #[arg(long)]
    pub fixed_pace: bool,
    /// Fixed-pace: acceptance → first event, ms.
    #[arg(long, help = with_default("Fixed-pace: acceptance → first event, ms", SimConfig::default().fixed_ttft_ms))]
    pub fixed_ttft_ms: Option<f64>,
    /// Fixed-pace: gap between events, ms.
    #[arg(long, help = with_default("Fixed-pace: gap between events, ms", SimConfig::default().fixed_gap_ms))]
    pub fixed_gap_ms: Option<f64>,
    /// Stamp every streamed event with `tm_sent_ns` (CLOCK_MONOTONIC).
    #[arg(long)]
    pub stamp_events: bool,
    /// Fill the per-request `metrics` object.
    #[arg(long)]
    pub per_request_metrics: bool,
    /// KV-cache blocks (one is vLLM's null block).
    #[arg(long, help = with_default("KV-cache blocks (one is vLLM's null block); the cache holds num_gpu_blocks × block_size tokens", SimConfig::default().num_gpu_blocks))]
    pub num_gpu_blocks: Option<u32>,
    /// Tokens per KV-cache block.
    #[arg(long, help = with_default("Tokens per KV-cache block", SimConfig::default().block_size))]
    pub block_size: Option<u32>,
    /// Turn the prefix cache on (vLLM V1's default).
    #[arg(long, conflicts_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,
    /// Turn the prefix cache off.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,
    /// Report cached prompt tokens in chat's `usage.prompt_tokens_details` and Messages'
    /// `usage.cache_read_input_tokens` (off by default, as vLLM).
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,
    /// Write one JSON line per finished request to this file, with the engine's own timings
    /// (the truth `analyze --sim-truth` compares a log with).
    #[arg(long)]
    pub truth_log: Option<PathBuf>,
}

/// A flag's help with the value it has when neither the flag nor the config file sets it (the
/// flags are options so that an absent one leaves the file's value; clap's own default would
/// override the file).
fn with_default(text: &str, value: impl std::fmt::Display) -> String {
    format!("{text} [default: {value}]")
}

impl SimArgs {
    /// The configuration: file (if any), then flags.
    pub fn to_config(&self) -> anyhow::Result<SimConfig> {
        let mut c = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("reading {}: {e}", p.display()))?;
                toml::from_str(&text)
                    .map_err(|e| anyhow::anyhow!("parsing {}: {e}", p.display()))?
            }
            None => SimConfig::default(),
        };
        let o = &self.overrides;
        macro_rules! set {
            ($($f:ident => $t:ident),*) => { $(if let Some(v) = o.$f.clone() { c.$t = v; })* };
        }
        set!(max_num_seqs => max_num_seqs, step_base_ms => step_base_ms, step_per_seq_ms => step_per_seq_ms,
             prefill_tok_s => prefill_tok_s, cold_start_ms => cold_start_ms, model => served_model_name,
             max_model_len => max_model_len, fixed_ttft_ms => fixed_ttft_ms, fixed_gap_ms => fixed_gap_ms,
             num_gpu_blocks => num_gpu_blocks, block_size => block_size);
        if o.enable_prefix_caching {
            c.enable_prefix_caching = true;
        }
        if o.no_enable_prefix_caching {
            c.enable_prefix_caching = false;
        }
        c.enable_prompt_tokens_details |= o.enable_prompt_tokens_details;
        c.fixed_pace |= o.fixed_pace;
        c.stamp_events |= o.stamp_events;
        c.per_request_metrics |= o.per_request_metrics;
        if let Some(p) = &o.truth_log {
            c.truth_log = Some(p.clone());
        }
        c.validate()?;
        Ok(c)
    }
}

/// Runs the simulator until Ctrl-C or SIGTERM.
pub async fn run_cli(args: SimArgs) -> anyhow::Result<()> {
    let cfg = args.to_config()?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    // Before the "listening on" line, like serve's (crate::signals says why).
    let signals = crate::signals::Signals::install(false);
    let handle = spawn(cfg, listener).await?;
    tracing::info!("tokenmeter sim listening on {}", handle.addr());
    signals.wait(|| {}).await;
    let c = handle.counters();
    let lag = handle.step_lag();
    tracing::info!(
        "sim stopping: {} generation tokens, {} prompt tokens, {} finished, {} aborted; {} steps, lag max {:.3} ms mean {:.3} ms, {} resyncs losing {:.3} ms",
        c.generation_tokens_total, c.prompt_tokens_total, c.requests_finished, c.requests_aborted,
        lag.steps, lag.max_ns as f64 / 1e6, lag.mean_ns as f64 / 1e6, lag.resyncs, lag.slip_ns as f64 / 1e6
    );
    handle.shutdown().await;
    Ok(())
}

/// Snapshot of the exact ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimCounters {
    /// Tokens generated, including those of requests later aborted (as vLLM counts them).
    pub generation_tokens_total: u64,
    /// Prompt tokens prefilled (once per request, also for n > 1).
    pub prompt_tokens_total: u64,
    /// Sequences in the running batch now (a request with n = 2 counts 2).
    pub requests_running: u64,
    /// Requests waiting for slots now.
    pub requests_waiting: u64,
    /// Requests finished normally (stop or length).
    pub requests_finished: u64,
    /// Requests aborted because the client went away.
    pub requests_aborted: u64,
}

/// Engine step lag: actual wake time minus the step's scheduled deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepLag {
    /// Steps executed.
    pub steps: u64,
    /// Largest lag, nanoseconds.
    pub max_ns: u64,
    /// Mean lag over all steps, nanoseconds.
    pub mean_ns: u64,
    /// Steps that woke more than `resync_lag_ms` late and re-anchored the schedule.
    pub resyncs: u64,
    /// Time lost to those late wakes (the schedule's total slip), nanoseconds.
    pub slip_ns: u64,
}

/// A running simulator.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    config: SimConfig,
    stats: Arc<metrics::Stats>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Starts the simulator on `listener` and returns at once.
// async without an await on purpose: it spawns tasks, so it must be called inside a runtime.
#[allow(clippy::unused_async)]
pub async fn spawn(
    config: SimConfig,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<SimHandle> {
    config.validate()?;
    let addr = listener.local_addr()?;
    let stats = Arc::new(metrics::Stats::new(config.ground_truth_window_s));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
    let truth = match &config.truth_log {
        Some(p) => Some(Arc::new(request_log::TruthLog::create(p).map_err(|e| {
            anyhow::anyhow!("creating the truth log {}: {e}", p.display())
        })?)),
        None => None,
    };
    let app = Arc::new(http::App {
        cfg: config.clone(),
        truth,
        stats: Arc::clone(&stats),
        jobs: jobs_tx,
        started_s: Clock::global().now() / NANOS_PER_SEC,
    });
    let engine_done = spawn_engine_thread(
        config.clone(),
        Arc::clone(&stats),
        jobs_rx,
        shutdown_rx.clone(),
    )?;
    let mut tasks = vec![
        tokio::spawn(async move {
            let _ = engine_done.await;
        }),
        tokio::spawn(http::serve(listener, app, shutdown_rx.clone())),
    ];
    if config.log_stats_interval_s > 0.0 {
        tasks.push(tokio::spawn(statslog::run(
            config.log_stats_interval_s,
            config.kv_cache_tokens(),
            Arc::clone(&stats),
            shutdown_rx,
        )));
    }
    Ok(SimHandle {
        addr,
        config,
        stats,
        shutdown,
        tasks,
    })
}

/// Runs the engine on its own thread with a single-threaded runtime, so that its step timer is not
/// delayed behind thousands of connection tasks on the caller's runtime. Resolves when it ends.
fn spawn_engine_thread(
    config: SimConfig,
    stats: Arc<metrics::Stats>,
    jobs: mpsc::UnboundedReceiver<scheduler::ChannelJob>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<tokio::sync::oneshot::Receiver<()>> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("sim-engine".into())
        .spawn(move || {
            rt.block_on(scheduler::run(config, stats, jobs, shutdown));
            let _ = done_tx.send(());
        })?;
    Ok(done_rx)
}

impl SimHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Snapshot of the exact ground truth.
    pub fn counters(&self) -> SimCounters {
        let s = &self.stats;
        SimCounters {
            generation_tokens_total: s.generation_tokens_total.load(Relaxed),
            prompt_tokens_total: s.prompt_tokens_total.load(Relaxed),
            requests_running: s.running.load(Relaxed),
            requests_waiting: s.waiting_total(),
            requests_finished: s.finished.load(Relaxed),
            requests_aborted: s.aborted.load(Relaxed),
        }
    }

    /// Tokens generated in wall seconds `[from_unix_s, to_unix_s_exclusive)` (seconds of
    /// `Clock::global().now() / 1e9` at the moment the engine emitted them; last hour kept by default).
    pub fn generated_tokens_in(&self, from_unix_s: u64, to_unix_s_exclusive: u64) -> u64 {
        self.stats.generated_in(from_unix_s, to_unix_s_exclusive)
    }

    /// The KV cache's ground truth now (what `GET /sim/truth` answers).
    pub fn kv_truth(&self) -> truth::KvTruth {
        truth::KvTruth::read(&self.stats, &self.config)
    }

    /// The engine's step lag so far.
    pub fn step_lag(&self) -> StepLag {
        let s = &self.stats;
        let steps = s.steps.load(Relaxed);
        StepLag {
            steps,
            max_ns: s.lag_max_ns.load(Relaxed),
            mean_ns: s.lag_sum_ns.load(Relaxed).checked_div(steps).unwrap_or(0),
            resyncs: s.resyncs.load(Relaxed),
            slip_ns: s.slip_ns.load(Relaxed),
        }
    }

    /// Stops accepting, closes connections and ends the engine task.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}
