//! The proxy's side of TTFT for non-streamed requests (`ttft_for_non_streamed`): reading the
//! stream it asked for in place of a non-streamed request, measuring it as a client stream is
//! measured, and answering with the folded JSON once the stream is over.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use super::pool::PooledBody;
use bytes::Bytes;
use http::{header, HeaderValue, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::dialect::Dialect;
use crate::error::ProxyError;
use crate::fold::{Fold, Folded};
use crate::proxy::body::BoxError;
use crate::proxy::tracker::Tracker;
use crate::record::Outcome;
use crate::sse::SseScanner;

/// The record's `ttft_source` for an answer rebuilt from an upstream stream.
pub const TTFT_SOURCE: &str = "upstream_stream";

/// How reading the stream sent in place of a non-streamed request ended.
pub enum Collected {
    /// The stream folded into the client's answer (or into vLLM's non-streamed error).
    Answer(Folded),
    /// The stream cannot be proven to give vLLM's non-streamed answer: ask again, non-streamed.
    Fallback(&'static str),
    /// The stream broke off (upstream lost or silent): answer with this error.
    Failed(ProxyError, Outcome, &'static str),
}

/// Limits that apply while a stream is read for folding.
pub struct Limits {
    /// Longest silence between two frames.
    pub idle: Duration,
    /// Largest SSE event read.
    pub max_event_bytes: usize,
    /// Most answer bytes held (`max_response_scan_bytes`).
    pub max_held_bytes: usize,
}

/// Reads `body` (a 200 event stream) to its end, feeding each event to `tracker` as `dialect`
/// reads it (as for a client's stream) and to `fold`. Dropping the future (the client left)
/// drops `body`, which closes the upstream connection.
pub async fn collect(
    mut body: PooledBody,
    dialect: &dyn Dialect,
    fold: &mut dyn Fold,
    tracker: &mut Tracker,
    limits: &Limits,
) -> Collected {
    let mut scanner = SseScanner::new(limits.max_event_bytes);
    loop {
        let frame = match tokio::time::timeout(limits.idle, body.frame()).await {
            Err(_) => {
                return Collected::Failed(
                    ProxyError::gateway_timeout("upstream stream went silent"),
                    Outcome::Timeout,
                    "upstream body idle timeout",
                )
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => {
                return Collected::Failed(
                    ProxyError::bad_gateway("upstream connection lost mid-stream"),
                    Outcome::UpstreamAborted,
                    "upstream connection lost mid-body",
                )
            }
            Ok(Some(Ok(frame))) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let now = tracker.now();
        tracker.on_upstream_bytes(now);
        let mut stop = None;
        scanner.feed(&data, |ev| {
            if stop.is_some() {
                return;
            }
            if ev.oversize {
                stop = Some("an event over max_sse_event_bytes");
                return;
            }
            if let Some(s) = dialect.event(ev.data) {
                tracker.on_event(&s, now, true);
            }
            if let Err(why) = fold.feed(ev.data) {
                stop = Some(why.0);
            }
        });
        if let Some(why) = stop {
            return Collected::Fallback(why);
        }
        if fold.held_bytes() > limits.max_held_bytes {
            return Collected::Fallback("answer over max_response_scan_bytes");
        }
    }
    match fold.finish() {
        Ok(answer) => Collected::Answer(answer),
        Err(why) => Collected::Fallback(why.0),
    }
}

/// The client's answer: the upstream stream's headers but for its framing and type, which are
/// those of vLLM's non-streamed answer (`application/json`, a `content-length`, no chunking).
pub fn respond(
    mut parts: http::response::Parts,
    folded: Folded,
    mut tracker: Tracker,
) -> http::Response<crate::proxy::ProxyBody> {
    let (status, body) = match folded {
        Folded::Answer(b) => (StatusCode::OK, b),
        Folded::Error { status, body } => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body,
        ),
    };
    parts.status = status;
    let h = &mut parts.headers;
    h.remove(header::TRANSFER_ENCODING);
    h.remove(header::CACHE_CONTROL);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    tracker.set_status(status.as_u16());
    tracker.set_ttft_source(TTFT_SOURCE);
    http::Response::from_parts(
        parts,
        crate::proxy::ProxyBody::Answer(Box::new(AnswerBody {
            data: Some(Bytes::from(body)),
            tracker,
        })),
    )
}

/// A rebuilt answer, sent in one frame; the request's record is finished as it is handed over.
pub struct AnswerBody {
    data: Option<Bytes>,
    tracker: Tracker,
}

impl Body for AnswerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(data) = this.data.take() else {
            return Poll::Ready(None);
        };
        this.tracker.on_sent(data.len());
        let now = this.tracker.now();
        this.tracker.finish(Outcome::Ok, None, now);
        Poll::Ready(Some(Ok(Frame::data(data))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
