//! OTLP traces: one span per finished generation request, with the GenAI semantic-convention
//! attributes and the TTFT as an event, continuing the caller's `traceparent` when it sent one.
//!
//! Spans are built on the OTLP recording thread from the finished record (never on the data
//! path) and handed to a thread of their own through a bounded queue (`try_send`: a full queue
//! drops the span and counts it). That thread exports them in batches of up to [`BATCH`], at
//! least every export interval, and counts the spans of a failed export request as dropped.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{
    Event, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use opentelemetry_sdk::Resource;
use rand::RngCore;

use crate::otlp::transport::{request_timeout, ExportRuntime, OtlpCounters, OtlpHttp, Signal};
use crate::record::RequestRecord;

/// Spans queued for the export thread before new ones are dropped (and counted).
pub const SPAN_QUEUE: usize = 8_192;
/// Most spans in one export request.
pub const BATCH: usize = 512;
/// The name of the span event at the first token.
pub const FIRST_TOKEN_EVENT: &str = "gen_ai.first_token";

/// Builds spans from records; owned by the recording thread (its random ids need no lock).
pub struct SpanMaker {
    rng: rand::rngs::SmallRng,
    scope: InstrumentationScope,
}

impl std::fmt::Debug for SpanMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanMaker").finish_non_exhaustive()
    }
}

fn at(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

impl SpanMaker {
    /// A maker with ids seeded from the OS.
    pub fn new() -> Self {
        use rand::SeedableRng;
        SpanMaker {
            rng: rand::rngs::SmallRng::from_entropy(),
            scope: InstrumentationScope::builder("tokenmeter")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        }
    }

    fn span_id(&mut self) -> SpanId {
        loop {
            let id = self.rng.next_u64();
            if id != 0 {
                return SpanId::from(id);
            }
        }
    }

    /// The span of one finished generation request; `None` when the caller's `traceparent`
    /// says the trace is not sampled.
    pub fn span(&mut self, r: &RequestRecord, operation: &'static str) -> Option<SpanData> {
        let (trace_id, parent) = match r.trace {
            Some(t) if !t.sampled() => return None,
            Some(t) => (
                TraceId::from_bytes(t.trace_id),
                Some(SpanId::from_bytes(t.parent_id)),
            ),
            None => {
                let mut id = [0u8; 16];
                while id == [0; 16] {
                    self.rng.fill_bytes(&mut id);
                }
                (TraceId::from_bytes(id), None)
            }
        };
        let span_id = self.span_id();
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.provider.name", "vllm"),
        ];
        if let Some(m) = &r.model {
            attributes.push(KeyValue::new("gen_ai.request.model", m.clone()));
        }
        if let Some(c) = &r.session {
            // The session's pseudonym, as the access log names it (never the agent's raw id).
            attributes.push(KeyValue::new("gen_ai.conversation.id", c.clone()));
        }
        if let Some(n) = r.prompt_tokens {
            attributes.push(KeyValue::new("gen_ai.usage.input_tokens", n as i64));
        }
        if let Some(n) = r.completion_tokens {
            attributes.push(KeyValue::new("gen_ai.usage.output_tokens", n as i64));
        }
        if let Some(f) = &r.finish_reason {
            attributes.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                Value::Array(vec![StringValue::from(f.clone())].into()),
            ));
        }
        if let Some(s) = r.stream {
            attributes.push(KeyValue::new("tokenmeter.stream", s));
        }
        if let Some(s) = r.status {
            attributes.push(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        if let Some(u) = &r.upstream {
            attributes.push(KeyValue::new("tokenmeter.upstream", u.clone()));
        }
        attributes.push(KeyValue::new("tokenmeter.request_id", r.request_id.clone()));
        attributes.push(KeyValue::new("tokenmeter.outcome", r.outcome.as_str()));
        let status = if r.outcome.is_error() {
            attributes.push(KeyValue::new("error.type", r.outcome.as_str()));
            Status::Error {
                description: Cow::Borrowed(r.outcome.as_str()),
            }
        } else {
            Status::Unset
        };
        let mut events = SpanEvents::default();
        if let (Some(t), Some(ms)) = (r.ttft_ns(), r.ttft_ms) {
            events.events.push(Event::new(
                FIRST_TOKEN_EVENT,
                at(t),
                vec![KeyValue::new("gen_ai.server.time_to_first_token", ms / 1e3)],
                0,
            ));
        }
        let name = match &r.model {
            Some(m) => Cow::Owned(format!("{operation} {m}")),
            None => Cow::Borrowed(operation),
        };
        Some(SpanData {
            span_context: SpanContext::new(
                trace_id,
                span_id,
                TraceFlags::SAMPLED,
                false,
                TraceState::NONE,
            ),
            parent_span_id: parent.unwrap_or(SpanId::INVALID),
            parent_span_is_remote: parent.is_some(),
            span_kind: SpanKind::Client,
            name,
            start_time: at(r.start_ns()),
            end_time: at(r.end_ns()),
            attributes,
            dropped_attributes_count: 0,
            events,
            links: SpanLinks::default(),
            status,
            instrumentation_scope: self.scope.clone(),
        })
    }
}

impl Default for SpanMaker {
    fn default() -> Self {
        Self::new()
    }
}

/// The span export thread's queue; spans go in with [`SpanQueue::offer`].
#[derive(Debug)]
pub struct SpanQueue {
    tx: SyncSender<SpanData>,
    counters: Arc<OtlpCounters>,
}

impl SpanQueue {
    /// Starts the export thread, sending to `<endpoint>/v1/traces` at least every `interval`,
    /// its requests run on `runtime`.
    pub fn start(
        endpoint: &str,
        interval: Duration,
        counters: Arc<OtlpCounters>,
        runtime: &Arc<ExportRuntime>,
    ) -> anyhow::Result<(SpanQueue, std::thread::JoinHandle<()>)> {
        let client = OtlpHttp::new(
            runtime,
            request_timeout(interval),
            counters.clone(),
            Signal::Traces,
        );
        let mut exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .with_http_client(client)
            .build()?;
        exporter.set_resource(&Resource::builder().build());
        let (tx, rx) = sync_channel::<SpanData>(SPAN_QUEUE);
        let c = counters.clone();
        let rt = runtime.clone();
        let thread = std::thread::Builder::new()
            .name("tokenmeter-otlp-spans".into())
            .spawn(move || export_loop(&rx, &exporter, &rt, interval, &c))?;
        Ok((SpanQueue { tx, counters }, thread))
    }

    /// Queues a span, or counts it dropped when the queue is full.
    pub fn offer(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            self.counters.spans_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Exports batches until the queue closes, then the rest.
fn export_loop(
    rx: &Receiver<SpanData>,
    exporter: &SpanExporter,
    runtime: &ExportRuntime,
    interval: Duration,
    counters: &OtlpCounters,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut due = Instant::now() + interval;
    let send = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        let spans = std::mem::replace(batch, Vec::with_capacity(BATCH));
        let counter = match runtime.block_on(exporter.export(spans)) {
            Ok(()) => &counters.spans_exported,
            Err(_) => &counters.spans_dropped,
        };
        counter.fetch_add(n, Ordering::Relaxed);
    };
    loop {
        let wait = due.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(span) => {
                batch.push(span);
                if batch.len() >= BATCH {
                    send(&mut batch);
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                send(&mut batch);
                due = Instant::now() + interval;
            }
            Err(RecvTimeoutError::Disconnected) => {
                send(&mut batch);
                return;
            }
        }
    }
}
