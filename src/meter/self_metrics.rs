//! The proxy's own series, kept outside the meter thread and appended to its exposition by the
//! HTTP handler: build information, the access-log writer's and the scraper's counters, and the
//! process's resource use. Each is declared once, in [`SERIES`], beside how its value is read.

use crate::exposition::{Metric, Style, Text, Unit, Value};

use super::process::ProcessStats;
use super::snapshot::AccessLogView;

/// Counters kept outside the meter thread, appended to its exposition by the HTTP handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct SelfMetrics {
    /// The access-log writer's counters.
    pub access_log: AccessLogView,
    /// Successful and failed scrapes of the upstream's `/metrics`, when scraping is on.
    pub scrapes: Option<(u64, u64)>,
    /// The process's own resource use, when the platform reports it.
    pub process: Option<ProcessStats>,
}

/// The running build: always 1, its `version` label names it.
pub const BUILD_INFO: Metric = Metric::gauge(
    "tokenmeter_build_info",
    "Always 1; the labels name the running build.",
    Unit::Info,
    &["version"],
);

/// A label-free series of [`SelfMetrics`]: its declaration and its value (`None`: not
/// exposed, as the scrape counters when scraping is off).
pub struct Series {
    /// The declaration.
    pub metric: Metric,
    /// Its value now.
    pub read: fn(&SelfMetrics) -> Option<Value>,
}

/// The label-free series, in the order they are written. The process series keep the names
/// client libraries give them, so existing process dashboards work.
pub const SERIES: [Series; 9] = [
    Series {
        metric: Metric::counter(
            "tokenmeter_access_log_written_total",
            "Access-log lines written.",
            Unit::Count("{record}"),
            &[],
        ),
        read: |m| Some(m.access_log.written.into()),
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_access_log_dropped_total",
            "Access-log records dropped (channel full or writer gone).",
            Unit::Count("{record}"),
            &[],
        ),
        read: |m| Some(m.access_log.dropped.into()),
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_access_log_failed_total",
            "Access-log records lost to write errors.",
            Unit::Count("{record}"),
            &[],
        ),
        read: |m| Some(m.access_log.failed.into()),
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_upstream_scrapes_total",
            "Successful scrapes of the upstream's /metrics.",
            Unit::Count("{scrape}"),
            &[],
        ),
        read: |m| m.scrapes.map(|(ok, _)| ok.into()),
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_upstream_scrape_errors_total",
            "Failed scrapes of the upstream's /metrics (connection, timeout, status, no vllm: series).",
            Unit::Count("{scrape}"),
            &[],
        ),
        read: |m| m.scrapes.map(|(_, errors)| errors.into()),
    },
    Series {
        metric: Metric::counter(
            "process_cpu_seconds_total",
            "User and system CPU time of the process, seconds.",
            Unit::Seconds,
            &[],
        ),
        read: |m| m.process.map(|p| p.cpu_s.into()),
    },
    Series {
        metric: Metric::gauge(
            "process_resident_memory_bytes",
            "Resident set size, bytes.",
            Unit::Bytes,
            &[],
        ),
        read: |m| m.process.map(|p| p.rss_bytes.into()),
    },
    Series {
        metric: Metric::gauge(
            "process_open_fds",
            "Open file descriptors.",
            Unit::Count("{file}"),
            &[],
        ),
        read: |m| m.process.map(|p| p.open_fds.into()),
    },
    Series {
        metric: Metric::gauge(
            "process_start_time_seconds",
            "Start of the process, seconds since the Unix epoch.",
            Unit::Seconds,
            &[],
        ),
        read: |m| m.process.map(|p| p.start_time_s.into()),
    },
];

/// Appends build information, the access-log and scrape counters and the process metrics.
pub fn render_self(out: &mut String, m: &SelfMetrics) {
    let mut w = Text::new(out, Style::Native);
    w.header(&BUILD_INFO);
    w.sample(&BUILD_INFO, [env!("CARGO_PKG_VERSION")], 1u64);
    for s in &SERIES {
        if let Some(v) = (s.read)(m) {
            w.single(&s.metric, v);
        }
    }
}
