//! The meter's gauges: each is one entry of [`GAUGES`], its declaration beside how its value is
//! read from the meter when `/stats/metrics` is asked (on the meter thread, after the meter has
//! caught up to that instant). Adding a gauge is adding an entry.

use crate::clock::UnixNanos;
use crate::exposition::{Metric, Style, Text, Unit, Value, NO_LABELS};

use super::engine::Meter;

/// A gauge of the meter: its declaration and its value at an instant (`None`: unknown now, and
/// then not exposed rather than shown as 0).
pub struct Gauge {
    /// The declaration.
    pub metric: Metric,
    /// Its value at `now`.
    pub read: fn(&mut Meter, UnixNanos) -> Option<Value>,
}

/// The meter's gauges, in the order they are written (after its counters and histograms).
pub const GAUGES: [Gauge; 12] = [
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_requests_in_flight",
            "Generation requests in flight now.",
            Unit::Count("{request}"),
            &[],
        ),
        read: |m, _| Some(m.in_flight().into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_kv_sequences_fit_p50_context",
            "Sequences of the horizon's p50 context (prompt + completion) vLLM's KV cache holds at once.",
            Unit::Count("{sequence}"),
            &[],
        ),
        read: |m, _| Some(m.kv_view(None).table.first()?.kv_sequences?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_kv_sequences_fit_p90_context",
            "Sequences of the horizon's p90 context (prompt + completion) vLLM's KV cache holds at once.",
            Unit::Count("{sequence}"),
            &[],
        ),
        read: |m, _| Some(m.kv_view(None).table.get(1)?.kv_sequences?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_kv_sequences_fit_p99_context",
            "Sequences of the horizon's p99 context (prompt + completion) vLLM's KV cache holds at once.",
            Unit::Count("{sequence}"),
            &[],
        ),
        read: |m, _| Some(m.kv_view(None).table.get(2)?.kv_sequences?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_kv_blocks_estimate",
            "KV-cache blocks the proxy's in-flight requests hold: sum of ceil((prompt + generated so far) / block_size).",
            Unit::Count("{block}"),
            &[],
        ),
        read: |m, _| Some(m.kv_view(None).estimate.blocks?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_kv_blocks_server",
            "KV-cache blocks in use by vLLM's count: kv_cache_usage_perc x (num_gpu_blocks - 1) of the last scrape.",
            Unit::Count("{block}"),
            &[],
        ),
        read: |m, _| Some(m.kv_view(None).estimate.server_blocks?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_kv_headroom_sequences",
            "More sequences of the horizon's p90 context that fit in the KV cache's free blocks now.",
            Unit::Count("{sequence}"),
            &[],
        ),
        read: |m, _| Some(m.kv_view(None).headroom.sequences_p90?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_kv_growth_blocks_per_second",
            "Net growth of the live KV estimate over the shortest window: (blocks now - blocks at its start) / its seconds.",
            Unit::Count("{block}/s"),
            &[],
        ),
        read: |m, _| Some(m.kv_view(None).headroom.growth_blocks_per_s?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_kv_time_to_full_seconds",
            "Seconds until the KV cache's free blocks are used at the estimate's growth (absent while it is not filling).",
            Unit::Seconds,
            &[],
        ),
        read: |m, _| Some(m.kv_view(None).headroom.seconds_to_full?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_saturation_state",
            "vLLM's state over the shortest window: 0 ok, 1 queueing (requests waiting in half its scrapes, or without a scrape half its first tokens queued), 2 preempting.",
            Unit::Count("{state}"),
            &[],
        ),
        read: |m, now| Some(u64::from(m.saturation_now(now)?.level()).into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_capacity_at_service_level",
            "Highest in-flight level at which the service level's attainment target is met (a lower bound while ..._reached is 0).",
            Unit::Count("{request}"),
            &[],
        ),
        read: |m, now| Some(m.service_capacity(now).in_flight?.into()),
    },
    Gauge {
        metric: Metric::gauge(
            "tokenmeter_capacity_at_service_level_reached",
            "1 when a level above the capacity missed the service level, 0 while traffic never went high enough to miss.",
            Unit::Count("{boolean}"),
            &[],
        ),
        read: |m, now| {
            let c = m.service_capacity(now);
            c.in_flight.map(|_| u64::from(c.reached).into())
        },
    },
];

/// Appends every gauge's header and value at `now`.
pub fn render(out: &mut String, meter: &mut Meter, now: UnixNanos) {
    let mut w = Text::new(out, Style::Native);
    for g in &GAUGES {
        w.header(&g.metric);
        if let Some(v) = (g.read)(meter, now) {
            w.sample(&g.metric, NO_LABELS, v);
        }
    }
}
