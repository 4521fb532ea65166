//! The upstream connections of one serving thread: HTTP/1.1 client connections
//! ([`H1Conn`](super::upstream_h1::H1Conn)), kept alive and reused per replica. It replaces
//! hyper-util's pooled client, whose per-request machinery (a pool shared across runtimes, the
//! checkout and connect futures raced against each other, and a task spawned per request to hand
//! the connection back once its response ended) showed in each request's round trip
//! (`benches/ttft_breakdown.rs` measures it; the figures are in `docs/performance.md`), and then
//! hyper's own client connection, whose body channel cost a hand-off per frame (`upstream_h1.rs`
//! says why).
//!
//! No connection has a task of its own. Whoever uses a connection reads it: the request waiting
//! for its response head, then the response body ([`PooledBody`]), both on the task that serves
//! the client, so a frame goes from the upstream socket to the client in one task poll. An idle
//! connection is read only when its socket stirs: its wake goes to the pool's sweeper, which
//! closes it at once when the upstream closed it. It is also checked when it is checked out, so a
//! close that arrived just before is seen before a request is sent on it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{StatusCode, Uri};
use http_body::{Body, Frame, SizeHint};
use tower::{Service, ServiceExt};

use super::upstream_fields::UpstreamFields;
use super::upstream_h1::{Framing, H1Conn, H1Error, Head};
use super::upstream_head::UpstreamRequest;
use crate::tls::UpstreamConnector;

/// A replica's address as connections are kept by: scheme and authority.
type Key = (Scheme, Authority);

/// The transport of an upstream connection (plain TCP or TLS).
type Io = <UpstreamConnector as Service<Uri>>::Response;

/// One upstream connection. Boxed: with its TLS state it is kilobytes, and a connection moves
/// from the pool to the request to the body and back on every request.
type Upstream = Box<H1Conn<Io>>;

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
    /// What an idle connection's socket wakes when it stirs (the upstream closed it, or sent
    /// what it should not have): the sweeper, which then reads the idle connections and
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

/// An upstream's response: its status, its fields as sent, and its body.
pub struct UpstreamResponse {
    /// The status.
    pub status: StatusCode,
    /// The fields, framing and hop-by-hop ones included.
    pub fields: UpstreamFields,
    /// The body, read from the connection as it is polled.
    pub body: PooledBody,
}

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, timed out, TLS): nothing was sent.
    #[error("cannot connect to the upstream")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The connection failed while the request was sent or before its response head.
    #[error("upstream connection failed")]
    Request(#[source] H1Error),
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

    /// Sends `req` on an idle connection to its replica, or on a new one, and waits for the
    /// response head. A request is sent again, on the next kept connection or a new one, only
    /// when none of it reached the socket of a kept connection that turned out closed: once a
    /// byte is written the upstream may have taken the request, and a generation is never
    /// started twice.
    pub async fn request(&self, req: UpstreamRequest) -> Result<UpstreamResponse, UpstreamError> {
        let key = match (req.origin.scheme(), req.origin.authority()) {
            (Some(s), Some(a)) => (s.clone(), a.clone()),
            _ => return Err(UpstreamError::Uri),
        };
        loop {
            let (mut upstream, kept) = match self.checkout(&key) {
                Some(u) => (u, true),
                None => (self.connect(&req.origin).await?, false),
            };
            let Head {
                status,
                fields,
                framing,
                reusable,
                ..
            } = match upstream
                .send(req.head.clone(), req.body.clone(), &req.method)
                .await
            {
                Ok(head) => head,
                Err(e) if kept && e.written == 0 => continue,
                Err(e) => return Err(UpstreamError::Request(e.error)),
            };
            let mut body = PooledBody {
                framing,
                held: Some(Held {
                    pool: self.clone(),
                    key,
                    upstream,
                    reusable,
                }),
            };
            // A body that is over before it starts (204, 304, `content-length: 0`) may never be
            // polled: its connection is free now.
            if framing == Framing::Done {
                body.give_back();
            }
            return Ok(UpstreamResponse {
                status,
                fields,
                body,
            });
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
        Ok(Box::new(H1Conn::new(io)))
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

/// Reads an idle connection (an end of stream the upstream sent meanwhile) and says whether it is
/// still open for a request. Its socket's next stir wakes no one.
fn open(upstream: &mut Upstream) -> bool {
    upstream.poll_idle(&mut Context::from_waker(Waker::noop()))
}

impl Inner {
    /// Whether `upstream` is still open to be kept idle; if so, its socket now wakes the sweeper.
    fn keep_idle(&self, upstream: &mut Upstream) -> bool {
        upstream.poll_idle(&mut Context::from_waker(&self.stirred_waker))
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
type Polled = Poll<Option<Result<Frame<Bytes>, H1Error>>>;

/// The connection a response body reads from, and where it goes when the response ends.
struct Held {
    pool: UpstreamPool,
    key: Key,
    upstream: Upstream,
    /// The response allows another request on the connection once its body is over.
    reusable: bool,
}

/// A response body from the upstream, read from its connection as it is polled. When it ends
/// cleanly its connection is kept for the next request; dropped before its end (a client gone, a
/// limit hit), or failed, the connection is closed with it, which cancels the request upstream.
pub struct PooledBody {
    framing: Framing,
    held: Option<Held>,
}

impl PooledBody {
    /// Gives the connection back now that the body is over, if it may carry another request.
    fn give_back(&mut self) {
        if let Some(h) = self.held.take() {
            if h.reusable && h.upstream.is_clean() {
                h.pool.give_back(h.key, h.upstream);
            }
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = H1Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        let Some(held) = this.held.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = held.upstream.poll_body(&mut this.framing, cx);
        match &polled {
            Poll::Ready(Some(Err(_))) => {
                this.held = None;
                this.framing = Framing::Done;
            }
            Poll::Ready(_) if this.framing == Framing::Done => this.give_back(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Length(n) => SizeHint::with_exact(n),
            Framing::Done => SizeHint::with_exact(0),
            Framing::Chunked(_) | Framing::UntilClose => SizeHint::default(),
        }
    }
}
