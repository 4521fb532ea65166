//! The serving threads: one single-threaded runtime per core that serves the connections the
//! acceptor hands it (nginx's worker model), the acceptor itself, and the drain at shutdown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinSet;

use super::{forward, sniff, ProxyState, THREAD_JOIN_WAIT};
use crate::access_log::AccessLogWriter;
use crate::config::ServeConfig;
use crate::tls::UpstreamConnector;

/// Pooled keep-alive connections to the upstream, for one serving thread.
pub(super) fn upstream_client(
    config: &ServeConfig,
    connector: UpstreamConnector,
) -> Client<UpstreamConnector, http_body_util::Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_millis(config.timeouts.pool_idle_ms))
        .pool_timer(TokioTimer::new())
        .http1_max_buf_size(64 * 1024)
        .build(connector)
}

/// Threads that accept and serve connections: one per core unless `serving_threads` says.
pub(super) fn serving_threads(config: &ServeConfig) -> usize {
    match config.serving_threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        n => n,
    }
}

/// A serving thread: where to hand it connections, word of its end, and the thread to join.
pub(super) struct ServingThread {
    conns: tokio::sync::mpsc::UnboundedSender<(std::net::TcpStream, SocketAddr)>,
    done: oneshot::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

/// Serves the connections it is handed on a thread with a single-threaded runtime of its own, as
/// nginx's workers do: a connection, its upstream connection and every wakeup between them stay
/// on one thread. On tokio's shared multi-threaded runtime, workers woke each other (a futex call
/// for about one streamed event in seven at 16 streams).
pub(super) fn serve_on_own_thread(
    index: usize,
    replacement: bool,
    shared: Arc<ProxyState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<ServingThread> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (conns, mut incoming) = tokio::sync::mpsc::unbounded_channel();
    let (done, finished) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name(format!("tokenmeter-serve-{index}"))
        .spawn(move || {
            runtime.block_on(async move {
                // Each thread pools its own upstream connections (a pooled connection's task
                // lives on the runtime that opened it); the first uses the template's pool, a
                // replacement never (the pool's tasks died with the thread it replaces).
                let state = if index == 0 && !replacement {
                    shared
                } else {
                    Arc::new(
                        shared.with_pool(upstream_client(&shared.config, shared.connector.clone())),
                    )
                };
                let builder = connection_builder(&state.config);
                let graceful = hyper_util::server::graceful::GracefulShutdown::new();
                let mut tasks = JoinSet::new();
                let live = Arc::new(LiveConnections::default());
                let pace = tokio::spawn(pacemaker(live.clone()));
                loop {
                    tokio::select! {
                        _ = stop.wait_for(|stopped| *stopped) => break,
                        handed = incoming.recv() => {
                            let Some((stream, remote)) = handed else { break };
                            while tasks.try_join_next().is_some() {}
                            let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
                                continue;
                            };
                            let st = state.clone();
                            let verdict = Arc::new(sniff::Verdict::default());
                            let v = verdict.clone();
                            let svc = service_fn(move |req| {
                                forward::handle(st.clone(), req, remote, v.clone())
                            });
                            let max_head = state.config.max_header_bytes;
                            let open = live.open();
                            match &state.tls {
                                None => {
                                    let io = sniff::Sniffed::new(stream, max_head, verdict);
                                    let conn = builder.serve_connection(TokioIo::new(io), svc);
                                    let fut = graceful.watch(conn);
                                    tasks.spawn(async move {
                                        let _ = fut.await;
                                        drop(open);
                                    });
                                }
                                Some(tls) => {
                                    // The handshake runs in the connection's task, bounded like
                                    // a request head: a client that never finishes it holds
                                    // nothing else up. Plain HTTP here fails it and is closed.
                                    let acceptor = tls.acceptor();
                                    let watcher = graceful.watcher();
                                    let builder = builder.clone();
                                    let limit =
                                        Duration::from_millis(state.config.timeouts.head_read_ms);
                                    tasks.spawn(async move {
                                        let hs =
                                            tokio::time::timeout(limit, acceptor.accept(stream));
                                        let _open = open;
                                        let Ok(Ok(tls)) = hs.await else { return };
                                        let io = sniff::Sniffed::new(tls, max_head, verdict);
                                        let conn = builder.serve_connection(TokioIo::new(io), svc);
                                        let _ = watcher.watch(conn).await;
                                    });
                                }
                            }
                        }
                    }
                }
                let grace = Duration::from_secs(state.config.shutdown_grace_s);
                if tokio::time::timeout(grace, graceful.shutdown())
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        in_flight = state.trackers.in_flight.current(),
                        "grace period over: closing the remaining connections"
                    );
                }
                tasks.abort_all();
                pace.abort();
                while tasks.join_next().await.is_some() {}
            });
            let _ = done.send(());
        })?;
    Ok(ServingThread {
        conns,
        done: finished,
        thread,
    })
}

/// How often a serving thread's [`pacemaker`] ticks.
const PACE: Duration = Duration::from_millis(500);

/// Keeps a timer due within [`PACE`] pending on a serving thread's runtime while the thread
/// serves a connection. Tokio wakes its own I/O driver (an eventfd write, then one more
/// `epoll_wait`) whenever a timer is armed that is due sooner than every pending one; hyper arms
/// its head-read timer each time a keep-alive connection waits for its next request, and the
/// request and body timers are armed per request, so without a nearer timer most requests paid
/// those two system calls (strace: 200 eventfd writes in 200 streamed requests on one
/// connection). With this tick pending, no per-request timer is ever the soonest: two wakeups a
/// second per thread instead. A thread with no connection has no per-request timers to spare,
/// so there the tick waits for the next connection: an idle proxy's serving threads sleep (each
/// tick costs three `epoll_wait`s and an eventfd write, 0.5 ms of CPU a second per idle proxy).
async fn pacemaker(live: Arc<LiveConnections>) {
    loop {
        while live.count.load(Ordering::Relaxed) == 0 {
            live.first.notified().await;
        }
        tokio::time::sleep(PACE).await;
    }
}

/// The connections a serving thread is serving, for its [`pacemaker`].
#[derive(Default)]
struct LiveConnections {
    count: AtomicUsize,
    /// Told when the count leaves zero (`notify_one` keeps the permit if no one waits yet).
    first: Notify,
}

impl LiveConnections {
    /// Counts a connection until the returned guard drops (when its task ends or is aborted).
    fn open(self: &Arc<Self>) -> OpenConnection {
        if self.count.fetch_add(1, Ordering::Relaxed) == 0 {
            self.first.notify_one();
        }
        OpenConnection(self.clone())
    }
}

/// One connection counted in [`LiveConnections`].
struct OpenConnection(Arc<LiveConnections>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The HTTP/1 server settings of every client connection.
fn connection_builder(cfg: &ServeConfig) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(cfg.timeouts.head_read_ms))
        .max_header_size(cfg.max_header_bytes)
        // Also bounds what hyper queues for a client that stops reading (backpressure, not memory).
        .max_buf_size(cfg.max_header_bytes.max(8192))
        .half_close(false)
        // One buffer and one write(2) per frame: events are a few hundred bytes, so copying them
        // after the chunk-size line costs less than hyper's queue of three slices for writev.
        .writev(false)
        .keep_alive(true);
    builder
}

/// What runs beside the serving threads and stops with them.
pub(super) struct Background {
    /// Scrapers and the model refresh: aborted when shutdown starts.
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The OTLP exporter: flushed once every request has finished.
    pub(super) otlp: Option<Arc<crate::otlp::OtlpExport>>,
}

/// Accepts connections and hands them to the serving threads in turn (an even spread: with a
/// listener shared by the threads, a burst of keep-alive connections could land mostly on one);
/// at shutdown stops accepting, lets the threads drain, and closes the log.
pub(super) async fn accept_loop(
    listener: TcpListener,
    mut shutdown: oneshot::Receiver<()>,
    stop: tokio::sync::watch::Sender<bool>,
    mut serving: Vec<ServingThread>,
    state: Arc<ProxyState>,
    log: Option<Arc<AccessLogWriter>>,
    background: Background,
) {
    let mut next = 0usize;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, remote) = match accepted {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        // Out of descriptors and the like: back off instead of spinning.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let Ok(stream) = stream.into_std() else { continue };
                let i = next % serving.len();
                next = next.wrapping_add(1);
                if let Err(refused) = serving[i].conns.send((stream, remote)) {
                    // Its thread is gone (a panic outside any connection task): say so, start
                    // a replacement, and hand this connection to it rather than close it.
                    tracing::error!(thread = i, "a serving thread died; starting a replacement");
                    match serve_on_own_thread(i, true, state.clone(), stop.subscribe()) {
                        Ok(t) => {
                            let _ = t.conns.send(refused.0);
                            let dead = std::mem::replace(&mut serving[i], t);
                            if let Err(panic) = dead.thread.join() {
                                tracing::error!(thread = i, panic = ?panic.downcast_ref::<&str>(), "the dead serving thread panicked");
                            }
                        }
                        Err(e) => {
                            tracing::error!(thread = i, error = %e, "cannot start a replacement serving thread; the connection is closed");
                        }
                    }
                }
            }
        }
    }
    drop(listener);
    // No more samples once shutdown starts: the log is about to close.
    for task in background.tasks {
        task.abort();
    }
    tracing::info!(
        in_flight = state.trackers.in_flight.current(),
        grace_s = state.config.shutdown_grace_s,
        "shutting down: no new connections; waiting for in-flight requests"
    );
    state.health.start_draining();
    let _ = stop.send(true);
    for t in serving {
        let _ = t.done.await;
        // It has sent `done` as its last act, so this returns at once.
        let _ = t.thread.join();
    }
    if let Some(o) = background.otlp {
        // Records every finished request, then one last export: blocking, so off the runtime,
        // and bounded like every join at shutdown (a collector that never answers would hold
        // the exit for up to two export timeouts).
        let last = tokio::task::spawn_blocking(move || o.shutdown());
        if tokio::time::timeout(THREAD_JOIN_WAIT, last).await.is_err() {
            tracing::warn!(
                within = ?THREAD_JOIN_WAIT,
                "the last OTLP export did not finish in time; left running"
            );
        }
    }
    if let Some(log) = log {
        log.close().await;
        let (written, dropped, failed) = log.counters().get();
        tracing::info!(written, dropped, failed, "access log closed");
    }
}
