//! The service-level plot: each level's measured per-request pace (hollow where thin), the
//! decode-step model with its band, the pace bound as the service line, and the headline.

use std::fmt::Write;

use super::report::Report;
use super::svg_parts::{esc, open, step};

const W: f64 = 720.0;
const H: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Per-request tok/s against N on the production-traffic curve, with the service line.
pub fn service_level(r: &Report) -> String {
    let v = &r.service_level;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let line_tok_s = v.objective.min_tok_s();
    let x_max = v
        .levels
        .iter()
        .map(|l| l.in_flight)
        .chain(v.capacity.first_miss)
        .max()
        .unwrap_or(1)
        .max(2) as f64
        + 1.0;
    let measured_max = v
        .levels
        .iter()
        .filter_map(|l| l.per_request_tok_s)
        .fold(line_tok_s, f64::max);
    // The band may be wide where the model extrapolates; the axis follows the data.
    let band_max = v
        .levels
        .iter()
        .filter_map(|l| l.model_band_tok_s.map(|b| b[1]))
        .filter(|y| y.is_finite())
        .fold(0.0f64, f64::max)
        .min(measured_max * 1.5);
    let y_top = measured_max.max(band_max) * 1.15;
    let y_step = step(y_top);
    let y_max = (y_top / y_step).ceil() * y_step;
    let sx = |x: f64| LEFT + x / x_max * pw;
    let sy = |y: f64| TOP + ph - (y / y_max).clamp(0.0, 1.0) * ph;
    let mut o = open(
        W,
        H,
        &format!("Capacity at the service level: {}", v.capacity.text),
    );
    let _ = write!(
        o,
        r#"<g stroke="dimgray"><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{0}"/><line x1="{LEFT}" y1="{0}" x2="{1}" y2="{0}"/></g>"#,
        TOP + ph,
        LEFT + pw
    );
    let x_step = step(x_max).max(1.0);
    let mut x = x_step;
    while x < x_max {
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{x:.0}</text>"#,
            sx(x),
            TOP + ph + 18.0
        );
        x += x_step;
    }
    let mut y = 0.0;
    while y <= y_max + 1e-9 {
        let _ = write!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{y:.0}</text>"#,
            LEFT - 8.0,
            sy(y) + 4.0
        );
        y += y_step;
    }
    let _ = write!(
        o,
        r#"<text x="{}" y="{}" text-anchor="middle">requests in flight (N)</text><text transform="translate(16 {}) rotate(-90)" text-anchor="middle">per-request tok/s</text>"#,
        LEFT + pw / 2.0,
        H - 10.0,
        TOP + ph / 2.0
    );
    // The model's band and line, where there is a model.
    let modelled: Vec<_> = v
        .levels
        .iter()
        .filter_map(|l| {
            Some((
                l.in_flight as f64,
                l.model_per_request_tok_s?,
                l.model_band_tok_s?,
            ))
        })
        .collect();
    if !modelled.is_empty() {
        let upper = modelled
            .iter()
            .map(|(n, _, b)| format!("{:.1},{:.1}", sx(*n), sy(b[1])));
        let lower = modelled
            .iter()
            .rev()
            .map(|(n, _, b)| format!("{:.1},{:.1}", sx(*n), sy(b[0])));
        let _ = write!(
            o,
            r##"<polygon class="model-band" fill="#1f77b4" fill-opacity="0.15" stroke="none" points="{}"/>"##,
            upper.chain(lower).collect::<Vec<_>>().join(" ")
        );
        let _ = write!(
            o,
            r##"<polyline class="series" data-series="model" fill="none" stroke="#1f77b4" stroke-dasharray="4 3" points="{}"/>"##,
            modelled
                .iter()
                .map(|(n, p, _)| format!("{:.1},{:.1}", sx(*n), sy(*p)))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let _ = write!(
        o,
        r##"<line class="service-line" x1="{LEFT}" x2="{0:.1}" y1="{1:.1}" y2="{1:.1}" stroke="#d62728" stroke-dasharray="6 4"/><text x="{0:.1}" y="{2:.1}" text-anchor="end" fill="#d62728">service line: {3:.1} tok/s per request</text>"##,
        LEFT + pw,
        sy(line_tok_s),
        sy(line_tok_s) - 4.0,
        line_tok_s
    );
    if let Some(n) = v.capacity.in_flight.filter(|n| *n > 0) {
        let _ = write!(
            o,
            r##"<line class="headline" x1="{0:.1}" x2="{0:.1}" y1="{TOP}" y2="{1:.1}" stroke="#2ca02c"/><text x="{2:.1}" y="{3:.1}" fill="#2ca02c">{4}</text>"##,
            sx(f64::from(n)),
            TOP + ph,
            sx(f64::from(n)) + 4.0,
            TOP + 12.0,
            esc(&v.capacity.text)
        );
    }
    for l in &v.levels {
        let Some(p) = l.per_request_tok_s else {
            continue;
        };
        let fill = if l.thin { "white" } else { "#1f77b4" };
        let _ = write!(
            o,
            r##"<circle class="level{}" data-n="{}" cx="{:.1}" cy="{:.1}" r="4" fill="{fill}" stroke="#1f77b4"/>"##,
            if l.thin { " thin" } else { "" },
            l.in_flight,
            sx(f64::from(l.in_flight)),
            sy(p)
        );
    }
    let _ = write!(
        o,
        r##"<g class="legend"><circle cx="{0}" cy="{1}" r="4" fill="#1f77b4"/><text x="{2}" y="{3}">measured (hollow: thin)</text><line x1="{4}" x2="{5}" y1="{1}" y2="{1}" stroke="#1f77b4" stroke-dasharray="4 3"/><text x="{6}" y="{3}">model with its 95 % band</text></g>"##,
        LEFT + 14.0,
        TOP + 6.0,
        LEFT + 22.0,
        TOP + 10.0,
        LEFT + 170.0,
        LEFT + 200.0,
        LEFT + 205.0
    );
    o.push_str("</svg>\n");
    o
}
