//! The upstream connections of one serving thread: hyper's own HTTP/1 client connections, kept
//! alive and reused per replica. It replaces hyper-util's pooled client, whose per-request
//! machinery (a pool shared across runtimes, the checkout and connect futures raced against each
//! other, and a task spawned per request to hand the connection back once its response ended)
//! cost 7–10 µs of each request's round trip (`benches/ttft_breakdown.rs`). Here a connection goes
//! back when its response body ends, from the body itself ([`PooledBody`]).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use tower::ServiceExt;

use crate::tls::UpstreamConnector;

/// A replica's address as connections are kept by: scheme and authority.
type Key = (Scheme, Authority);

/// A connection waiting for its next request.
struct Idle {
    sender: SendRequest<Full<Bytes>>,
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
        UpstreamPool {
            inner: Arc::new(Inner {
                connector,
                idle_timeout,
                idle: Mutex::new(Vec::new()),
                sweeping: AtomicBool::new(false),
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
            let (mut sender, kept) = match self.checkout(&key) {
                Some(s) => (s, true),
                None => (self.connect(&target).await?, false),
            };
            if let Err(e) = sender.ready().await {
                if kept {
                    continue; // closed while idle: the next one, or a new connection
                }
                return Err(UpstreamError::Request(e));
            }
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let back = Some(GiveBack {
                        pool: self.clone(),
                        key,
                        sender,
                    });
                    let mut resp = resp.map(|inner| PooledBody { inner, back });
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
    fn checkout(&self, key: &Key) -> Option<SendRequest<Full<Bytes>>> {
        let now = Instant::now();
        let mut idle = self.inner.idle.lock().ok()?;
        let list = &mut idle.iter_mut().find(|(k, _)| k == key)?.1;
        while let Some(c) = list.pop() {
            if !c.sender.is_closed() && now.duration_since(c.since) < self.inner.idle_timeout {
                return Some(c.sender);
            }
        }
        None
    }

    /// A new connection to `target`'s replica, its task spawned on this thread's runtime.
    async fn connect(&self, target: &Uri) -> Result<SendRequest<Full<Bytes>>, UpstreamError> {
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
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    /// Keeps `sender` for the next request to `key`, unless its connection is closing.
    fn give_back(&self, key: Key, sender: SendRequest<Full<Bytes>>) {
        if sender.is_closed() {
            return;
        }
        let Ok(mut idle) = self.inner.idle.lock() else {
            return;
        };
        let entry = Idle {
            sender,
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

/// Closes connections idle past the timeout (dropping the last handle ends an idle connection),
/// while any are kept; ends when none are.
async fn sweep(inner: Arc<Inner>) {
    loop {
        tokio::time::sleep(inner.idle_timeout / 2).await;
        let now = Instant::now();
        let Ok(mut idle) = inner.idle.lock() else {
            return;
        };
        for (_, list) in idle.iter_mut() {
            list.retain(|c| {
                !c.sender.is_closed() && now.duration_since(c.since) < inner.idle_timeout
            });
        }
        idle.retain(|(_, list)| !list.is_empty());
        if idle.is_empty() {
            inner.sweeping.store(false, Ordering::Relaxed);
            return;
        }
    }
}

/// Where a connection goes when its response ends.
struct GiveBack {
    pool: UpstreamPool,
    key: Key,
    sender: SendRequest<Full<Bytes>>,
}

/// A response body from the upstream. When it ends cleanly its connection is kept for the next
/// request; dropped before its end (a client gone, a limit hit), or failed, the connection is
/// closed with it, which cancels the request upstream.
pub struct PooledBody {
    inner: Incoming,
    back: Option<GiveBack>,
}

impl PooledBody {
    fn give_back(&mut self) {
        if let Some(b) = self.back.take() {
            b.pool.give_back(b.key, b.sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.give_back(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.give_back(),
            Poll::Ready(Some(Err(_))) => this.back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
