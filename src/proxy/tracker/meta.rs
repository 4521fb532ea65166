//! What a tracker knows of its request before the response: the meta that becomes the record's
//! request fields, the session's clues, and the identity filled in once the request is on its way.

use std::sync::Arc;

use crate::dialect::Api;
use crate::proxy::session::{SessionCall, SessionSource};
use crate::record::UserSource;

/// What is known about a request when it is admitted.
#[derive(Clone)]
pub struct RequestMeta {
    /// Who sent it.
    pub user: Arc<str>,
    /// How the user was found.
    pub user_source: UserSource,
    /// Requested model.
    pub model: Option<Arc<str>>,
    /// HTTP method.
    pub method: String,
    /// Path as the client sent it, without the query.
    pub path: String,
    /// The client's own valid request id, when it sent one.
    pub client_request_id: Option<String>,
    /// The client's `User-Agent`, bounded.
    pub user_agent: Option<String>,
    /// The client's IP address, when it is to be logged.
    pub client_ip: Option<String>,
    /// The generation API of the route, `None` for other routes.
    pub api: Option<Api>,
    /// `stream` from the body.
    pub stream: Option<bool>,
    /// `n` from the body.
    pub n: Option<u32>,
    /// Request body bytes.
    pub bytes_in: u64,
    /// The client's valid W3C `traceparent` header.
    pub trace: Option<crate::traceparent::TraceParent>,
    /// The agent session and turn, worked out with the identity.
    pub session: Option<SessionCall>,
}

/// What names a request's session, kept until its identity is settled.
pub struct SessionClues {
    /// The session the head names.
    pub header: Option<(SessionSource, String)>,
    /// The session the body names.
    pub body: Option<(SessionSource, String)>,
    /// The body's conversation, unread.
    pub conversation: Option<bytes::Bytes>,
    /// Codex's `turn_id`, hashed, when the head carries one.
    pub turn_key: Option<u64>,
}
