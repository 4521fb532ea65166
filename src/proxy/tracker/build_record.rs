//! Building the request's one record from what its tracker measured.

use std::time::Instant;

use crate::clock::format_rfc3339_micros;
use crate::itl::ItlHistogram;
use crate::record::{DerivedRates, Outcome, RequestRecord, TokensSource, RECORD_SCHEMA};

use super::Tracker;

impl Tracker {
    fn ms(&self, t: Option<Instant>) -> Option<f64> {
        t.map(|t| t.saturating_duration_since(self.t0).as_secs_f64() * 1e3)
    }

    /// The request's record. Built once (`finish` runs once): the meta's strings move into it.
    pub(super) fn record(
        &mut self,
        outcome: Outcome,
        error: Option<&str>,
        now: Instant,
    ) -> RequestRecord {
        let (completion, source) = match (self.usage_completion, self.counted) {
            (Some(c), _) => (Some(c), TokensSource::Usage),
            (None, n) if n > 0 => (Some(n), TokensSource::Counted),
            _ => (None, TokensSource::None),
        };
        let e2e_ms = Some(now.saturating_duration_since(self.t0).as_secs_f64() * 1e3);
        // A stream that generated tokens (usage > 0) but showed no output before its end has
        // its TTFT at the event that ended it; its pace is not observed, so no TPOT.
        let generated = self.usage_completion.is_some_and(|c| c > 0);
        let (ttft, at_end) = match self.ttft {
            Some(t) => (Some(t), false),
            None if generated => (self.generation_end, self.generation_end.is_some()),
            None => (None, false),
        };
        let ttft_ms = self.ms(ttft);
        let rates = DerivedRates::compute(ttft_ms.filter(|_| !at_end), e2e_ms, completion);
        let ttft_source = ttft_ms.map(|_| {
            let stream = self.ttft_source.unwrap_or("stream");
            if at_end {
                format!("{stream}_end")
            } else {
                stream.to_string()
            }
        });
        let itl = self.itl.take();
        let itl_stat = |f: fn(&ItlHistogram) -> Option<f64>| itl.as_deref().and_then(f);
        RequestRecord {
            kind: "request".into(),
            schema: RECORD_SCHEMA,
            ts: format_rfc3339_micros(self.t0_ns),
            ts_ns: self.t0_ns,
            request_id: self.request_id().as_str().to_string(),
            client_request_id: self.meta.client_request_id.take(),
            upstream: self.upstream.as_ref().map(|l| l.upstream.name.to_string()),
            user: self.meta.user.to_string(),
            user_source: self.meta.user_source,
            model: self.meta.model.as_deref().map(str::to_string),
            method: std::mem::take(&mut self.meta.method),
            path: std::mem::take(&mut self.meta.path),
            user_agent: self.meta.user_agent.take(),
            client_ip: self.meta.client_ip.take(),
            status: self.status,
            stream: self.meta.stream,
            outcome,
            api: self.meta.api,
            prompt_tokens: self.usage_prompt,
            completion_tokens: completion,
            cached_prompt_tokens: self.usage_cached,
            reasoning_tokens: self.usage_reasoning,
            tokens_source: source,
            n: self.meta.n,
            first_byte_ms: self.ms(self.first_byte),
            ttft_ms,
            ttft_source,
            ttft_fallback: self.ttft_fallback.map(str::to_string),
            bench_ttft_ms: self.ms(self.bench_ttft),
            e2e_ms,
            tpot_ms: rates.tpot_ms,
            itl_max_ms: itl_stat(ItlHistogram::max_ms),
            itl_mean_ms: itl_stat(ItlHistogram::mean_ms),
            itl_p50_ms: itl_stat(|h| h.quantile_ms(0.5)),
            itl_p99_ms: itl_stat(|h| h.quantile_ms(0.99)),
            tok_s: rates.tok_s,
            decode_tok_s: rates.decode_tok_s,
            slo_ok: None,
            slo_miss: None,
            in_flight_at_start: self.in_flight_at_start,
            cold_start: self.cold,
            finish_reason: self.finish_reason.take(),
            bytes_in: self.meta.bytes_in,
            bytes_out: self.bytes_out,
            error: error.map(str::to_string),
            server_queue_ms: self.server.and_then(|s| s.queue_time_ms),
            server_ttft_ms: self.server.and_then(|s| s.time_to_first_token_ms),
            server_mean_itl_ms: self.server.and_then(|s| s.mean_itl_ms),
            token_curve: self.curve.take(),
            session: None,
            session_source: None,
            turn: None,
            session_call: None,
            session_gap_ms: None,
            prefix_expected_tokens: None,
            prefix_lost_tokens: None,
            prefix_audit: None,
            itl,
            trace: self.meta.trace,
        }
    }
}
