//! A request's identity (user and how it was found), user agent, client address and trace,
//! worked out from the head's fields that say them once the request is on its way upstream.

use std::net::SocketAddr;

use http::{header, HeaderMap, HeaderName};

use crate::config::UsersConfig;
use crate::proxy::identity::{self, Clues};
use crate::proxy::tracker::RequestMeta;
use crate::traceparent::TraceParent;

/// W3C Trace Context's field.
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The client of a request as its head and connection show it.
pub struct Client<'a> {
    /// The request's head.
    pub headers: &'a HeaderMap,
    /// The user named by the path's prefix, if any.
    pub path_user: Option<&'a str>,
    /// The client's address.
    pub remote: SocketAddr,
    /// Whether the access log keeps the client's address.
    pub log_client_ip: bool,
}

/// Fills `meta`'s identity, user agent, client address and trace from `client`, with the
/// body's `user` when it named one (`Tracker::identify`).
pub fn fill_identity(
    meta: &mut RequestMeta,
    body_user: Option<&str>,
    users: &UsersConfig,
    client: &Client<'_>,
) {
    let (user, source) = identity::identify(
        users,
        &Clues {
            path_user: client.path_user,
            headers: client.headers,
            body_user,
            client_ip: client.remote.ip(),
        },
    );
    meta.user = user.into();
    meta.user_source = source;
    meta.user_agent = user_agent(client.headers);
    meta.client_ip = client.log_client_ip.then(|| client.remote.ip().to_string());
    meta.trace = client
        .headers
        .get(&TRACEPARENT)
        .and_then(|v| TraceParent::parse(v.as_bytes()));
}

/// The client's `User-Agent`, cut to a bounded length (invalid UTF-8 replaced).
fn user_agent(h: &HeaderMap) -> Option<String> {
    let text = String::from_utf8_lossy(h.get(header::USER_AGENT)?.as_bytes());
    // Copied once, at its final length.
    Some(
        match text.char_indices().nth(crate::record::MAX_USER_AGENT_CHARS) {
            Some((cut, _)) => text[..cut].to_string(),
            None => text.into_owned(),
        },
    )
}
