//! The proxy: it forwards each request to an upstream replica and meters it on the way (the
//! serving threads, one request's trip, the response body, the upstream connections). It is
//! handed what it reports to ([`Observer`]s, the `/stats` router) and depends on no exporter;
//! the running program is put together in `app`.

mod admission;
mod as_stream;
mod body;
mod client_body;
mod client_identity;
mod forward;
mod front_h1;
#[doc(hidden)]
pub mod fuzzing;
mod h1_message;
mod headers;
pub mod identity;
mod in_flight;
mod live_users;
mod pacemaker;
mod pool;
pub(crate) mod refusal;
pub mod request;
mod request_id;
pub mod request_scan;
mod serving;
pub mod session;
pub(crate) mod session_table;
pub mod sniff;
mod state;
mod token_run;
mod tracker;
mod upstream_error;
mod upstream_fields;
mod upstream_h1;
mod upstream_head;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

use serving::{bind_listeners, serve_on_own_thread, serving_threads, supervise, Threads};

pub use body::BoxError;
pub use headers::strip_hop_by_hop;
pub use in_flight::InFlight;
pub use live_users::LiveUsers;
pub use request_id::RequestId;
pub use serving::upstream_pool;
pub use state::ProxyState;
pub use tracker::{RequestMeta, Tracker, TrackerShared};
use upstream_fields::UpstreamFields;

use crate::config::ServeConfig;

/// The proxy's listeners, one per serving thread, bound before anything else starts so that a
/// taken port fails the start.
pub struct Listeners {
    addr: SocketAddr,
    listeners: Vec<std::net::TcpListener>,
}

impl Listeners {
    /// Binds `listen` for the configured number of serving threads.
    pub fn bind(config: &ServeConfig) -> anyhow::Result<Listeners> {
        use anyhow::Context as _;
        let (addr, listeners) = bind_listeners(config.listen_addr()?, serving_threads(config))
            .with_context(|| format!("binding {}", config.listen))?;
        Ok(Listeners { addr, listeners })
    }

    /// The bound address (the port chosen when `listen` asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A step of the shutdown, run once every request has finished.
pub type AfterDrain = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// What runs beside the serving threads and stops with them.
#[derive(Default)]
pub struct Background {
    /// Scrapers and the model refresh: aborted when shutdown starts.
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Run in order once every request has finished (the exporters' last flush, then the
    /// access log's close).
    pub after_drain: Vec<AfterDrain>,
}

/// The serving threads and their supervisor.
pub struct Proxy {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    state: Arc<ProxyState>,
}

impl Proxy {
    /// Starts a serving thread on each of `listeners`, serving with `state`; `background` stops
    /// with them. Must be called on a runtime (the supervisor is spawned on it).
    pub fn start(
        listeners: Listeners,
        state: Arc<ProxyState>,
        background: Background,
    ) -> anyhow::Result<Proxy> {
        let (tx, rx) = oneshot::channel();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let exited = tokio::sync::mpsc::unbounded_channel();
        let mut threads = Vec::new();
        for (i, listener) in listeners.listeners.into_iter().enumerate() {
            threads.push(Some(serve_on_own_thread(
                i,
                false,
                state.clone(),
                stop_rx.clone(),
                listener,
                exited.0.clone(),
            )?));
        }
        let serving = Threads {
            addr: listeners.addr,
            threads,
            exited,
        };
        let task = tokio::spawn(supervise(serving, rx, stop_tx, state.clone(), background));
        Ok(Proxy {
            addr: listeners.addr,
            shutdown: Some(tx),
            task,
            state,
        })
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state its requests share.
    pub fn state(&self) -> &Arc<ProxyState> {
        &self.state
    }

    /// Stops accepting, lets in-flight requests finish within the grace period, then runs the
    /// background's after-drain steps.
    pub async fn shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }
}

/// The body of every response the proxy sends.
pub enum ProxyBody {
    /// The upstream's body, metered on the way.
    Metered(Box<body::MeteredBody>),
    /// A body the proxy wrote itself.
    Full(Option<Bytes>),
    /// A non-streamed answer rebuilt from an upstream stream (`ttft_for_non_streamed`).
    Answer(Box<as_stream::AnswerBody>),
    /// A `/stats*` answer.
    Stats(axum::body::Body),
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Metered(b) => Pin::new(b.as_mut()).poll_frame(cx),
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
            ProxyBody::Answer(b) => Pin::new(b.as_mut()).poll_frame(cx),
            ProxyBody::Stats(b) => Pin::new(b)
                .poll_frame(cx)
                .map_err(|e| Box::new(e) as BoxError),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Metered(b) => b.is_end_stream(),
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Answer(b) => b.is_end_stream(),
            ProxyBody::Stats(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Metered(b) => b.size_hint(),
            ProxyBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            ProxyBody::Answer(b) => b.size_hint(),
            ProxyBody::Stats(b) => b.size_hint(),
        }
    }
}

impl ProxyBody {
    /// The upstream's fields that head this body, taken: the writer of the response head writes
    /// them before the response's own (`UpstreamFields::forwarded`).
    pub(crate) fn take_upstream_fields(&mut self) -> Option<UpstreamFields> {
        match self {
            ProxyBody::Metered(b) => b.take_fields(),
            _ => None,
        }
    }

    /// Whether a response of `status` with this body sends one (RFC 9110 §6.4.1: not 1xx, 204,
    /// 304, nor the upstream's answer to `HEAD`), and the body's length when it is known.
    pub(crate) fn sent_length(&self, status: http::StatusCode) -> (bool, Option<u64>) {
        let has_body = !(status.is_informational()
            || status == http::StatusCode::NO_CONTENT
            || status == http::StatusCode::NOT_MODIFIED
            || matches!(self, ProxyBody::Metered(b) if b.is_bodiless()));
        let known = if self.is_end_stream() {
            Some(0)
        } else {
            self.size_hint().exact()
        };
        (has_body, known)
    }
}

/// `r` with all its fields in its map, the upstream's first: for a writer that takes only a
/// `HeaderMap` (hyper's server).
pub(crate) fn fields_in_map(mut r: Response<ProxyBody>) -> Response<ProxyBody> {
    if let Some(sent) = r.body_mut().take_upstream_fields() {
        let (has_body, known) = r.body().sent_length(r.status());
        let own = std::mem::take(r.headers_mut());
        *r.headers_mut() = sent.header_map(own, known, has_body);
        // The upstream's reason phrase, as the front writes it.
        let reason = sent.reason();
        if r.status().canonical_reason().map(str::as_bytes) != Some(reason) {
            if let Ok(reason) = hyper::ext::ReasonPhrase::try_from(reason) {
                r.extensions_mut().insert(reason);
            }
        }
    }
    r
}

/// Answers a `/stats*` request with `router`.
pub(crate) async fn stats_response(
    router: axum::Router,
    req: Request<client_body::ClientBody>,
) -> Response<ProxyBody> {
    use tower::ServiceExt;
    let req = req.map(axum::body::Body::new);
    match router.oneshot(req).await {
        Ok(r) => r.map(ProxyBody::Stats),
        Err(never) => match never {},
    }
}
