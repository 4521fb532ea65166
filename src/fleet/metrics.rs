//! The per-replica Prometheus series: each declared once in [`PER_REPLICA`], beside how its value
//! is read from a replica. The `upstream` label is bounded by the config.

use std::sync::atomic::Ordering;

use crate::clock::UnixNanos;
use crate::exposition::{Metric, Style, Text, Unit};
use crate::record::Outcome;

use super::{Upstream, Upstreams};

/// How a per-replica series reads its value.
pub enum Read {
    /// One value per replica.
    Value(fn(&Upstream, UnixNanos) -> u64),
    /// One value per replica and [`Outcome`] (the `outcome` label).
    ByOutcome,
}

/// A per-replica series: its declaration and how it is read.
pub struct Series {
    /// The declaration.
    pub metric: Metric,
    /// How its values are read.
    pub read: Read,
}

fn total(c: &std::sync::atomic::AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// The per-replica series, in the order they are written.
pub const PER_REPLICA: [Series; 7] = [
    Series {
        metric: Metric::gauge(
            "tokenmeter_upstream_in_flight",
            "Generation and other requests routed to the replica and not finished.",
            Unit::Count("{request}"),
            &["upstream"],
        ),
        read: Read::Value(|u, _| u.in_flight()),
    },
    Series {
        metric: Metric::gauge(
            "tokenmeter_upstream_ejected",
            "1 while the replica is ejected after failures.",
            Unit::Info,
            &["upstream"],
        ),
        read: Read::Value(|u, now| u64::from(u.ejected_at(now))),
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_upstream_requests_total",
            "Finished requests routed to the replica, by outcome.",
            Unit::Count("{request}"),
            &["upstream", "outcome"],
        ),
        read: Read::ByOutcome,
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_upstream_completion_tokens_total",
            "Completion tokens of finished requests routed to the replica.",
            Unit::Count("{token}"),
            &["upstream"],
        ),
        read: Read::Value(|u, _| total(&u.counters.completion_tokens)),
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_upstream_prompt_tokens_total",
            "Prompt tokens of finished requests routed to the replica.",
            Unit::Count("{token}"),
            &["upstream"],
        ),
        read: Read::Value(|u, _| total(&u.counters.prompt_tokens)),
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_upstream_failures_total",
            "Failed attempts on the replica (refused, lost before the head, or 5xx).",
            Unit::Count("{attempt}"),
            &["upstream"],
        ),
        read: Read::Value(|u, _| total(&u.counters.failures)),
    },
    Series {
        metric: Metric::counter(
            "tokenmeter_upstream_retries_total",
            "Requests moved from the replica to another after a failed attempt.",
            Unit::Count("{request}"),
            &["upstream"],
        ),
        read: Read::Value(|u, _| total(&u.counters.retried_away)),
    },
];

/// Appends the per-replica Prometheus series.
pub fn render_prometheus(out: &mut String, ups: &Upstreams, now: UnixNanos) {
    let mut w = Text::new(out, Style::Native);
    for s in &PER_REPLICA {
        let m = &s.metric;
        w.header(m);
        for u in &ups.list {
            let name = &*u.name;
            match s.read {
                Read::Value(read) => w.sample(m, [name], read(u, now)),
                Read::ByOutcome => {
                    for (o, n) in Outcome::ALL.iter().zip(&u.counters.outcomes) {
                        w.sample(m, [name, o.as_str()], total(n));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::settings::{ResolvedUpstream, RoutingConfig};

    #[test]
    fn a_replica_name_is_escaped_in_its_label() {
        let up = ResolvedUpstream {
            name: "a\"b".into(),
            url: "http://127.0.0.1:9".into(),
            base: "http://127.0.0.1:9".into(),
            authority: "127.0.0.1:9".into(),
            metrics: None,
        };
        let ups = Upstreams::new(&[up], &RoutingConfig::default()).unwrap();
        let mut out = String::new();
        render_prometheus(&mut out, &ups, 0);
        assert!(out.contains("tokenmeter_upstream_in_flight{upstream=\"a\\\"b\"} 0\n"));
    }
}
