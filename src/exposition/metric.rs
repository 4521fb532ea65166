//! [`Metric`]: one metric's declaration (name, help, type, unit, label names, bucket bounds),
//! from which its exposition is written ([`super::text`]) and its OTLP instrument built.
//!
//! Declarations are `const` items, built by [`Metric::counter`], [`Metric::gauge`] and
//! [`Metric::histogram`], which check the naming rules when the program is compiled: a mistake in
//! a declaration is a build error, not a series a dashboard silently misses.

/// What kind of metric it is, as the exposition's `# TYPE` line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only ever grows (resets only with the process).
    Counter,
    /// A level that goes up and down.
    Gauge,
    /// Observations counted into fixed buckets, with their sum and count.
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// What a metric's values measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds; a Prometheus name says so with `_seconds`.
    Seconds,
    /// Bytes; a Prometheus name says so with `_bytes`.
    Bytes,
    /// A fraction, 1 meaning all.
    Ratio,
    /// A number of things, named as UCUM annotates a count (`{token}`, `{request}`).
    Count(&'static str),
    /// No quantity: an info metric whose labels are the information (always 1).
    Info,
}

impl Unit {
    /// The UCUM unit OpenTelemetry instruments carry (`s`, `By`, `1`, `{token}`).
    pub const fn ucum(self) -> &'static str {
        match self {
            Unit::Seconds => "s",
            Unit::Bytes => "By",
            Unit::Ratio | Unit::Info => "1",
            Unit::Count(what) => what,
        }
    }

    /// The word a Prometheus metric's name carries for the unit, when it must carry one.
    const fn name_part(self) -> Option<&'static str> {
        match self {
            Unit::Seconds => Some("_seconds"),
            Unit::Bytes => Some("_bytes"),
            Unit::Ratio | Unit::Count(_) | Unit::Info => None,
        }
    }
}

/// One metric's declaration: everything about it but its values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metric {
    /// The name as exposed (`tokenmeter_requests_total`, `vllm:num_requests_running`,
    /// `gen_ai.client.token.usage`).
    pub name: &'static str,
    /// The `# HELP` text (the OTLP instrument's description).
    pub help: &'static str,
    /// Its type.
    pub kind: Kind,
    /// What its values measure.
    pub unit: Unit,
    /// Its label names, in the order they are written (`le` is the writer's, never declared).
    /// A label may be left out of a sample when its setting is off (`user`).
    pub labels: &'static [&'static str],
    /// A histogram's bucket upper bounds, ascending (`+Inf` implied); empty for the others.
    pub buckets: &'static [f64],
}

impl Metric {
    /// A counter; its Prometheus name ends in `_total`.
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        unit: Unit,
        labels: &'static [&'static str],
    ) -> Metric {
        assert!(ends_with(name, "_total"), "a counter's name ends in _total");
        Metric::checked(name, help, Kind::Counter, unit, labels, &[])
    }

    /// A gauge.
    pub const fn gauge(
        name: &'static str,
        help: &'static str,
        unit: Unit,
        labels: &'static [&'static str],
    ) -> Metric {
        Metric::checked(name, help, Kind::Gauge, unit, labels, &[])
    }

    /// A histogram over `buckets` (ascending, at least one bound).
    pub const fn histogram(
        name: &'static str,
        help: &'static str,
        unit: Unit,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Metric {
        assert!(!buckets.is_empty(), "a histogram has buckets");
        let mut i = 1;
        while i < buckets.len() {
            assert!(buckets[i - 1] < buckets[i], "bucket bounds ascend");
            i += 1;
        }
        Metric::checked(name, help, Kind::Histogram, unit, labels, buckets)
    }

    const fn checked(
        name: &'static str,
        help: &'static str,
        kind: Kind,
        unit: Unit,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Metric {
        assert!(
            !name.is_empty() && !help.is_empty(),
            "a metric has a name and help"
        );
        // OpenTelemetry names (dotted) carry their unit in the instrument's unit instead.
        if let (Some(part), false) = (unit.name_part(), contains(name, ".")) {
            assert!(contains(name, part), "the name carries its unit");
        }
        let mut i = 0;
        while i < labels.len() {
            assert!(!eq(labels[i], "le"), "`le` is the histogram writer's label");
            i += 1;
        }
        Metric {
            name,
            help,
            kind,
            unit,
            labels,
            buckets,
        }
    }
}

const fn eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && ends_with(a, b)
}

const fn ends_with(s: &str, suffix: &str) -> bool {
    let (s, x) = (s.as_bytes(), suffix.as_bytes());
    if x.len() > s.len() {
        return false;
    }
    let mut i = 0;
    while i < x.len() {
        if s[s.len() - x.len() + i] != x[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn contains(s: &str, part: &str) -> bool {
    let (s, x) = (s.as_bytes(), part.as_bytes());
    let mut start = 0;
    while start + x.len() <= s.len() {
        let mut i = 0;
        while i < x.len() && s[start + i] == x[i] {
            i += 1;
        }
        if i == x.len() {
            return true;
        }
        start += 1;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_rules_read_the_bytes() {
        assert!(ends_with("a_total", "_total") && !ends_with("total", "_total"));
        assert!(contains("x_seconds_total", "_seconds") && !contains("x_second", "_seconds"));
        assert!(eq("le", "le") && !eq("ale", "le"));
        let m = Metric::counter("x_seconds_total", "h", Unit::Seconds, &["a"]);
        assert_eq!((m.kind.as_str(), m.unit.ucum()), ("counter", "s"));
    }

    #[test]
    #[should_panic(expected = "a counter's name ends in _total")]
    fn a_counter_without_total_is_refused() {
        // In a `const` item this is a build error; called at run time it panics.
        let _ = Metric::counter(std::hint::black_box("x"), "h", Unit::Info, &[]);
    }

    #[test]
    #[should_panic(expected = "the name carries its unit")]
    fn seconds_without_the_word_are_refused() {
        let _ = Metric::gauge(std::hint::black_box("x_ms"), "h", Unit::Seconds, &[]);
    }

    #[test]
    #[should_panic(expected = "bucket bounds ascend")]
    fn unordered_buckets_are_refused() {
        let _ = Metric::histogram("x_seconds", "h", Unit::Seconds, &[], &[1.0, 1.0]);
    }
}
