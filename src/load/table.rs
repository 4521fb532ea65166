//! Human-readable markdown tables of a load report.

use std::fmt::Write;

use super::report::{BurstReport, LoadReport, RequestFigures, SustainedReport};
use super::stats::ProxyReport;
use super::summary::MinAvgMax;

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "n/a".into(), |v| format!("{v:.digits$}"))
}

fn mam(s: Option<MinAvgMax>, digits: usize) -> String {
    s.map_or_else(
        || "n/a".into(),
        |s| format!("{:.d$} / {:.d$} / {:.d$}", s.min, s.avg, s.max, d = digits),
    )
}

/// "+113% for 4× users".
fn marginal(pct: Option<f64>, users: Option<f64>) -> String {
    match (pct, users) {
        (Some(p), Some(u)) => {
            let users = format!("{u:.3}");
            let users = users.trim_end_matches('0').trim_end_matches('.');
            format!("{p:+.0}% for {users}× users")
        }
        _ => "–".into(),
    }
}

/// The whole report as text for stdout.
pub fn render(r: &LoadReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Target {} · model {} · {} · max_tokens {}{}",
        r.base_url,
        r.model,
        if r.stream {
            "streaming"
        } else {
            "non-streaming"
        },
        r.max_tokens,
        if r.ignore_eos { " · ignore_eos" } else { "" }
    );
    if let Some(b) = &r.burst {
        burst(&mut out, b);
    }
    if let Some(s) = &r.sustained {
        sustained(&mut out, s, r.proxy.as_ref());
    }
    out
}

fn burst(out: &mut String, b: &BurstReport) {
    let w = &b.warmup;
    let _ = writeln!(
        out,
        "\nWarm-up (discarded): {} in {:.0} ms, {} tok/s\n",
        if w.ok { "ok" } else { "failed" },
        w.e2e_ms,
        num(w.tok_s, 1)
    );
    let first = b.levels.first().map_or(1, |l| l.level);
    let _ = writeln!(
        out,
        "| Concurrency | Aggregate | Per-request tok/s (min/avg/max) | TTFT ms (min/avg/max) | Wall | Scaling vs {first} | Marginal gain | Failed |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for l in &b.levels {
        let _ = writeln!(
            out,
            "| {} | {} tok/s | {} | {} | {:.2} s | {} | {} | {}/{} |",
            l.level,
            num(l.aggregate_tok_s, 1),
            mam(l.figures.per_request_tok_s, 1),
            mam(l.figures.ttft_ms, 0),
            l.wall_s,
            l.scaling_vs_first
                .map_or_else(|| "n/a".into(), |s| format!("{s:.2}×")),
            marginal(l.marginal_gain_pct, l.users_ratio),
            l.figures.failures,
            l.figures.requests
        );
    }
    let _ = writeln!(
        out,
        "\nAggregate = completion tokens of ok requests / batch wall; per-request = completion tokens / that request's wall; \
         TTFT = send to first event with non-empty choices."
    );
    for l in &b.levels {
        notes(out, &format!("level {}", l.level), &l.figures);
        for f in l.results.iter().filter(|r| !r.ok) {
            let _ = writeln!(
                out,
                "  level {} slot {}: status {} — {}",
                l.level,
                f.slot,
                f.status.map_or_else(|| "none".into(), |s| s.to_string()),
                f.error.as_deref().unwrap_or("")
            );
        }
    }
}

fn notes(out: &mut String, what: &str, f: &RequestFigures) {
    if f.tokens_counted_from_events {
        let _ = writeln!(out, "  {what}: no usage from the server; tokens counted from streamed events (may undercount)");
    }
    if f.tokens_unknown {
        let _ = writeln!(
            out,
            "  {what}: some ok requests had no token count and are left out of the sums"
        );
    }
}

fn sustained(out: &mut String, s: &SustainedReport, proxy: Option<&ProxyReport>) {
    let f = &s.figures;
    let _ = writeln!(
        out,
        "\nSustained: {} in flight for {:.1} s (wall {:.2} s){}\n",
        s.concurrency,
        s.duration_s,
        s.wall_s,
        s.stopped_early
            .as_ref()
            .map_or_else(String::new, |w| format!(" — STOPPED EARLY: {w}"))
    );
    let _ = writeln!(out, "| Figure | Value |\n|---|---|");
    let rows = [
        (
            "Client aggregate (completed tokens / wall)",
            format!("{} tok/s", num(s.client_aggregate_tok_s, 1)),
        ),
        (
            "Client aggregate incl. cancelled requests' streamed events",
            format!("{} tok/s", num(s.client_aggregate_incl_partial_tok_s, 1)),
        ),
        (
            "Per-request tok/s (min/avg/max)",
            mam(f.per_request_tok_s, 1),
        ),
        ("TTFT ms (min/avg/max)", mam(f.ttft_ms, 0)),
        ("Request wall ms (min/avg/max)", mam(f.e2e_ms, 0)),
        (
            "Completed ok / failed / cancelled at deadline",
            format!(
                "{} / {} / {}",
                f.requests - f.failures,
                f.failures,
                s.cancelled_at_deadline
            ),
        ),
        ("Max in flight (client)", s.max_in_flight.to_string()),
    ];
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    notes(out, "sustained", f);
    let Some(p) = proxy else { return };
    let _ = writeln!(out, "\n{}", p.note);
    if !p.detected {
        return;
    }
    let _ = writeln!(out, "\n| t (s) | Proxy 10 s window gen tok/s | Steady | In flight min/max/mean |\n|---|---|---|---|");
    for smp in &p.samples {
        let w = smp.window_10s.as_ref();
        let inf = w.and_then(|w| w.in_flight);
        let _ = writeln!(
            out,
            "| {:.1} | {} | {} | {} / {} / {} |",
            smp.t_s,
            num(w.and_then(|w| w.gen_tok_s), 1),
            w.and_then(|w| w.steady)
                .map_or("n/a", |b| if b { "yes" } else { "no" }),
            num(inf.and_then(|i| i.min), 0),
            num(inf.and_then(|i| i.max), 0),
            num(inf.and_then(|i| i.mean), 1),
        );
    }
    match &p.steady_10s {
        Some(st) => {
            let _ = writeln!(
                out,
                "\nProxy steady 10 s windows: {} tok/s avg over {} (spread {}%) — client aggregate {} tok/s. \
                 The steady windows are the stable number.",
                num(Some(st.gen_tok_s.avg), 1),
                st.gen_tok_s.n,
                num(st.spread_pct, 1),
                num(s.client_aggregate_tok_s, 1)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "\nProxy reported no steady 10 s window during the run."
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marginal_reads_like_the_write_up() {
        assert_eq!(marginal(Some(113.2), Some(4.0)), "+113% for 4× users");
        assert_eq!(marginal(Some(-3.0), Some(2.0)), "-3% for 2× users");
        assert_eq!(marginal(Some(10.0), Some(1.5)), "+10% for 1.5× users");
        assert_eq!(marginal(Some(1.0), Some(10.0)), "+1% for 10× users");
        assert_eq!(marginal(None, Some(2.0)), "–");
    }
}
