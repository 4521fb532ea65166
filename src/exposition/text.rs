//! The Prometheus text format (0.0.4) written from [`Metric`] declarations: the `# HELP` and
//! `# TYPE` lines, samples with their labels in the declared order, histograms made cumulative.

use std::fmt::Write as _;

use super::metric::{Kind, Metric};

/// How numbers and histogram lines are spelled. Prometheus reads both alike; each follows the
/// program whose output it stands for, so text compared with a recording matches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// tokenmeter's own: integers as integers, floats as Rust prints them (`1`, `0.25`); `le`
    /// after the declared labels; `_sum` before `_count`.
    Native,
    /// vLLM's (Python's client): every value a float (`8.0`); `le` among the labels in name
    /// order; `_count` before `_sum`.
    Python,
}

/// A sample's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// A count.
    Int(u64),
    /// A measured quantity.
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Int(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(u64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

/// The label values of one sample, in the order of the declaration's label names. A `None`
/// leaves its label out (a label whose setting is off, as `user`).
pub trait LabelValues {
    /// The value of the `i`-th declared label.
    fn value(&self, i: usize) -> Option<&str>;
}

impl<const N: usize> LabelValues for [&str; N] {
    fn value(&self, i: usize) -> Option<&str> {
        self.get(i).copied()
    }
}

impl<const N: usize> LabelValues for [Option<&str>; N] {
    fn value(&self, i: usize) -> Option<&str> {
        self.get(i).copied().flatten()
    }
}

/// A label-free sample.
pub const NO_LABELS: [&str; 0] = [];

/// Writes an exposition into a string.
pub struct Text<'a> {
    out: &'a mut String,
    style: Style,
}

impl<'a> Text<'a> {
    /// A writer appending to `out`.
    pub fn new(out: &'a mut String, style: Style) -> Self {
        Text { out, style }
    }

    /// The `# HELP` and `# TYPE` lines of `m` (once per family, before its samples).
    pub fn header(&mut self, m: &Metric) {
        let (name, help, kind) = (m.name, m.help, m.kind.as_str());
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// The header of `m` and its one label-free sample.
    pub fn single(&mut self, m: &Metric, v: impl Into<Value>) {
        self.header(m);
        self.sample(m, NO_LABELS, v);
    }

    /// One sample of a counter or gauge.
    pub fn sample(&mut self, m: &Metric, labels: impl LabelValues, v: impl Into<Value>) {
        debug_assert!(m.kind != Kind::Histogram);
        self.out.push_str(m.name);
        self.labels(m, &labels, None);
        self.value(v.into());
    }

    /// One histogram series: `counts[i]` observations fell in bucket `i` alone (not cumulative;
    /// only the declared bounds are read), `count` in all (`+Inf`), summing to `sum`.
    pub fn histogram(
        &mut self,
        m: &Metric,
        labels: impl LabelValues,
        counts: &[u64],
        count: u64,
        sum: f64,
    ) {
        debug_assert!(m.kind == Kind::Histogram);
        let mut cum = 0;
        for (bound, n) in m.buckets.iter().zip(counts) {
            cum += n;
            self.series(m.name, "_bucket");
            self.labels(m, &labels, Some(Le::Bound(*bound)));
            self.value(Value::Int(cum));
        }
        self.series(m.name, "_bucket");
        self.labels(m, &labels, Some(Le::Inf));
        self.value(Value::Int(count));
        let sum_line = |t: &mut Self| {
            t.series(m.name, "_sum");
            t.labels(m, &labels, None);
            t.value(Value::Float(sum));
        };
        let count_line = |t: &mut Self| {
            t.series(m.name, "_count");
            t.labels(m, &labels, None);
            t.value(Value::Int(count));
        };
        match self.style {
            Style::Native => {
                sum_line(self);
                count_line(self);
            }
            Style::Python => {
                count_line(self);
                sum_line(self);
            }
        }
    }

    fn series(&mut self, name: &str, suffix: &str) {
        self.out.push_str(name);
        self.out.push_str(suffix);
    }

    /// `{a="x",b="y"}` (nothing when no label is written), with `le` where the style puts it.
    fn labels(&mut self, m: &Metric, values: &impl LabelValues, le: Option<Le>) {
        let mut le = le;
        let mut first = true;
        for (i, name) in m.labels.iter().enumerate() {
            if self.style == Style::Python && *name > "le" {
                if let Some(b) = le.take() {
                    self.le(b, &mut first);
                }
            }
            if let Some(v) = values.value(i) {
                self.out.push_str(if first { "{" } else { "," });
                first = false;
                self.out.push_str(name);
                self.out.push_str("=\"");
                escape_into(self.out, v);
                self.out.push('"');
            }
        }
        if let Some(b) = le {
            self.le(b, &mut first);
        }
        if !first {
            self.out.push('}');
        }
    }

    fn le(&mut self, le: Le, first: &mut bool) {
        self.out.push_str(if *first { "{le=\"" } else { ",le=\"" });
        *first = false;
        match le {
            Le::Bound(b) => self.number(Value::Float(b)),
            Le::Inf => self.out.push_str("+Inf"),
        }
        self.out.push('"');
    }

    fn value(&mut self, v: Value) {
        self.out.push(' ');
        self.number(v);
        self.out.push('\n');
    }

    fn number(&mut self, v: Value) {
        let _ = match (self.style, v) {
            (Style::Native, Value::Int(n)) => write!(self.out, "{n}"),
            (Style::Native, Value::Float(f)) => write!(self.out, "{f}"),
            (Style::Python, Value::Int(n)) => write_python_float(self.out, n as f64),
            (Style::Python, Value::Float(f)) => write_python_float(self.out, f),
        };
    }
}

/// A bucket's `le`.
#[derive(Clone, Copy)]
enum Le {
    Bound(f64),
    Inf,
}

/// Python's float repr for the values written (`8.0`, `0.25`).
fn write_python_float(out: &mut String, v: f64) -> std::fmt::Result {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        write!(out, "{v:.1}")
    } else {
        write!(out, "{v}")
    }
}

/// Appends a label value escaped: backslash, double quote and newline.
fn escape_into(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exposition::metric::Unit;

    const C: Metric = Metric::counter("x_total", "Things.", Unit::Count("{thing}"), &["a", "b"]);
    const H: Metric = Metric::histogram(
        "h_seconds",
        "Waits.",
        Unit::Seconds,
        &["engine", "model_name"],
        &[0.5, 1.0],
    );

    #[test]
    fn samples_escape_and_leave_out_unset_labels() {
        let mut s = String::new();
        let mut t = Text::new(&mut s, Style::Native);
        t.header(&C);
        t.sample(&C, ["q\"\\\nz", "y"], 3u64);
        t.sample(&C, [Some("x"), None], 0.5);
        t.sample(&C, [None, None], 1u32);
        assert_eq!(
            s,
            "# HELP x_total Things.\n# TYPE x_total counter\n\
             x_total{a=\"q\\\"\\\\\\nz\",b=\"y\"} 3\nx_total{a=\"x\"} 0.5\nx_total 1\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_in_either_style() {
        let mut s = String::new();
        Text::new(&mut s, Style::Native).histogram(&H, ["0", "m"], &[1, 2], 4, 3.0);
        assert_eq!(
            s,
            "h_seconds_bucket{engine=\"0\",model_name=\"m\",le=\"0.5\"} 1\n\
             h_seconds_bucket{engine=\"0\",model_name=\"m\",le=\"1\"} 3\n\
             h_seconds_bucket{engine=\"0\",model_name=\"m\",le=\"+Inf\"} 4\n\
             h_seconds_sum{engine=\"0\",model_name=\"m\"} 3\n\
             h_seconds_count{engine=\"0\",model_name=\"m\"} 4\n"
        );
        let mut s = String::new();
        Text::new(&mut s, Style::Python).histogram(&H, ["0", "m"], &[1, 2], 4, 3.25);
        assert_eq!(
            s,
            "h_seconds_bucket{engine=\"0\",le=\"0.5\",model_name=\"m\"} 1.0\n\
             h_seconds_bucket{engine=\"0\",le=\"1.0\",model_name=\"m\"} 3.0\n\
             h_seconds_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 4.0\n\
             h_seconds_count{engine=\"0\",model_name=\"m\"} 4.0\n\
             h_seconds_sum{engine=\"0\",model_name=\"m\"} 3.25\n"
        );
    }
}
