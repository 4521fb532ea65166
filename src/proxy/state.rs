//! The state every request of one proxy shares, built once at start.

use std::sync::Arc;

use crate::config::ServeConfig;
use crate::fleet::Upstreams;
use crate::health::Health;
use crate::proxy::live_users::LiveUsers;
use crate::proxy::pool::UpstreamPool;
use crate::proxy::tracker::TrackerShared;
use crate::tls::{ListenerTls, UpstreamConnector};

/// What every request of one proxy shares. Built once; each further serving thread takes a copy
/// with a pool of its own ([`ProxyState::with_pool`]).
#[derive(Clone)]
pub struct ProxyState {
    /// Settings.
    pub config: ServeConfig,
    /// The upstream replicas and the balancer's state.
    pub upstreams: Arc<Upstreams>,
    /// Keep-alive connections to the upstream replicas.
    pub pool: UpstreamPool,
    /// What `pool` connects with (serving threads build their own pool from it).
    pub connector: UpstreamConnector,
    /// Readiness: upstream connection failures are reported to it.
    pub health: Arc<Health>,
    /// TLS for client connections, when configured.
    pub tls: Option<Arc<ListenerTls>>,
    /// `request_id_header`, parsed.
    pub request_id_header: http::HeaderName,
    /// The user settings, as last reloaded (read these, not `config.users`).
    pub users: Arc<LiveUsers>,
    /// Measurement state shared by all requests.
    pub trackers: Arc<TrackerShared>,
    /// `/stats*` handler on this listener, when stats are served here.
    pub stats: Option<axum::Router>,
}

impl ProxyState {
    /// A copy of this state with `pool` as its upstream pool: a pooled connection's socket is
    /// registered with the runtime that opened it, so every serving thread needs its own.
    pub fn with_pool(&self, pool: UpstreamPool) -> ProxyState {
        ProxyState {
            pool,
            ..self.clone()
        }
    }
}
