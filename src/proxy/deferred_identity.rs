//! A request's identity (user and how it was found), user agent, client address and trace,
//! worked out from the head's fields that say them once the request is on its way upstream.

use std::net::SocketAddr;
use std::sync::Arc;

use http::header;

use crate::proxy::identity::{self, Clues};
use crate::proxy::tracker::{DeferredIdentity, RequestMeta};
use crate::traceparent::TraceParent;

/// W3C Trace Context's field.
static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// Fills a request's identity, user agent and trace from the head's fields that say them, kept
/// (reference-counted, not copied) for the tracker, which settles it when the request is
/// admitted or finishes ([`Tracker::defer_identity`]); the forwarder makes it once the request
/// is on its way, or as it refuses it.
pub fn deferred_identity(
    headers: &http::HeaderMap,
    users: &Arc<crate::config::UsersConfig>,
    path_user: Option<&str>,
    remote: SocketAddr,
    log_client_ip: bool,
) -> DeferredIdentity {
    let mut kept = http::HeaderMap::with_capacity(8);
    for (name, v) in headers {
        let n = name.as_str();
        if name == header::AUTHORIZATION
            || name == header::USER_AGENT
            || *name == identity::X_API_KEY
            || *name == TRACEPARENT
            || n.eq_ignore_ascii_case(&users.header)
        {
            kept.append(name.clone(), v.clone());
        }
    }
    let users = users.clone();
    let path_user = path_user.map(str::to_string);
    Box::new(move |meta: &mut RequestMeta, body_user: Option<&str>| {
        let (user, source) = identity::identify(
            &users,
            &Clues {
                path_user: path_user.as_deref(),
                headers: &kept,
                body_user,
                client_ip: remote.ip(),
            },
        );
        meta.user = user.into();
        meta.user_source = source;
        meta.user_agent = user_agent(&kept);
        meta.client_ip = log_client_ip.then(|| remote.ip().to_string());
        meta.trace = kept
            .get(&TRACEPARENT)
            .and_then(|v| TraceParent::parse(v.as_bytes()));
    })
}

/// The client's `User-Agent`, cut to a bounded length (invalid UTF-8 replaced).
fn user_agent(h: &http::HeaderMap) -> Option<String> {
    let text = String::from_utf8_lossy(h.get(header::USER_AGENT)?.as_bytes());
    // Copied once, at its final length.
    Some(
        match text.char_indices().nth(crate::record::MAX_USER_AGENT_CHARS) {
            Some((cut, _)) => text[..cut].to_string(),
            None => text.into_owned(),
        },
    )
}
