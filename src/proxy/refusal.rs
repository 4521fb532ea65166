//! The heads hyper refuses before a request exists (431 for a head over `max_header_bytes` or
//! with more than 100 headers, 400 for one it cannot parse): hyper answers those itself, with an
//! empty body, and no handler runs, so no record would be written. The head sniffer
//! (`sniff.rs`) sees the same bytes first and foretells the refusal; when hyper then writes its
//! automatic answer, this module puts the proxy's own in its place: a JSON error body in the
//! proxy's one shape (`error.rs`), the request id header, and an access-log record (outcome
//! `client_error`), as for every other request.
//!
//! Why not in hyper: its automatic answer has no hook (no body, no callback), and reading heads
//! without hyper would give up its parser. Why a replacement, not a write of our own from the
//! read side: hyper reads ahead while a pipelined request's response is still going out, and
//! writes its refusal only once that response is done; replacing its write keeps that order.
//! The answer is recognised by its form, which no forwarded response has: a status line of the
//! foretold status and no header but `content-length: 0`, `date` and `connection` (every
//! forwarded response carries the request id header).

use std::net::SocketAddr;
use std::sync::Arc;

use http::HeaderMap;

use super::identity::{self, Clues};
use super::tracker::{RequestMeta, Tracker};
use super::ProxyState;
use crate::error::ProxyError;
use crate::record::Outcome;

/// Longest path kept from a refused head (the head may be all path).
const MAX_PATH_BYTES: usize = 1024;

/// A head the sniffer found hyper will refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The status hyper answers: 431 or 400.
    pub status: u16,
    /// The request line's method, when it was read.
    pub method: Option<String>,
    /// The request line's path (query cut off, at most 1 KiB), when it was read.
    pub path: Option<String>,
}

impl Refused {
    /// A refusal with `status` of the head starting with `head` (its request line, if whole).
    pub fn of(status: u16, head: &[u8]) -> Refused {
        let line_end = head
            .iter()
            .take(MAX_PATH_BYTES + 64)
            .position(|&b| b == b'\n')
            .unwrap_or(head.len().min(MAX_PATH_BYTES + 64));
        let line = String::from_utf8_lossy(&head[..line_end]);
        let mut words = line.trim_start().split(' ');
        let method = words
            .next()
            .filter(|m| !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()))
            .map(str::to_string);
        let path = words.next().and_then(|t| {
            let t = t.split('?').next().unwrap_or(t);
            let t = t.trim_end_matches('\r');
            t.starts_with('/').then(|| {
                let cut = t
                    .char_indices()
                    .map(|(i, _)| i)
                    .find(|&i| i >= MAX_PATH_BYTES)
                    .unwrap_or(t.len());
                t[..cut].to_string()
            })
        });
        Refused {
            status,
            method,
            path,
        }
    }
}

/// What answers a refused head in place of hyper's empty one.
pub trait Refusals: Send + Sync {
    /// The whole response to write (head and body) for `refused` from `remote`; called once per
    /// refusal, when hyper writes its answer, so the record is written exactly then.
    fn answer(&self, remote: SocketAddr, refused: &Refused) -> Vec<u8>;
}

/// Whether `data` is hyper's automatic answer with `status`: its status line, and no header but
/// `content-length: 0`, `date` and `connection`.
pub fn is_automatic_answer(data: &[u8], status: u16) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let Some(head) = text.strip_suffix("\r\n\r\n") else {
        return false;
    };
    let mut lines = head.split("\r\n");
    let status_ok = lines
        .next()
        .and_then(|l| l.strip_prefix("HTTP/1.1 "))
        .is_some_and(|l| l.starts_with(&format!("{status} ")));
    let mut empty = false;
    let headers_ok = lines.all(|l| {
        let l = l.to_ascii_lowercase();
        if l == "content-length: 0" {
            empty = true;
            return true;
        }
        l.starts_with("date: ") || l.starts_with("connection: ")
    });
    status_ok && headers_ok && empty
}

impl Refusals for ProxyState {
    fn answer(&self, remote: SocketAddr, refused: &Refused) -> Vec<u8> {
        let t0 = self.trackers.time().now();
        let cfg = &self.config;
        let path = refused.path.clone().unwrap_or_else(|| "/".into());
        let split = identity::split_user_prefix(&path);
        let api = crate::dialect::detect(split.path);
        let users = self.users.get();
        // The headers were not read: the path prefix, else the client's address.
        let (user, user_source) = identity::identify(
            &users,
            &Clues {
                path_user: split.user,
                headers: &HeaderMap::new(),
                body_user: None,
                client_ip: remote.ip(),
            },
        );
        let meta = RequestMeta {
            user: user.into(),
            user_source,
            model: None,
            method: refused.method.clone().unwrap_or_default(),
            path: path.clone(),
            client_request_id: None,
            user_agent: None,
            client_ip: cfg.access_log_client_ip.then(|| remote.ip().to_string()),
            api,
            stream: None,
            n: None,
            bytes_in: 0,
            trace: None,
            session: None,
        };
        let mut tracker = Tracker::start(
            self.trackers.clone(),
            t0,
            meta,
            cfg.metering && api.is_some(),
        );
        let (err, why) = if refused.status == 431 {
            (
                ProxyError::header_too_large(cfg.max_header_bytes),
                "request head over max_header_bytes or 100 headers",
            )
        } else {
            (
                ProxyError::bad_request("The request head could not be parsed."),
                "request head malformed",
            )
        };
        let body = err.body_in(crate::dialect::error_shape(&path));
        tracker.set_status(err.status.as_u16());
        tracker.on_sent(body.len());
        let id = tracker.request_id();
        let mut out = format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{}: {}\r\n\r\n",
            err.status.as_u16(),
            err.status.canonical_reason().unwrap_or(""),
            body.len(),
            self.request_id_header,
            id.as_str()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        let now = tracker.now();
        tracker.finish(Outcome::ClientError, Some(why), now);
        out
    }
}

/// A connection's refusal hook: the proxy's state and the client's address.
pub type Hook = (Arc<dyn Refusals>, SocketAddr);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_line_is_read_when_whole() {
        let r = Refused::of(
            431,
            b"POST /u/ann/v1/chat/completions?k=secret HTTP/1.1\r\nx: y",
        );
        assert_eq!(r.method.as_deref(), Some("POST"));
        assert_eq!(r.path.as_deref(), Some("/u/ann/v1/chat/completions"));
        let long = format!("GET /{} HTTP/1.1", "a".repeat(5000));
        let r = Refused::of(431, long.as_bytes());
        assert_eq!(r.path.map(|p| p.len()), Some(MAX_PATH_BYTES));
        assert_eq!(Refused::of(400, b"\x00\x01").path, None);
    }

    #[test]
    fn only_hypers_bare_answer_is_recognised() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Sat, 05 Dec 2026 07:00:00 GMT\r\n\r\n";
        assert!(is_automatic_answer(bare, 431));
        assert!(!is_automatic_answer(bare, 400));
        let forwarded = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nx-request-id: tm-1\r\ndate: x\r\n\r\n";
        assert!(!is_automatic_answer(forwarded, 431));
        let with_body =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 2\r\n\r\n{}";
        assert!(!is_automatic_answer(with_body, 431));
    }
}
