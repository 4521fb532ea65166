//! Opt-in OTLP/HTTP (protobuf) export of the OpenTelemetry GenAI semantic-convention metrics,
//! and with `otlp_traces` one span per generation request ([`traces`]).
//!
//! The data path only offers each finished generation record to a bounded queue (`try_send`: a
//! full queue drops the record and counts it). A thread of its own records the instruments; the
//! SDK's periodic reader exports them on its own thread every `otlp_export_interval_ms`, through
//! hyper-util's client on a small runtime of the exporters' own ([`transport`]), so a slow or
//! down collector never reaches a request. A failed export is counted; the SDK keeps cumulative
//! sums, so the next export that gets through carries what the failed one had.

pub mod traces;
pub mod transport;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{MetricExporter, Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

use crate::clock::UnixNanos;
use crate::exposition::{Metric, Style, Text, Unit};
use crate::observe::Observer;
use crate::otlp::traces::{SpanMaker, SpanQueue};
pub use crate::otlp::transport::OtlpCounters;
use crate::otlp::transport::{request_timeout, ExportRuntime, OtlpHttp, Signal};
use crate::record::RequestRecord;

/// Records queued for the recording thread before new ones are dropped (and counted).
pub const QUEUE: usize = 65_536;

/// The attributes every GenAI instrument carries (`error.type` only on the duration of a failed
/// request, `gen_ai.token.type` only on token usage).
const GENAI_ATTRIBUTES: &[&str] = &[
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "tokenmeter.upstream",
];

/// `gen_ai.client.token.usage`, on the bounds the conventions recommend.
pub const TOKEN_USAGE: Metric = Metric::histogram(
    "gen_ai.client.token.usage",
    "Number of input and output tokens used.",
    Unit::Count("{token}"),
    &[
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "tokenmeter.upstream",
        "gen_ai.token.type",
    ],
    &[
        1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
        4194304.0, 16777216.0, 67108864.0,
    ],
);

/// `gen_ai.client.operation.duration`, seconds.
pub const OPERATION_DURATION: Metric = Metric::histogram(
    "gen_ai.client.operation.duration",
    "GenAI operation duration (arrival to the last byte).",
    Unit::Seconds,
    &[
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "tokenmeter.upstream",
        "error.type",
    ],
    &[
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ],
);

/// `gen_ai.server.time_to_first_token`, seconds, of successful requests.
pub const TIME_TO_FIRST_TOKEN: Metric = Metric::histogram(
    "gen_ai.server.time_to_first_token",
    "Time to generate first token for successful responses.",
    Unit::Seconds,
    GENAI_ATTRIBUTES,
    &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ],
);

/// `gen_ai.server.time_per_output_token`, seconds, of successful requests.
pub const TIME_PER_OUTPUT_TOKEN: Metric = Metric::histogram(
    "gen_ai.server.time_per_output_token",
    "Time per output token generated after the first token for successful responses.",
    Unit::Seconds,
    GENAI_ATTRIBUTES,
    &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    ],
);

/// An instrument's description, unit and bounds, from its declaration.
fn u64_histogram(meter: &opentelemetry::metrics::Meter, m: &Metric) -> Histogram<u64> {
    meter
        .u64_histogram(m.name)
        .with_unit(m.unit.ucum())
        .with_description(m.help)
        .with_boundaries(m.buckets.to_vec())
        .build()
}

/// [`u64_histogram`] for `f64` values.
fn f64_histogram(meter: &opentelemetry::metrics::Meter, m: &Metric) -> Histogram<f64> {
    meter
        .f64_histogram(m.name)
        .with_unit(m.unit.ucum())
        .with_description(m.help)
        .with_boundaries(m.buckets.to_vec())
        .build()
}

/// The GenAI operation name of a generation request (its API's; records reach the exporter only
/// for generation requests, which always have one).
fn operation(r: &RequestRecord) -> &'static str {
    r.api.map_or("chat", crate::dialect::Api::otel_operation)
}

/// The GenAI instruments.
struct Instruments {
    token_usage: Histogram<u64>,
    duration: Histogram<f64>,
    ttft: Histogram<f64>,
    tpot: Histogram<f64>,
}

impl Instruments {
    fn new(provider: &SdkMeterProvider) -> Self {
        let meter = provider.meter("tokenmeter");
        Instruments {
            token_usage: u64_histogram(&meter, &TOKEN_USAGE),
            duration: f64_histogram(&meter, &OPERATION_DURATION),
            ttft: f64_histogram(&meter, &TIME_TO_FIRST_TOKEN),
            tpot: f64_histogram(&meter, &TIME_PER_OUTPUT_TOKEN),
        }
    }

    /// Records one finished generation request (the same figures as its access-log line).
    fn record(&self, r: &RequestRecord) {
        let operation = operation(r);
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", operation),
            KeyValue::new("gen_ai.provider.name", "vllm"),
        ];
        if let Some(m) = &r.model {
            attrs.push(KeyValue::new("gen_ai.request.model", m.clone()));
        }
        if let Some(u) = &r.upstream {
            attrs.push(KeyValue::new("tokenmeter.upstream", u.clone()));
        }
        let ok = !r.outcome.is_error();
        let mut with_error = attrs.clone();
        if !ok {
            with_error.push(KeyValue::new("error.type", r.outcome.as_str()));
        }
        if let Some(e2e) = r.e2e_ms {
            self.duration.record(e2e / 1e3, &with_error);
        }
        for (kind, n) in [("input", r.prompt_tokens), ("output", r.completion_tokens)] {
            if let Some(n) = n {
                let mut a = attrs.clone();
                a.push(KeyValue::new("gen_ai.token.type", kind));
                self.token_usage.record(n, &a);
            }
        }
        if ok {
            if let Some(t) = r.ttft_ms {
                self.ttft.record(t / 1e3, &attrs);
            }
            if let Some(t) = r.tpot_ms {
                self.tpot.record(t / 1e3, &attrs);
            }
        }
    }
}

/// A running exporter: the queue's sending side and the recording thread.
#[derive(Debug)]
pub struct OtlpExport {
    tx: Mutex<Option<SyncSender<Arc<RequestRecord>>>>,
    counters: Arc<OtlpCounters>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl OtlpExport {
    /// Starts exporting to `endpoint` (an `http://host:port[/base]` OTLP/HTTP receiver; metrics
    /// go to `<endpoint>/v1/metrics`, spans with `traces` to `<endpoint>/v1/traces`) every
    /// `interval`.
    pub fn start(
        endpoint: &str,
        interval: Duration,
        traces: bool,
    ) -> anyhow::Result<Arc<OtlpExport>> {
        let counters = Arc::new(OtlpCounters::default());
        let url = format!("{}/v1/metrics", endpoint.trim_end_matches('/'));
        let runtime = ExportRuntime::start()?;
        let client = OtlpHttp::new(
            &runtime,
            request_timeout(interval),
            counters.clone(),
            Signal::Metrics,
        );
        let exporter = MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_http_client(client)
            .build()?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(interval)
            .build();
        let provider = SdkMeterProvider::builder().with_reader(reader).build();
        let spans = if traces {
            Some(SpanQueue::start(
                endpoint,
                interval,
                counters.clone(),
                &runtime,
            )?)
        } else {
            None
        };
        let (tx, rx) = sync_channel::<Arc<RequestRecord>>(QUEUE);
        let recorded = counters.clone();
        let thread = std::thread::Builder::new()
            .name("tokenmeter-otlp".into())
            .spawn(move || {
                let instruments = Instruments::new(&provider);
                let (queue, span_thread) = spans.unzip();
                let mut maker = queue.as_ref().map(|_| SpanMaker::new());
                while let Ok(r) = rx.recv() {
                    instruments.record(&r);
                    if let (Some(q), Some(m)) = (&queue, &mut maker) {
                        if let Some(span) = m.span(&r, operation(&r)) {
                            q.offer(span);
                        }
                    }
                    recorded.recorded.fetch_add(1, Ordering::Relaxed);
                }
                // The queue closed (shutdown): the spans left go out, then one last export of
                // every metric recorded.
                drop(queue);
                if let Some(t) = span_thread {
                    let _ = t.join();
                }
                let _ = provider.shutdown();
            })?;
        Ok(Arc::new(OtlpExport {
            tx: Mutex::new(Some(tx)),
            counters,
            thread: Mutex::new(Some(thread)),
        }))
    }

    /// The export counters.
    pub fn counters(&self) -> &Arc<OtlpCounters> {
        &self.counters
    }

    /// Closes the queue, records what is left, exports once more and waits for it (blocking).
    pub fn shutdown(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    fn offer(&self, record: &Arc<RequestRecord>) {
        // The lock is only contended at shutdown; a poisoned or closed queue counts as a drop.
        let sent = match self.tx.lock() {
            Ok(tx) => match tx.as_ref() {
                Some(tx) => !matches!(
                    tx.try_send(record.clone()),
                    Err(TrySendError::Full(_) | TrySendError::Disconnected(_))
                ),
                None => false,
            },
            Err(_) => false,
        };
        if !sent {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Observer for OtlpExport {
    fn started(&self, _: u64, _: UnixNanos, _: &Arc<str>, _: Option<&Arc<str>>) {}

    fn tokens(&self, _: u64, _: UnixNanos, _: u64, _: crate::itl::Gaps) {}

    fn finished(&self, _: u64, _: UnixNanos, record: &Arc<RequestRecord>, _metered: bool) {
        if record.is_generation() {
            self.offer(record);
        }
    }
}

/// Which of [`OtlpCounters`] a series reads.
pub type ReadCounter = fn(&OtlpCounters) -> &AtomicU64;

/// The exporters' own counters, each declared once beside the counter it reads, in the order
/// they are written.
pub const COUNTERS: [(Metric, ReadCounter); 7] = [
    (
        Metric::counter(
            "tokenmeter_otlp_dropped_total",
            "Records not exported because the OTLP queue was full.",
            Unit::Count("{record}"),
            &[],
        ),
        |c| &c.dropped,
    ),
    (
        Metric::counter(
            "tokenmeter_otlp_exports_total",
            "OTLP metrics export requests the collector accepted.",
            Unit::Count("{request}"),
            &[],
        ),
        |c| &c.exports_ok,
    ),
    (
        Metric::counter(
            "tokenmeter_otlp_export_failures_total",
            "OTLP metrics export requests that failed (connection, timeout, non-2xx).",
            Unit::Count("{request}"),
            &[],
        ),
        |c| &c.export_failures,
    ),
    (
        Metric::counter(
            "tokenmeter_otlp_spans_exported_total",
            "Spans in OTLP trace export requests the collector accepted.",
            Unit::Count("{span}"),
            &[],
        ),
        |c| &c.spans_exported,
    ),
    (
        Metric::counter(
            "tokenmeter_otlp_spans_dropped_total",
            "Spans lost: the span queue was full or their export request failed.",
            Unit::Count("{span}"),
            &[],
        ),
        |c| &c.spans_dropped,
    ),
    (
        Metric::counter(
            "tokenmeter_otlp_span_exports_total",
            "OTLP trace export requests the collector accepted.",
            Unit::Count("{request}"),
            &[],
        ),
        |c| &c.span_exports_ok,
    ),
    (
        Metric::counter(
            "tokenmeter_otlp_span_export_failures_total",
            "OTLP trace export requests that failed (connection, timeout, non-2xx).",
            Unit::Count("{request}"),
            &[],
        ),
        |c| &c.span_export_failures,
    ),
];

/// Appends the export counters to a Prometheus exposition.
pub fn render_prometheus(out: &mut String, c: &OtlpCounters) {
    let mut w = Text::new(out, Style::Native);
    for (m, read) in &COUNTERS {
        w.single(m, read(c).load(Ordering::Relaxed));
    }
}
