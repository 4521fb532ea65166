//! Hand-written SVG line charts: every series is one `<polyline class="series"
//! data-series="NAME">`, axes carry ticks and labels.

use std::fmt::Write;

use super::report::Report;

/// Most points a timeline series is drawn with; longer series are averaged in groups.
pub const MAX_POINTS: usize = 1500;

const W: f64 = 720.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 70.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// One plotted line.
#[derive(Debug, Clone)]
pub struct Series {
    /// The `data-series` name and legend text.
    pub name: String,
    /// (x, y) points in data units.
    pub points: Vec<(f64, f64)>,
    /// Scaled against the right-hand axis instead of the left.
    pub right_axis: bool,
}

pub use super::svg_parts::esc;
use super::svg_parts::{open, step};

fn axis_max(points: impl Iterator<Item = f64>) -> f64 {
    let m = points.filter(|v| v.is_finite()).fold(0.0f64, f64::max);
    if m <= 0.0 {
        1.0
    } else {
        (m / step(m)).ceil() * step(m)
    }
}

fn label(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A line chart with a left axis, an optional right axis and a legend.
pub fn chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    y2_label: Option<&str>,
    series: &[Series],
) -> String {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let x_min = xs.clone().fold(f64::INFINITY, f64::min);
    let x_min = if x_min.is_finite() {
        x_min.min(0.0)
    } else {
        0.0
    };
    let x_max = axis_max(xs).max(x_min + 1.0);
    let y_max = axis_max(
        series
            .iter()
            .filter(|s| !s.right_axis)
            .flat_map(|s| s.points.iter().map(|p| p.1)),
    );
    let y2_max = axis_max(
        series
            .iter()
            .filter(|s| s.right_axis)
            .flat_map(|s| s.points.iter().map(|p| p.1)),
    );
    let sx = |x: f64| LEFT + (x - x_min) / (x_max - x_min) * pw;
    let sy = |y: f64, max: f64| TOP + ph - y / max * ph;
    let mut o = open(W, H, title);
    let _ = write!(
        o,
        r#"<g class="axes" stroke="dimgray"><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{}"/><line x1="{LEFT}" y1="{0}" x2="{1}" y2="{0}"/></g>"#,
        TOP + ph,
        LEFT + pw
    );
    let xs_step = step(x_max - x_min);
    let mut x = (x_min / xs_step).ceil() * xs_step;
    while x <= x_max + 1e-9 {
        let px = sx(x);
        let _ = write!(
            o,
            r#"<line class="tick" x1="{px:.1}" y1="{0}" x2="{px:.1}" y2="{1}" stroke="dimgray"/><text x="{px:.1}" y="{2}" text-anchor="middle">{3}</text>"#,
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 18.0,
            label(x)
        );
        x += xs_step;
    }
    let mut axis = |max: f64, right: bool| {
        let st = step(max);
        let mut y = 0.0;
        while y <= max + 1e-9 {
            let py = sy(y, max);
            let (x0, x1, tx, anchor) = if right {
                (LEFT + pw, LEFT + pw + 5.0, LEFT + pw + 8.0, "start")
            } else {
                (LEFT - 5.0, LEFT, LEFT - 8.0, "end")
            };
            let _ = write!(
                o,
                r#"<line class="tick" x1="{x0}" y1="{py:.1}" x2="{x1}" y2="{py:.1}" stroke="dimgray"/><text x="{tx}" y="{:.1}" text-anchor="{anchor}">{}</text>"#,
                py + 4.0,
                label(y)
            );
            y += st;
        }
    };
    axis(y_max, false);
    if y2_label.is_some() {
        axis(y2_max, true);
    }
    let _ = write!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 10.0,
        esc(x_label)
    );
    let _ = write!(
        o,
        r#"<text transform="translate(16 {0}) rotate(-90)" text-anchor="middle">{1}</text>"#,
        TOP + ph / 2.0,
        esc(y_label)
    );
    if let Some(l) = y2_label {
        let _ = write!(
            o,
            r#"<text transform="translate({0} {1}) rotate(90)" text-anchor="middle">{2}</text>"#,
            W - 14.0,
            TOP + ph / 2.0,
            esc(l)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let max = if s.right_axis { y2_max } else { y_max };
        let pts: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y, max)))
            .collect();
        let _ = write!(
            o,
            r#"<polyline class="series" data-series="{}" fill="none" stroke="{color}" stroke-width="1.5" points="{}"/>"#,
            esc(&s.name),
            pts.join(" ")
        );
        let ly = TOP + 14.0 * i as f64;
        let _ = write!(
            o,
            r#"<g class="legend"><line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{2}" y="{3}">{4}</text></g>"#,
            LEFT + 10.0,
            LEFT + 30.0,
            LEFT + 35.0,
            ly + 4.0,
            esc(&s.name)
        );
    }
    o.push_str("</svg>\n");
    o
}

fn series(name: &str, points: Vec<(f64, f64)>, right_axis: bool) -> Series {
    Series {
        name: name.into(),
        points,
        right_axis,
    }
}

/// Aggregate and per-request tok/s against N: the steady-only curve and the production-traffic
/// curve, each without its thin rows (fewer seconds than `--capacity-min-s`).
pub fn capacity(r: &Report) -> String {
    let steady = || {
        r.capacity
            .iter()
            .filter(|c| c.seconds >= r.saturation.capacity_min_s)
    };
    let agg = steady()
        .map(|c| (c.in_flight as f64, c.gen_tok_s.mean))
        .collect();
    let per = steady()
        .map(|c| (c.in_flight as f64, c.per_request_tok_s.avg))
        .collect();
    let prod = |f: fn(&crate::meter::levels::ProductionRow) -> Option<f64>| {
        r.capacity_production
            .iter()
            .filter_map(|c| f(c).map(|v| (c.in_flight as f64, v)))
            .collect()
    };
    chart(
        "Capacity curve (steady seconds; production traffic; thin levels left out)",
        "requests in flight (N)",
        "tokens/s",
        None,
        &[
            series("aggregate tok/s", agg, false),
            series("per-request tok/s", per, false),
            series("production aggregate tok/s", prod(|c| c.gen_tok_s), false),
            series(
                "production per-request tok/s",
                prod(|c| c.per_request_tok_s.avg),
                false,
            ),
        ],
    )
}

/// TTFT p50 and p90 against the arrival level.
pub fn ttft(r: &Report) -> String {
    let pick = |f: fn(&super::report::SaturationLevel) -> Option<f64>| {
        r.saturation
            .levels
            .iter()
            .filter_map(|l| f(l).map(|v| (l.in_flight as f64, v)))
            .collect()
    };
    chart(
        "TTFT vs concurrency at arrival",
        "requests in flight at arrival",
        "TTFT ms",
        None,
        &[
            series("ttft p50", pick(|l| l.ttft_ms.p50), false),
            series("ttft p90", pick(|l| l.ttft_ms.p90), false),
        ],
    )
}

/// Generated tokens per second with the mean in-flight level overlaid (right axis).
pub fn timeline(r: &Report) -> String {
    let s = &r.timeline.series;
    let t0 = s.first().map_or(0, |x| x.t);
    let group = s.len().div_ceil(MAX_POINTS).max(1);
    let (mut gen, mut level) = (Vec::new(), Vec::new());
    for chunk in s.chunks(group) {
        let n = chunk.len() as f64;
        let x = (chunk[0].t - t0) as f64;
        gen.push((x, chunk.iter().map(|c| c.gen_tokens).sum::<f64>() / n));
        level.push((x, chunk.iter().map(|c| c.in_flight_mean).sum::<f64>() / n));
    }
    chart(
        "Throughput and concurrency over time",
        &format!(
            "seconds since the first active second{}",
            if group > 1 {
                format!(" (means of {group} s)")
            } else {
                String::new()
            }
        ),
        "generated tokens/s",
        Some("requests in flight"),
        &[
            series("generated tok/s", gen, false),
            series("in flight", level, true),
        ],
    )
}

/// Every plot with its file name.
pub fn all(r: &Report) -> Vec<(&'static str, String)> {
    vec![
        ("service_level.svg", super::svg_service::service_level(r)),
        ("capacity.svg", capacity(r)),
        ("ttft.svg", ttft(r)),
        ("timeline.svg", timeline(r)),
    ]
}
