//! What a failed upstream request means: the answer to the client, the outcome and the reason
//! logged, classified by the error types in the chain (never by their text).

use super::pool::UpstreamError;
use crate::error::ProxyError;
use crate::record::Outcome;

/// Maps a client error to the answer, the outcome and a secret-free reason.
pub(super) fn classify_client_error(e: &UpstreamError) -> (ProxyError, Outcome, &'static str) {
    if matches!(e, UpstreamError::Uri) {
        let why = "invalid upstream URI";
        return (ProxyError::bad_gateway(why), Outcome::ProxyError, why);
    }
    if e.is_connect() {
        // The connector's own timeout arrives as an io::Error of kind TimedOut wrapping tokio's
        // Elapsed; either, anywhere in the chain, is a timeout.
        let timed_out = io_kind(e) == Some(std::io::ErrorKind::TimedOut)
            || in_chain::<tokio::time::error::Elapsed>(e);
        let why = if timed_out {
            "connect timeout"
        } else if let Some(tls) = crate::tls::tls_failure(e) {
            tls
        } else if io_kind(e) == Some(std::io::ErrorKind::ConnectionRefused) {
            "connection refused"
        } else {
            "cannot connect"
        };
        return (ProxyError::bad_gateway(why), Outcome::ProxyError, why);
    }
    let why = "upstream closed the connection before answering";
    (ProxyError::bad_gateway(why), Outcome::UpstreamAborted, why)
}

/// Whether an error of type `T` is `e` or one of its sources.
fn in_chain<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<T>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The kind of the first I/O error in `e`'s chain of sources.
fn io_kind(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io.kind());
        }
        cur = err.source();
    }
    None
}
