//! The two passes over the inputs. Pass 1 accumulates everything that is order-independent and
//! bounded by seconds, levels and users; pass 2 needs the finished timeline (each request's mean
//! in-flight level) and only keeps per-level min/max tok/s.

use std::collections::{BTreeMap, HashMap};

use crate::clock::UnixNanos;
use crate::meter::histogram::LogHistogram;
use crate::meter::replay::{ReplayAccumulator, ReplayTimeline};
use crate::meter::timeline::RateStats;
use crate::record::{Outcome, RequestRecord};

use super::filter::Filter;
use super::input::{Line, LineReader, Source};
use super::parse::{parse_line, scratch_record, BadReason, LeanRecord, Parsed};

/// How many bad-line positions the report names.
pub const BAD_POSITIONS: usize = 5;
/// How many cold starts are listed individually (all are counted).
pub const COLD_STARTS_LISTED: usize = 1000;

/// Line counts of the inputs.
#[derive(Debug, Clone, Default)]
pub struct LineCounts {
    /// Lines read, blank ones included.
    pub lines: u64,
    /// Valid request lines (before filtering).
    pub request_lines: u64,
    /// JSON lines of another `type`.
    pub other_lines: u64,
    /// Request lines the filters left out.
    pub filtered_out: u64,
    /// Bad lines by reason.
    pub bad: BTreeMap<BadReason, u64>,
    /// First bad lines as (input index, line number).
    pub bad_first: Vec<(usize, u64)>,
    /// Inputs that could not be read to the end, with the error.
    pub read_errors: Vec<(usize, String)>,
}

/// Per-user totals (generation figures over generation requests only).
#[derive(Debug, Clone, Default)]
pub struct UserAcc {
    /// Requests of any path.
    pub requests: u64,
    /// Generation requests.
    pub generation_requests: u64,
    /// Completion tokens of generation requests.
    pub completion_tokens: u64,
    /// `tok_s` of generation requests.
    pub tok_s: RateStats,
    /// TTFT of generation requests (cold starts included: it is what the user saw).
    pub ttft_ms: LogHistogram,
}

/// TTFT at one arrival level.
#[derive(Debug, Clone, Default)]
pub struct ArrivalLevel {
    /// Generation requests that arrived at this level.
    pub requests: u64,
    /// Their TTFT, cold starts excluded.
    pub ttft_ms: LogHistogram,
}

/// One cold-start request.
#[derive(Debug, Clone, PartialEq)]
pub struct ColdStart {
    /// Arrival, Unix ns.
    pub ts_ns: UnixNanos,
    /// Who sent it.
    pub user: String,
    /// TTFT, ms.
    pub ttft_ms: Option<f64>,
    /// End-to-end latency, ms.
    pub e2e_ms: Option<f64>,
}

/// Everything pass 1 accumulates.
#[derive(Debug)]
pub struct Pass1 {
    /// Line counts.
    pub counts: LineCounts,
    /// Selected requests by outcome, in [`Outcome::ALL`] order.
    pub by_outcome: [u64; 6],
    /// Selected generation requests.
    pub generation_requests: u64,
    /// Sum of prompt tokens of selected requests.
    pub prompt_tokens: u64,
    /// Sum of completion tokens of selected requests.
    pub completion_tokens: u64,
    /// Earliest arrival.
    pub first_arrival: Option<UnixNanos>,
    /// Latest end.
    pub last_end: Option<UnixNanos>,
    /// Per-user totals.
    pub users: HashMap<String, UserAcc>,
    /// Requests per model.
    pub models: HashMap<String, u64>,
    /// Requests without a model.
    pub no_model: u64,
    /// Per-second accumulation of generation requests.
    pub replay: ReplayAccumulator,
    /// TTFT by `in_flight_at_start`.
    pub arrivals: BTreeMap<u32, ArrivalLevel>,
    /// Cold starts, first [`COLD_STARTS_LISTED`] by arrival.
    pub cold_starts: Vec<ColdStart>,
    /// All cold starts among selected generation requests.
    pub cold_start_count: u64,
    scratch: RequestRecord,
}

impl Default for Pass1 {
    fn default() -> Self {
        Pass1 {
            counts: LineCounts::default(),
            by_outcome: [0; 6],
            generation_requests: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            first_arrival: None,
            last_end: None,
            users: HashMap::new(),
            models: HashMap::new(),
            no_model: 0,
            replay: ReplayAccumulator::new(),
            arrivals: BTreeMap::new(),
            cold_starts: Vec::new(),
            cold_start_count: 0,
            scratch: scratch_record(),
        }
    }
}

impl Pass1 {
    fn add(&mut self, r: &LeanRecord<'_>) {
        let outcome_idx = Outcome::ALL.iter().position(|o| *o == r.outcome).unwrap_or(0);
        self.by_outcome[outcome_idx] += 1;
        self.prompt_tokens += r.prompt_tokens.unwrap_or(0);
        self.completion_tokens += r.completion_tokens.unwrap_or(0);
        self.first_arrival = Some(self.first_arrival.map_or(r.ts_ns, |t| t.min(r.ts_ns)));
        let end = r.end_ns();
        self.last_end = Some(self.last_end.map_or(end, |t| t.max(end)));
        let user = match self.users.get_mut(r.user.as_ref()) {
            Some(u) => u,
            None => self.users.entry(r.user.to_string()).or_default(),
        };
        user.requests += 1;
        match r.model.as_deref() {
            None => self.no_model += 1,
            Some(m) => match self.models.get_mut(m) {
                Some(n) => *n += 1,
                None => {
                    self.models.insert(m.to_string(), 1);
                }
            },
        }
        if !r.generation {
            return;
        }
        self.generation_requests += 1;
        user.generation_requests += 1;
        user.completion_tokens += r.completion_tokens.unwrap_or(0);
        if let Some(v) = r.tok_s {
            user.tok_s.add(v);
        }
        if let Some(t) = r.ttft_ms {
            user.ttft_ms.record(t);
        }
        let level = self.arrivals.entry(r.in_flight_at_start).or_default();
        level.requests += 1;
        if let (Some(t), false) = (r.ttft_ms, r.cold_start) {
            level.ttft_ms.record(t);
        }
        if r.cold_start {
            self.cold_start_count += 1;
            self.cold_starts.push(ColdStart {
                ts_ns: r.ts_ns,
                user: r.user.to_string(),
                ttft_ms: r.ttft_ms,
                e2e_ms: r.e2e_ms,
            });
            // Keep the earliest ones whatever the input order, in bounded memory.
            if self.cold_starts.len() > 2 * COLD_STARTS_LISTED {
                self.cold_starts.sort_by_key(|c| c.ts_ns);
                self.cold_starts.truncate(COLD_STARTS_LISTED);
            }
        }
        r.fill(&mut self.scratch);
        self.replay.add(&self.scratch);
    }
}

/// Per-level min and max of `tok_s`, from pass 2.
pub type LevelTokS = BTreeMap<u32, (f64, f64)>;

/// Reads every line of every source, calling `visit(source index, line number, parsed)` for the
/// selected request lines and counting the rest.
fn each_line(
    sources: &[Source],
    filter: &Filter,
    counts: &mut LineCounts,
    visit: &mut dyn FnMut(&LeanRecord<'_>),
) {
    for (idx, source) in sources.iter().enumerate() {
        let reader = match source.reader() {
            Ok(r) => r,
            Err(e) => {
                counts.read_errors.push((idx, e.to_string()));
                continue;
            }
        };
        let mut lines = LineReader::new(reader);
        loop {
            let (line_no, line) = match lines.next_line() {
                Ok(Some(l)) => l,
                Ok(None) => break,
                Err(e) => {
                    counts.read_errors.push((idx, e.to_string()));
                    break;
                }
            };
            counts.lines += 1;
            let parsed = match line {
                Line::Text(t) => parse_line(t),
                Line::TooLong => Parsed::Bad(BadReason::TooLong),
            };
            match parsed {
                Parsed::Request(r) => {
                    counts.request_lines += 1;
                    if filter.keeps(&r) {
                        visit(&r);
                    } else {
                        counts.filtered_out += 1;
                    }
                }
                Parsed::Other => counts.other_lines += 1,
                Parsed::Blank => {}
                Parsed::Bad(reason) => {
                    *counts.bad.entry(reason).or_default() += 1;
                    if counts.bad_first.len() < BAD_POSITIONS {
                        counts.bad_first.push((idx, line_no));
                    }
                }
            }
        }
    }
}

/// Pass 1 over all sources.
pub fn pass1(sources: &[Source], filter: &Filter) -> Pass1 {
    let mut p = Pass1::default();
    let mut counts = LineCounts::default();
    each_line(sources, filter, &mut counts, &mut |r| p.add(r));
    p.counts = counts;
    p.cold_starts.sort_by_key(|c| c.ts_ns);
    p.cold_starts.truncate(COLD_STARTS_LISTED);
    p
}

/// Pass 2: each selected generation request's `tok_s` filed under its rounded mean level.
pub fn pass2(sources: &[Source], filter: &Filter, timeline: &ReplayTimeline) -> LevelTokS {
    let mut out = LevelTokS::new();
    let mut counts = LineCounts::default();
    each_line(sources, filter, &mut counts, &mut |r| {
        let Some(v) = r.tok_s.filter(|_| r.generation) else {
            return;
        };
        let mean = timeline.request_mean_level(r.ts_ns, r.end_ns(), r.in_flight_at_start);
        let level = mean.round() as u32;
        if level == 0 {
            return;
        }
        let e = out.entry(level).or_insert((v, v));
        e.0 = e.0.min(v);
        e.1 = e.1.max(v);
    });
    out
}
