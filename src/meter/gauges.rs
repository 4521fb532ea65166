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
pub const GAUGES: [Gauge; 1] = [Gauge {
    metric: Metric::gauge(
        "tokenmeter_requests_in_flight",
        "Generation requests in flight now.",
        Unit::Count("{request}"),
        &[],
    ),
    read: |m, _| Some(m.in_flight().into()),
}];

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
