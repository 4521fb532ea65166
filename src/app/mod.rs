//! The running program, put together from its configuration: the access log, TLS, the meter
//! (and one per replica), the OTLP exporter, the fleet's model refresh, the scrapers, the admin
//! server and the proxy's serving threads. This is the one place that knows every part; each part
//! is handed what it needs (the proxy its observers and its `/stats` router) and knows none of
//! the others.

mod admin;
pub(crate) mod reload;
pub(crate) mod serve_cli;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::oneshot;

use crate::access_log::{self, AccessLogCounters, AccessLogWriter};
use crate::clock::{Clock, TimeSource};
use crate::config::ServeConfig;
use crate::fleet::Upstreams;
use crate::health::Health;
use crate::meter::{
    admin_router, spawn_meter_owned, stats_router, FleetStats, MeterHandle, MeterThread,
    StatsContext,
};
use crate::observe::Observer;
use crate::proxy::{
    upstream_pool, AfterDrain, Background, Listeners, LiveUsers, Proxy, ProxyState, TrackerShared,
};
use crate::scrape::{spawn_scraper, SampleSink, ScrapeConfig, ScrapeCounters};
use crate::tls::ListenerTls;
use admin::serve_stats_on_own_thread;

/// A running proxy.
pub struct ProxyHandle {
    admin_addr: Option<SocketAddr>,
    admin_stop: Option<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>,
    /// The one owner of the meter thread, stopped and joined last at shutdown.
    meter_thread: Option<MeterThread>,
    /// The replicas' meter threads (several upstreams), stopped and joined with it.
    upstream_meter_threads: Vec<MeterThread>,
    proxy: Proxy,
    log: Option<Arc<AccessLogWriter>>,
    counters: Arc<AccessLogCounters>,
    meter: MeterHandle,
    reloader: reload::Reloader,
}

impl ProxyHandle {
    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    /// The separate stats address, when configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Generation requests in flight now.
    pub fn in_flight(&self) -> u64 {
        self.proxy.state().trackers.in_flight.current()
    }

    /// Where the live dashboard page is: `/` on `admin_listen` when set, else `/stats/ui` on
    /// the main listener.
    pub fn dashboard_url(&self) -> String {
        match self.admin_addr {
            Some(a) => format!("http://{a}/"),
            None => format!("http://{}/stats/ui", self.proxy.addr()),
        }
    }

    /// The live meter behind `/stats`.
    pub fn meter(&self) -> &MeterHandle {
        &self.meter
    }

    /// Access-log counters (written, dropped, failed).
    pub fn access_log_counters(&self) -> Arc<AccessLogCounters> {
        self.counters.clone()
    }

    /// Applies the reloadable settings of `new` (as on SIGHUP): API keys, `require_known_key`,
    /// the stats token, and the TLS certificate files read again. Requests in flight finish
    /// under the settings they started with.
    pub fn reload(&self, new: &ServeConfig) -> reload::ReloadReport {
        self.reloader.apply(new)
    }

    /// Reopens the access log (as on SIGHUP).
    pub fn reopen_access_log(&self) {
        if let Some(l) = &self.log {
            l.reopen();
        }
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, flushes the log.
    pub async fn shutdown(mut self) {
        self.proxy.shutdown().await;
        // Bounded waits: a thread that does not end is reported and left, never waited on
        // forever (the process is exiting anyway).
        if let Some((stop, thread)) = self.admin_stop.take() {
            let _ = stop.send(());
            crate::join::join_within(thread, THREAD_JOIN_WAIT, "tokenmeter-stats").await;
        }
        if let Some(meter) = self.meter_thread.take() {
            meter.stop(THREAD_JOIN_WAIT).await;
        }
        for meter in std::mem::take(&mut self.upstream_meter_threads) {
            meter.stop(THREAD_JOIN_WAIT).await;
        }
    }
}

/// How long shutdown waits for the admin-stats thread and for the meter thread to end.
const THREAD_JOIN_WAIT: Duration = Duration::from_secs(2);

/// Starts a proxy with `config`; `observers` receive measurements beside the meter and the log.
pub async fn spawn(
    config: ServeConfig,
    observers: Vec<Arc<dyn Observer>>,
) -> anyhow::Result<ProxyHandle> {
    spawn_with_time(config, observers, TimeSource::real()).await
}

/// [`spawn`], measuring on `time`: tests pass [`TimeSource::manual`] and advance it between the
/// events they script, so TTFT, ITL and durations come out exact. Timeouts stay on real time.
// Async though it awaits nothing: it binds listeners and spawns the supervisor on the caller's
// runtime, so it must be called on one, which an `async fn` says in its type.
#[allow(clippy::unused_async)]
pub async fn spawn_with_time(
    config: ServeConfig,
    mut observers: Vec<Arc<dyn Observer>>,
    time: TimeSource,
) -> anyhow::Result<ProxyHandle> {
    config.validate()?;
    let listeners = Listeners::bind(&config)?;
    let counters = Arc::new(AccessLogCounters::default());
    let mut log = None;
    let mut log_sink = None;
    if let Some(path) = &config.access_log {
        let (sink, writer) = access_log::spawn(path, config.access_log_buffer, counters.clone())
            .with_context(|| format!("opening access log {}", path.display()))?;
        log_sink = Some(sink.clone());
        observers.push(Arc::new(sink));
        log = Some(Arc::new(writer));
    }
    let tls = match config.tls.files() {
        Some((cert, key)) => Some(Arc::new(ListenerTls::load(cert, key)?)),
        None => None,
    };
    let connector = crate::tls::upstream_connector(
        &config.upstream_tls,
        Duration::from_millis(config.timeouts.connect_ms),
    )?;
    let resolved = config.resolved_upstreams()?;
    let health = Arc::new(Health::named(
        config.readiness_upstream_failure_s,
        resolved.iter().map(|u| u.name.clone()).collect(),
    ));
    let stats_token =
        crate::meter::StatsToken::new(config.stats_token.as_ref().map(|s| s.0.as_str()));
    let users = Arc::new(LiveUsers::new(config.users.clone()));
    let reloader = reload::Reloader::new(
        config.clone(),
        users.clone(),
        stats_token.clone(),
        tls.clone(),
    );
    let meter_config = crate::meter::MeterConfig {
        slo: config.slo,
        ..config.meter.clone()
    };
    let (meter, meter_thread) = spawn_meter_owned(meter_config.clone());
    observers.push(Arc::new(meter.clone()));
    let otlp = match config.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
        Some(endpoint) => {
            let interval = Duration::from_millis(config.otlp_export_interval_ms);
            let export = crate::otlp::OtlpExport::start(endpoint, interval, config.otlp_traces)
                .with_context(|| format!("otlp_endpoint {endpoint}"))?;
            observers.push(export.clone());
            Some(export)
        }
        None => None,
    };
    let upstreams = Arc::new(Upstreams::new(&resolved, &config.routing)?);
    // With one replica the aggregate meter is that replica's; with several each gets a meter of
    // its own (windows, capacity curve, cross-check) beside the aggregate.
    let several = resolved.len() > 1;
    let (upstream_meters, upstream_meter_threads): (Vec<MeterHandle>, Vec<MeterThread>) = if several
    {
        resolved
            .iter()
            .map(|_| spawn_meter_owned(meter_config.clone()))
            .unzip()
    } else {
        (Vec::new(), Vec::new())
    };
    let mut background = Vec::new();
    let mut scrape = None;
    let mut per_upstream_scrape = Vec::new();
    for u in &resolved {
        per_upstream_scrape.push(u.metrics.clone().map(|url| {
            let cfg = ScrapeConfig::new(url, config.metrics_scrape_interval_s);
            (cfg, Arc::new(ScrapeCounters::default()))
        }));
    }
    if !several {
        scrape = per_upstream_scrape[0].clone();
    }
    // With one replica there is nothing to choose: its model list is never read.
    if several && config.routing.models_refresh_s > 0.0 {
        background.push(crate::fleet::models::spawn_model_refresh(
            upstreams.clone(),
            connector.clone(),
            Duration::from_secs_f64(config.routing.models_refresh_s),
        ));
    }
    let stats_ctx = StatsContext {
        upstream: config.upstream_label(),
        bearer_token: stats_token.clone(),
        health: health.clone(),
        access_log: counters.clone(),
        started: Clock::global().now(),
        scrape,
        otlp: otlp.as_ref().map(|o| o.counters().clone()),
        fleet: Some(FleetStats {
            upstreams: upstreams.clone(),
            meters: upstream_meters.clone(),
            scrape: per_upstream_scrape.clone(),
        }),
        time: time.clone(),
    };
    let mut admin_addr = None;
    let mut admin_stop = None;
    let main_stats;
    if let Some(a) = &config.admin_listen {
        let router = admin_router(meter.clone(), stats_ctx);
        let admin = std::net::TcpListener::bind(a.parse::<SocketAddr>()?)
            .with_context(|| format!("binding admin {a}"))?;
        admin.set_nonblocking(true)?;
        admin_addr = Some(admin.local_addr()?);
        main_stats = None;
        let admin_tls = tls.clone().filter(|_| config.tls.admin);
        admin_stop = Some(serve_stats_on_own_thread(admin, router, admin_tls)?);
    } else {
        main_stats = Some(stats_router(meter.clone(), stats_ctx));
    }
    let mut trackers = TrackerShared::new(
        observers,
        Duration::from_secs(config.meter.cold_start_idle_s),
    )
    .with_time_source(time)
    .with_slo(config.slo)
    // An extra guard closes at a time no event marks: then every event is reported alone.
    .with_token_coalescing(config.meter.capacity_guard_extra_ms == 0)
    .with_kv_upstreams(per_upstream_scrape.len());
    trackers.per_upstream = upstream_meters
        .iter()
        .map(|m| Arc::new(m.clone()) as Arc<dyn Observer>)
        .collect();
    let trackers = Arc::new(trackers);
    for (i, target) in per_upstream_scrape.into_iter().enumerate() {
        let Some((cfg, counters)) = target else {
            continue;
        };
        let m = upstream_meters.get(i).unwrap_or(&meter).clone();
        m.enable_server_crosscheck(config.disagreement_threshold_pct);
        let t = trackers.clone();
        let mut sinks: Vec<SampleSink> = vec![
            Box::new(move |s| m.server_sample(s.clone())),
            // The block size the trackers report a new block at (see `TrackerShared::kv_block_size`).
            Box::new(move |s| {
                if let (Some(bs), Some(slot)) = (s.values.kv.block_size, t.kv_block_size.get(i)) {
                    slot.store(bs, std::sync::atomic::Ordering::Relaxed);
                }
            }),
        ];
        // Samples of several replicas in one log would mix in `analyze`'s cross-check.
        if let (Some(log), false) = (log_sink.clone(), several) {
            sinks.push(Box::new(move |s| log.server_sample(Arc::new(s.clone()))));
        }
        let in_flight: Box<dyn Fn() -> u64 + Send + Sync> = if several {
            let u = upstreams.list()[i].clone();
            Box::new(move || u.in_flight())
        } else {
            let t = trackers.clone();
            Box::new(move || t.in_flight.current())
        };
        background.push(spawn_scraper(cfg, in_flight, sinks, counters));
    }
    let state = Arc::new(ProxyState {
        upstreams,
        pool: upstream_pool(&config, connector.clone()),
        connector,
        health,
        tls,
        request_id_header: http::HeaderName::from_bytes(config.request_id_header.as_bytes())?,
        users,
        trackers,
        stats: main_stats,
        config,
    });
    let mut after_drain: Vec<AfterDrain> = Vec::new();
    if let Some(o) = otlp {
        after_drain.push(Box::new(move || {
            Box::pin(async move {
                // Records every finished request, then one last export: blocking, so off the
                // runtime, and bounded like every join at shutdown (a collector that never
                // answers would hold the exit for up to two export timeouts).
                let last = tokio::task::spawn_blocking(move || o.shutdown());
                if tokio::time::timeout(THREAD_JOIN_WAIT, last).await.is_err() {
                    tracing::warn!(
                        within = ?THREAD_JOIN_WAIT,
                        "the last OTLP export did not finish in time; left running"
                    );
                }
            })
        }));
    }
    if let Some(log) = log.clone() {
        after_drain.push(Box::new(move || {
            Box::pin(async move {
                log.close().await;
                let (written, dropped, failed) = log.counters().get();
                tracing::info!(written, dropped, failed, "access log closed");
            })
        }));
    }
    let proxy = Proxy::start(
        listeners,
        state,
        Background {
            tasks: background,
            after_drain,
        },
    )?;
    Ok(ProxyHandle {
        admin_addr,
        admin_stop,
        meter_thread: Some(meter_thread),
        upstream_meter_threads,
        proxy,
        log,
        counters,
        meter,
        reloader,
    })
}
