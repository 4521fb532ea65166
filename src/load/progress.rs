//! Live progress of a run: events for library callers, and a ticking stderr printer.

use std::io::{IsTerminal, Write};

use super::report::{ClientTick, LevelReport, SustainedReport};
use super::result::RequestResult;

/// Something that happened during a run.
#[derive(Debug)]
pub enum ProgressEvent<'a> {
    /// The warm-up request finished.
    Warmup(&'a RequestResult),
    /// A burst level is running.
    LevelTick {
        /// The level.
        level: usize,
        /// Requests of the level finished.
        done: usize,
        /// Requests of the level in flight.
        in_flight: usize,
        /// Seconds since the level was dispatched.
        elapsed_s: f64,
        /// Streamed content events of the level per second so far (≈ tok/s; 0 if not streaming).
        events_per_s: f64,
    },
    /// A burst level finished.
    LevelDone(&'a LevelReport),
    /// A sustained-run sample.
    SustainedTick(&'a ClientTick),
    /// The sustained run finished.
    SustainedDone(&'a SustainedReport),
}

/// Receives progress events; closures `Fn(&ProgressEvent)` qualify.
pub trait Progress: Send + Sync {
    /// Called for each event, from the task that runs the load.
    fn report(&self, event: &ProgressEvent<'_>);
}

impl<F: Fn(&ProgressEvent<'_>) + Send + Sync> Progress for F {
    fn report(&self, event: &ProgressEvent<'_>) {
        self(event);
    }
}

/// Ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn report(&self, _: &ProgressEvent<'_>) {}
}

/// Prints events to stderr; on a terminal, level ticks rewrite one line.
#[derive(Debug, Clone, Copy)]
pub struct StderrProgress {
    tty: bool,
}

impl Default for StderrProgress {
    fn default() -> Self {
        Self {
            tty: std::io::stderr().is_terminal(),
        }
    }
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

impl Progress for StderrProgress {
    fn report(&self, event: &ProgressEvent<'_>) {
        let mut err = std::io::stderr().lock();
        // Progress output is best effort: a closed stderr must not stop the measurement.
        let _ = match event {
            ProgressEvent::Warmup(r) => writeln!(
                err,
                "warm-up: {} in {:.0} ms ({} tok/s), discarded",
                if r.ok { "ok" } else { "FAILED" },
                r.e2e_ms,
                fmt_opt(r.tok_s, 1)
            ),
            ProgressEvent::LevelTick {
                level,
                done,
                in_flight,
                elapsed_s,
                events_per_s,
            } if self.tty => write!(
                err,
                "\rlevel {level:>3}: {done}/{level} done, {in_flight} in flight, {elapsed_s:.1} s, ~{events_per_s:.1} tok/s   "
            ),
            ProgressEvent::LevelTick { .. } => Ok(()),
            ProgressEvent::LevelDone(l) => writeln!(
                err,
                "{}level {:>3}: {:.2} s, aggregate {} tok/s, per-request avg {} tok/s, {} failed",
                if self.tty { "\r" } else { "" },
                l.level,
                l.wall_s,
                fmt_opt(l.aggregate_tok_s, 1),
                fmt_opt(l.figures.per_request_tok_s.map(|s| s.avg), 1),
                l.figures.failures
            ),
            ProgressEvent::SustainedTick(t) => writeln!(
                err,
                "t={:>6.1} s: {} done, {} in flight, ~{:.1} tok/s (streamed events)",
                t.t_s, t.done, t.in_flight, t.events_per_s
            ),
            ProgressEvent::SustainedDone(s) => writeln!(
                err,
                "sustained: {} completed, {} failed, {} cancelled at deadline",
                s.figures.requests - s.figures.failures,
                s.figures.failures,
                s.cancelled_at_deadline
            ),
        };
    }
}
