//! The serving threads: one single-threaded runtime per core that accepts on a listener of its
//! own (`SO_REUSEPORT`) and serves what it accepts (nginx's worker model with `reuseport`), their
//! supervisor, and the drain at shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::client_body::ClientBody;
use super::pacemaker::{pacemaker, Activity};
use super::pool::UpstreamPool;
use super::refusal::Refusals;
use super::{forward, front_h1, sniff, Background, ProxyState};
use crate::config::ServeConfig;
use crate::tls::UpstreamConnector;

/// Keep-alive connections to the upstream, for one serving thread.
pub fn upstream_pool(config: &ServeConfig, connector: UpstreamConnector) -> UpstreamPool {
    UpstreamPool::new(
        connector,
        Duration::from_millis(config.timeouts.pool_idle_ms),
    )
}

/// Threads that accept and serve connections: one per core unless `serving_threads` says.
pub(super) fn serving_threads(config: &ServeConfig) -> usize {
    match config.serving_threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        n => n,
    }
}

/// Binds `n` listeners to `addr` with `SO_REUSEPORT`, one per serving thread: the kernel spreads
/// new connections over them, and the thread whose listener is ready accepts on its own runtime.
/// (A shared acceptor woke one thread to accept and then another to serve: a channel send and
/// a cross-thread wakeup before each new connection's first byte.) The first fixes the port
/// when `addr` asks for port 0. Returns the bound address and the listeners, non-blocking.
///
/// A port another process listens on is refused ("address in use"), as a plain bind would be:
/// sockets that all set `SO_REUSEPORT` may share a port, so a second tokenmeter on the same
/// port would otherwise take half of the first one's connections without a word.
pub(super) fn bind_listeners(
    addr: SocketAddr,
    n: usize,
) -> std::io::Result<(SocketAddr, Vec<std::net::TcpListener>)> {
    if addr.port() != 0 {
        drop(std::net::TcpListener::bind(addr)?);
    }
    let first = reuseport_listener(addr)?;
    let bound = first.local_addr()?;
    let mut all = vec![first];
    for _ in 1..n {
        all.push(reuseport_listener(bound)?);
    }
    Ok((bound, all))
}

/// One listener on `addr` that others may share (`SO_REUSEPORT`), as tokio's own bind would make
/// it otherwise (`SO_REUSEADDR`, a backlog of 1,024). Called on a runtime (the listener is
/// registered, then handed over as a std listener for another runtime to take).
fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)?.into_std()
}

/// A serving thread as its supervisor sees it.
pub(super) struct ServingThread {
    thread: std::thread::JoinHandle<()>,
}

/// Tells the supervisor that serving thread `index` ended, whichever way: sent when dropped, so
/// a thread that unwinds from a panic says so too.
struct ExitNotice {
    index: usize,
    exited: tokio::sync::mpsc::UnboundedSender<usize>,
}

impl Drop for ExitNotice {
    fn drop(&mut self) {
        let _ = self.exited.send(self.index);
    }
}

/// Accepts on `listener` and serves what it accepts on a thread with a single-threaded runtime of
/// its own, as nginx's workers do: a connection, its upstream connection and every wakeup between
/// them stay on one thread. On tokio's shared multi-threaded runtime, workers woke each other (a
/// futex call for about one streamed event in seven at 16 streams).
pub(super) fn serve_on_own_thread(
    index: usize,
    replacement: bool,
    shared: Arc<ProxyState>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    listener: std::net::TcpListener,
    exited: tokio::sync::mpsc::UnboundedSender<usize>,
) -> anyhow::Result<ServingThread> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let thread = std::thread::Builder::new()
        .name(format!("tokenmeter-serve-{index}"))
        .spawn(move || {
            let notice = ExitNotice { index, exited };
            runtime.block_on(async move {
                // Each thread pools its own upstream connections (a connection's socket is
                // registered with the runtime that opened it, and the pool's sweeper runs there);
                // the first uses the template's pool, a replacement never (the pool's sweeper
                // died with the thread it replaces).
                let state = if index == 0 && !replacement {
                    shared
                } else {
                    Arc::new(
                        shared.with_pool(upstream_pool(&shared.config, shared.connector.clone())),
                    )
                };
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(thread = index, error = %e, "serving thread: cannot take its listener");
                        return;
                    }
                };
                let builder = connection_builder(&state.config);
                let graceful = hyper_util::server::graceful::GracefulShutdown::new();
                let mut tasks = JoinSet::new();
                let activity = Arc::new(Activity::default());
                let pace = tokio::spawn(pacemaker(activity.clone()));
                let connections_stop = stop.clone();
                loop {
                    tokio::select! {
                        _ = stop.wait_for(|stopped| *stopped) => break,
                        accepted = listener.accept() => {
                            let (stream, remote) = match accepted {
                                Ok(x) => x,
                                Err(e) => {
                                    tracing::warn!(error = %e, "accept failed");
                                    // Out of descriptors and the like: back off, do not spin.
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                    continue;
                                }
                            };
                            let _ = stream.set_nodelay(true);
                            while tasks.try_join_next().is_some() {}
                            let front = front_h1::Front {
                                state: state.clone(),
                                remote,
                                stop: connections_stop.clone(),
                                activity: activity.clone(),
                            };
                            let fallback = Fallback {
                                builder: builder.clone(),
                                watcher: graceful.watcher(),
                            };
                            match &state.tls {
                                None => {
                                    tasks.spawn(front_h1::serve(stream, front, move |io, read, front| {
                                        fallback.serve(io, read, front)
                                    }));
                                }
                                Some(tls) => {
                                    // The handshake runs in the connection's task, bounded like
                                    // a request head: a client that never finishes it holds
                                    // nothing else up. Plain HTTP here fails it and is closed.
                                    let acceptor = tls.acceptor();
                                    let limit =
                                        Duration::from_millis(state.config.timeouts.head_read_ms);
                                    tasks.spawn(async move {
                                        let hs =
                                            tokio::time::timeout(limit, acceptor.accept(stream));
                                        let Ok(Ok(tls)) = hs.await else { return };
                                        front_h1::serve(tls, front, move |io, read, front| {
                                            fallback.serve(io, read, front)
                                        })
                                        .await;
                                    });
                                }
                            }
                        }
                    }
                }
                // No new connections here from now on; the others' listeners close too.
                drop(listener);
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
            // The runtime and everything on it is gone before the supervisor hears of the end.
            drop(runtime);
            drop(notice);
        })?;
    Ok(ServingThread { thread })
}

/// What serves a connection once the proxy's own front hands it over (`front_h1.rs`): hyper's
/// server behind the head sniffer, whose refused heads get the proxy's own answer.
struct Fallback {
    builder: http1::Builder,
    watcher: hyper_util::server::graceful::Watcher,
}

impl Fallback {
    /// Serves `io`, whose bytes `read` the front already took off it, with hyper until it
    /// closes or the graceful stop ends it.
    async fn serve<S>(self, io: S, read: bytes::Bytes, front: front_h1::Front)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let front_h1::Front {
            state,
            remote,
            activity,
            ..
        } = front;
        let verdict = Arc::new(sniff::Verdict::default());
        let v = verdict.clone();
        let st = state.clone();
        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
            activity.request();
            let ambiguous = v.next_request_is_ambiguous();
            let st = st.clone();
            async move {
                let req = req.map(ClientBody::Hyper);
                let response = forward::handle(st, req, remote, ambiguous).await;
                Ok::<_, std::convert::Infallible>(super::fields_in_map(response))
            }
        });
        // hyper's bare answer to a head it refuses is replaced by the proxy's.
        let refusals: Arc<dyn Refusals> = state.clone();
        let io = sniff::Sniffed::new(io, state.config.max_header_bytes, verdict)
            .with_already_read(read)
            .with_refusals((refusals, remote));
        let conn = self.builder.serve_connection(TokioIo::new(io), svc);
        let _ = self.watcher.watch(conn).await;
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

/// The serving threads, and how to start one again.
pub(super) struct Threads {
    /// The address the listeners share (a replacement binds it again).
    pub(super) addr: SocketAddr,
    /// By index; `None` where a replacement could not be started.
    pub(super) threads: Vec<Option<ServingThread>>,
    /// Where threads say they ended ([`ExitNotice`]), and its sending side for replacements.
    pub(super) exited: (
        tokio::sync::mpsc::UnboundedSender<usize>,
        tokio::sync::mpsc::UnboundedReceiver<usize>,
    ),
}

/// Watches the serving threads until shutdown: one that ends before it (a panic outside any
/// connection task) is logged and replaced, with a listener of its own again; its listener's
/// queue of not yet accepted connections went with it. At shutdown, tells every thread to stop
/// accepting, lets them drain, and runs the background's after-drain steps.
pub(super) async fn supervise(
    mut serving: Threads,
    mut shutdown: oneshot::Receiver<()>,
    stop: tokio::sync::watch::Sender<bool>,
    state: Arc<ProxyState>,
    background: Background,
) {
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(i) = serving.exited.1.recv() => {
                tracing::error!(thread = i, "a serving thread died; starting a replacement");
                if let Some(dead) = serving.threads[i].take() {
                    if let Err(panic) = dead.thread.join() {
                        tracing::error!(thread = i, panic = ?panic.downcast_ref::<&str>(), "the dead serving thread panicked");
                    }
                }
                // A thread that dies at once would be replaced in a tight loop: pace it.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let started = reuseport_listener(serving.addr)
                    .map_err(anyhow::Error::from)
                    .and_then(|l| {
                        serve_on_own_thread(i, true, state.clone(), stop.subscribe(), l, serving.exited.0.clone())
                    });
                match started {
                    Ok(t) => serving.threads[i] = Some(t),
                    Err(e) => {
                        tracing::error!(thread = i, error = %e, "cannot start a replacement serving thread; the others serve on");
                    }
                }
            }
        }
    }
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
    let live = serving.threads.iter().flatten().count();
    for _ in 0..live {
        if serving.exited.1.recv().await.is_none() {
            break;
        }
    }
    for t in serving.threads.into_iter().flatten() {
        // Its exit notice is its last act, so this returns at once.
        let _ = t.thread.join();
    }
    for step in background.after_drain {
        step().await;
    }
}
