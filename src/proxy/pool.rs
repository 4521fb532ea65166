//! The upstream connections of one serving thread: hyper's own HTTP/1 client connections, kept
//! alive and reused per replica. It replaces hyper-util's pooled client, whose per-request
//! machinery (a pool shared across runtimes, the checkout and connect futures raced against each
//! other, and a task spawned per request to hand the connection back once its response ended)
//! cost 7–10 µs of each request's round trip (`benches/ttft_breakdown.rs`).
//!
//! No connection has a task of its own. Whoever uses a connection polls it: the request waiting
//! for its response head ([`Upstream::drive`]), then the response body ([`PooledBody`]), both on
//! the task that serves the client. A frame thus goes from the upstream socket to the client in
//! one task poll, where a connection task would cost a second poll and a hand-off per frame. An
//! idle connection is polled only when its socket stirs: its wake goes to the pool's sweeper,
//! which closes it at once when the upstream closed it. It is also settled when it is checked
//! out, so a close that arrived just before is seen before a request is sent on it.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use tower::{Service, ServiceExt};

use crate::tls::UpstreamConnector;

/// A replica's address as connections are kept by: scheme and authority.
type Key = (Scheme, Authority);

/// The transport of an upstream connection (plain TCP or TLS).
type Io = <UpstreamConnector as Service<Uri>>::Response;

/// One upstream connection: the handle requests are sent on, and the connection future that does
/// its reading and writing, polled only by the connection's current user.
struct Upstream {
    sender: SendRequest<Full<Bytes>>,
    /// Boxed: with its TLS state it is kilobytes, and an upstream moves from the pool to the
    /// request to the body and back on every request.
    conn: Pin<Box<Connection<Io, Full<Bytes>>>>,
    /// The connection future has completed (closed or failed); it is never polled again.
    over: bool,
    /// What the connection is polled with, and `relay` as a [`Waker`].
    relay: Arc<Relay>,
    relay_waker: Waker,
}

/// The waker a connection is always polled with. It passes a wake on to the task that uses the
/// connection now, if any. While that task takes a frame from hyper's body channel it passes
/// nothing on: taking a frame wakes the connection (there is room for the next one), and the
/// task is about to poll the connection anyway, so that wake would only poll the task once more
/// for each frame.
///
/// A wake held back is remembered (`held`): on a runtime whose I/O driver runs on another thread,
/// a socket's wake could arrive during the take, and the take ending in `Pending` must not lose
/// it. (The serving threads' runtimes are single-threaded; this keeps the pool correct on any.)
struct Relay {
    task: AtomicWaker,
    taking: AtomicBool,
    held: AtomicBool,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.taking.load(Ordering::Acquire) {
            self.held.store(true, Ordering::Release);
        } else {
            self.task.wake();
        }
    }
}

impl Upstream {
    fn new(sender: SendRequest<Full<Bytes>>, conn: Connection<Io, Full<Bytes>>) -> Upstream {
        let relay = Arc::new(Relay {
            task: AtomicWaker::new(),
            taking: AtomicBool::new(false),
            held: AtomicBool::new(false),
        });
        Upstream {
            sender,
            conn: Box::pin(conn),
            over: false,
            relay_waker: Waker::from(relay.clone()),
            relay,
        }
    }

    /// Polls the connection for the task of `cx`; whether it is over.
    fn poll_conn(&mut self, cx: &mut Context<'_>) -> bool {
        self.relay.task.register(cx.waker());
        self.poll_relayed()
    }

    fn poll_relayed(&mut self) -> bool {
        let mut relayed = Context::from_waker(&self.relay_waker);
        if !self.over && self.conn.as_mut().poll(&mut relayed).is_ready() {
            self.over = true;
        }
        self.over
    }

    /// Lets the connection do what it can now, for no task: for a connection no task waits on,
    /// whose wakes go nowhere. Whether it is over.
    fn settle(&mut self) -> bool {
        drop(self.relay.task.take());
        self.poll_relayed()
    }

    /// Polls `step`, which only this connection's progress can complete, while driving the
    /// connection from this task. `step` is polled without a waker: the connection's socket wakes
    /// this task, and each wakeup polls both. Once the connection is over, `step` gets the real
    /// waker, though by then it is ready with the connection's error.
    async fn drive<T>(
        &mut self,
        mut step: impl FnMut(&mut Self, &mut Context<'_>) -> Poll<T>,
    ) -> T {
        poll_fn(|cx| {
            let mut quiet = Context::from_waker(Waker::noop());
            if let Poll::Ready(v) = step(self, &mut quiet) {
                return Poll::Ready(v);
            }
            if self.poll_conn(cx) {
                step(self, cx)
            } else {
                step(self, &mut quiet)
            }
        })
        .await
    }
}

/// A connection waiting for its next request.
struct Idle {
    upstream: Upstream,
    since: Instant,
}

/// Keep-alive connections to the upstream replicas, for one serving thread. Cheap to clone.
#[derive(Clone)]
pub struct UpstreamPool {
    inner: Arc<Inner>,
}

struct Inner {
    connector: UpstreamConnector,
    /// Unused this long, a connection is closed.
    idle_timeout: Duration,
    /// Idle connections by replica, most recently used last. One lock per checkout and one per
    /// return; only this thread's requests take it, so it is never contended.
    idle: Mutex<Vec<(Key, Vec<Idle>)>>,
    /// A sweeper task is closing idle connections past `idle_timeout`.
    sweeping: AtomicBool,
    /// What an idle connection's relay wakes when its socket stirs (the upstream closed it, or
    /// sent what it should not have): the sweeper, which then settles the idle connections and
    /// closes the ones that are over, at once, as a connection task would have.
    stirred: Arc<Stirred>,
    stirred_waker: Waker,
}

/// An idle connection's socket has stirred; a wake is kept until the sweeper takes it.
struct Stirred(tokio::sync::Notify);

impl Wake for Stirred {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, timed out, TLS): nothing was sent.
    #[error("cannot connect to the upstream")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The connection failed while the request was sent or before its response head.
    #[error("upstream connection failed")]
    Request(#[source] hyper::Error),
    /// The URI names no scheme and authority to connect to.
    #[error("the upstream URI has no scheme or authority")]
    Uri,
}

impl UpstreamError {
    /// Whether no connection could be made.
    pub fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect(_))
    }
}

impl UpstreamPool {
    /// An empty pool that connects with `connector` and closes connections idle `idle_timeout`.
    pub fn new(connector: UpstreamConnector, idle_timeout: Duration) -> UpstreamPool {
        let stirred = Arc::new(Stirred(tokio::sync::Notify::new()));
        UpstreamPool {
            inner: Arc::new(Inner {
                connector,
                idle_timeout,
                idle: Mutex::new(Vec::new()),
                sweeping: AtomicBool::new(false),
                stirred_waker: Waker::from(stirred.clone()),
                stirred,
            }),
        }
    }

    /// Sends `req` (an absolute URI) on an idle connection to its replica, or on a new one, and
    /// waits for the response head. A request that met a kept connection the upstream had just
    /// closed, before any of it was written, is sent again once on a new connection.
    pub async fn request(
        &self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<PooledBody>, UpstreamError> {
        let target = req.uri().clone();
        let key = match (target.scheme(), target.authority()) {
            (Some(s), Some(a)) => (s.clone(), a.clone()),
            _ => return Err(UpstreamError::Uri),
        };
        // HTTP/1 sends the origin form; the Host header names the replica.
        *req.uri_mut() = target
            .path_and_query()
            .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
        loop {
            let (mut upstream, kept) = match self.checkout(&key) {
                Some(u) => (u, true),
                None => (self.connect(&target).await?, false),
            };
            if let Err(e) = upstream.drive(|u, cx| u.sender.poll_ready(cx)).await {
                if kept {
                    continue; // closed while idle: the next one, or a new connection
                }
                return Err(UpstreamError::Request(e));
            }
            let mut sent = pin!(upstream.sender.try_send_request(req));
            match upstream.drive(|_, cx| sent.as_mut().poll(cx)).await {
                Ok(resp) => {
                    let held = Some(Held {
                        pool: self.clone(),
                        key,
                        upstream,
                    });
                    let mut resp = resp.map(|inner| PooledBody {
                        inner,
                        held,
                        first_poll: true,
                    });
                    // A body that is over before it starts (204, 304, `content-length: 0`) may
                    // never be polled: its connection is free now.
                    if resp.body().inner.is_end_stream() {
                        resp.body_mut().give_back();
                    }
                    return Ok(resp);
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if kept => req = unsent,
                    _ => return Err(UpstreamError::Request(e.into_error())),
                },
            }
        }
    }

    /// The most recently used idle connection to `key` still open and not past its idle time.
    fn checkout(&self, key: &Key) -> Option<Upstream> {
        let now = Instant::now();
        let mut idle = self.inner.idle.lock().ok()?;
        let list = &mut idle.iter_mut().find(|(k, _)| k == key)?.1;
        while let Some(mut c) = list.pop() {
            if now.duration_since(c.since) < self.inner.idle_timeout && open(&mut c.upstream) {
                return Some(c.upstream);
            }
        }
        None
    }

    /// A new connection to `target`'s replica.
    async fn connect(&self, target: &Uri) -> Result<Upstream, UpstreamError> {
        let io = self
            .inner
            .connector
            .clone()
            .oneshot(target.clone())
            .await
            .map_err(UpstreamError::Connect)?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(64 * 1024)
            .handshake(io)
            .await
            .map_err(|e| UpstreamError::Connect(Box::new(e)))?;
        let mut upstream = Upstream::new(sender, conn);
        // Its first poll makes it ready for a request; settled, that wakes no task later.
        upstream.settle();
        Ok(upstream)
    }

    /// Keeps `upstream` for the next request to `key`, unless its connection is closing.
    fn give_back(&self, key: Key, mut upstream: Upstream) {
        if !self.inner.keep_idle(&mut upstream) {
            return;
        }
        let Ok(mut idle) = self.inner.idle.lock() else {
            return;
        };
        let entry = Idle {
            upstream,
            since: Instant::now(),
        };
        match idle.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push(entry),
            None => idle.push((key, vec![entry])),
        }
        drop(idle);
        if !self.inner.sweeping.swap(true, Ordering::Relaxed) {
            tokio::spawn(sweep(self.inner.clone()));
        }
    }
}

/// Settles an idle connection (it reads an end of stream the upstream sent meanwhile) and says
/// whether it is still open for a request.
fn open(upstream: &mut Upstream) -> bool {
    !upstream.settle() && !upstream.sender.is_closed()
}

impl Inner {
    /// Whether `upstream` is still open to be kept idle; if so, its socket now wakes the sweeper.
    fn keep_idle(&self, upstream: &mut Upstream) -> bool {
        let keep = open(upstream);
        if keep {
            upstream.relay.task.register(&self.stirred_waker);
        }
        keep
    }
}

/// Closes connections idle past the timeout, and connections the upstream closed as soon as their
/// socket stirs, while any are kept; ends when none are.
async fn sweep(inner: Arc<Inner>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(inner.idle_timeout / 2) => {}
            () = inner.stirred.0.notified() => {}
        }
        let now = Instant::now();
        let Ok(mut idle) = inner.idle.lock() else {
            return;
        };
        for (_, list) in idle.iter_mut() {
            list.retain_mut(|c| {
                now.duration_since(c.since) < inner.idle_timeout && inner.keep_idle(&mut c.upstream)
            });
        }
        idle.retain(|(_, list)| !list.is_empty());
        if idle.is_empty() {
            inner.sweeping.store(false, Ordering::Relaxed);
            return;
        }
    }
}

/// What polling a response body gives.
type Polled = Poll<Option<Result<Frame<Bytes>, hyper::Error>>>;

/// The connection a response body reads from, and where it goes when the response ends.
struct Held {
    pool: UpstreamPool,
    key: Key,
    upstream: Upstream,
}

/// A response body from the upstream. It drives its connection as it is polled. When it ends
/// cleanly its connection is kept for the next request; dropped before its end (a client gone, a
/// limit hit), or failed, the connection is closed with it, which cancels the request upstream.
pub struct PooledBody {
    inner: Incoming,
    held: Option<Held>,
    /// Not polled yet.
    first_poll: bool,
}

impl PooledBody {
    /// Polls hyper's body channel, with the connection's relay holding the wake it causes.
    fn take_frame(&mut self, cx: &mut Context<'_>) -> Polled {
        let relay = self.held.as_ref().map(|h| &h.upstream.relay);
        if let Some(r) = relay {
            r.taking.store(true, Ordering::Release);
        }
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Some(r) = relay {
            r.taking.store(false, Ordering::Release);
            // After a frame the body is polled again, and with it the connection; after none,
            // a wake held back meanwhile is passed on.
            if r.held.swap(false, Ordering::AcqRel) && polled.is_pending() {
                r.task.wake();
            }
        }
        polled
    }

    /// Gives the connection back once the body has ended; closes it if the body failed.
    fn after(&mut self, polled: Polled) -> Polled {
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.held = None,
            _ => {}
        }
        polled
    }

    fn give_back(&mut self) {
        if let Some(h) = self.held.take() {
            h.pool.give_back(h.key, h.upstream);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        // hyper's body channel is filled only when the connection is polled, here: it needs no
        // waker of its own, and a waker there would make each frame wake this task once more.
        let mut quiet = Context::from_waker(Waker::noop());
        // The channel holds one frame, and it is taken right after each poll of the connection:
        // it is empty at the start of a poll, except for what came with the response head.
        if this.first_poll {
            this.first_poll = false;
            let polled = this.take_frame(&mut quiet);
            if polled.is_ready() {
                return this.after(polled);
            }
        }
        let over = this.held.as_mut().is_none_or(|h| h.upstream.poll_conn(cx));
        let polled = this.take_frame(if over { cx } else { &mut quiet });
        this.after(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
