//! The one interface measurements leave the proxy through. A leaf: the proxy calls it, and each
//! consumer (the meter, the access log, a test) implements it beside its own type, so none of
//! them imports another.

use std::sync::Arc;

use crate::clock::UnixNanos;
use crate::itl::Gaps;
use crate::record::RequestRecord;

/// Receives what the proxy measures: request starts, streamed tokens, finished records.
pub trait Observer: Send + Sync + 'static {
    /// A generation request arrived.
    fn started(&self, id: u64, now: UnixNanos, user: &Arc<str>, model: Option<&Arc<str>>);
    /// `completion_tokens` more tokens of request `id` passed the proxy at `now`, with the ITL
    /// `gaps` measured since its previous report (one bin and bucket; `count` 0 for none).
    fn tokens(&self, id: u64, now: UnixNanos, completion_tokens: u64, gaps: Gaps);
    /// Request `id` reported its prompt size before its end (a usage seen before an output
    /// event: the Messages API's first event, or vLLM's `continuous_usage_stats`); at most once
    /// per request.
    fn prompt_tokens(&self, _id: u64, _prompt_tokens: u64) {}
    /// Request `id` finished (every request, generation or not); `metered` says if it was
    /// started. The id is the number `started` and `tokens` carried: `record.request_id` is its
    /// formatted form, for the log only.
    fn finished(&self, id: u64, now: UnixNanos, record: &Arc<RequestRecord>, metered: bool);
}
