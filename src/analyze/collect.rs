//! What the passes accumulate. Pass 1 (one accumulator per worker, merged) keeps everything that
//! is order-independent and bounded by seconds, levels and users, and spills a fixed entry per
//! request and its token curve for pass 2; pass 2 reads the spill against the finished timeline
//! (each request's mean in-flight level) and replays the production-traffic curve
//! (`production_sweep.rs`).

use std::collections::{BTreeMap, HashMap};

use crate::clock::UnixNanos;
use crate::dialect::Api;
use crate::meter::histogram::LogHistogram;
use crate::meter::levels::LevelSums;
use crate::meter::service_level::VerdictsByLevel;
use crate::slo::SloConfig;

use super::production_sweep::ProductionSweep;
use super::steady::SecondMix;
use crate::meter::replay::{LevelSweep, ReplayAccumulator};
use crate::meter::timeline::{end_ns, generation_interval, ttft_ns, RateStats};
use crate::record::{Outcome, RequestRecord};
use crate::scrape::ServerSample;
use crate::token_curve;

use super::filter::Filter;
use super::input::TOO_LONG_PLACEHOLDER;
use super::parse::{curve_values, parse_line, scratch_record, BadReason, LeanRecord, Parsed};
use super::report::TokenPlacement;
use super::spill::{decode_verdict, encode_verdict, for_each_by_start, Spill, SpillEntry};

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
    /// Contexts (prompt + completion tokens) of generation requests that reported both.
    pub contexts: Vec<u64>,
}

/// Totals of one generation API.
#[derive(Debug, Clone, Default)]
pub struct ApiAcc {
    /// Generation requests.
    pub requests: u64,
    /// Of those, requests whose outcome counts as an error.
    pub errors: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Per-request `tok_s`.
    pub tok_s: RateStats,
    /// TTFT (cold starts included), ms.
    pub ttft_ms: LogHistogram,
}

impl ApiAcc {
    fn merge(&mut self, o: &ApiAcc) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.prompt_tokens += o.prompt_tokens;
        self.completion_tokens += o.completion_tokens;
        self.tok_s.merge(&o.tok_s);
        self.ttft_ms.merge(&o.ttft_ms);
    }
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
    pub by_outcome: [u64; Outcome::ALL.len()],
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
    /// Generation requests per API.
    pub apis: BTreeMap<Api, ApiAcc>,
    /// Requests per model.
    pub models: HashMap<String, u64>,
    /// Requests without a model.
    pub no_model: u64,
    /// Generation requests per upstream replica named in the lines.
    pub upstreams: BTreeMap<String, u64>,
    /// Per-second accumulation of generation requests.
    pub replay: ReplayAccumulator,
    /// TTFT by `in_flight_at_start`.
    pub arrivals: BTreeMap<u32, ArrivalLevel>,
    /// Cold starts, first [`COLD_STARTS_LISTED`] by arrival.
    pub cold_starts: Vec<ColdStart>,
    /// All cold starts among selected generation requests.
    pub cold_start_count: u64,
    /// `server_sample` lines inside the time filter (unordered until the report sorts them).
    pub server_samples: Vec<ServerSample>,
    /// Judges records logged without a verdict.
    slo: SloConfig,
    /// How the production curve placed the generation requests' tokens.
    pub placement: TokenPlacement,
    /// Agent sessions.
    pub sessions: super::sessions::SessionsAcc,
    scratch: RequestRecord,
    /// The current line's token curve.
    curve: Vec<u32>,
    spill: Option<Spill>,
    spills: Vec<Spill>,
}

impl Default for Pass1 {
    fn default() -> Self {
        Pass1 {
            counts: LineCounts::default(),
            by_outcome: [0; Outcome::ALL.len()],
            generation_requests: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            first_arrival: None,
            last_end: None,
            users: HashMap::new(),
            apis: BTreeMap::new(),
            models: HashMap::new(),
            no_model: 0,
            upstreams: BTreeMap::new(),
            replay: ReplayAccumulator::new(),
            arrivals: BTreeMap::new(),
            cold_starts: Vec::new(),
            cold_start_count: 0,
            server_samples: Vec::new(),
            slo: SloConfig::default(),
            placement: TokenPlacement::default(),
            sessions: Default::default(),
            scratch: scratch_record(),
            curve: Vec::new(),
            spill: None,
            spills: Vec::new(),
        }
    }
}

impl Pass1 {
    fn add(&mut self, r: &LeanRecord<'_>) -> std::io::Result<()> {
        r.fill(&mut self.scratch);
        let outcome_idx = Outcome::ALL
            .iter()
            .position(|o| *o == r.outcome)
            .unwrap_or(0);
        self.by_outcome[outcome_idx] += 1;
        self.prompt_tokens += r.prompt_tokens.unwrap_or(0);
        self.completion_tokens += r.completion_tokens.unwrap_or(0);
        self.first_arrival = Some(self.first_arrival.map_or(r.ts_ns, |t| t.min(r.ts_ns)));
        let end = end_ns(&self.scratch);
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
            return Ok(());
        }
        self.generation_requests += 1;
        self.sessions.add(r, end);
        if let Some(u) = r.upstream.as_deref() {
            match self.upstreams.get_mut(u) {
                Some(n) => *n += 1,
                None => {
                    self.upstreams.insert(u.to_string(), 1);
                }
            }
        }
        user.generation_requests += 1;
        user.completion_tokens += r.completion_tokens.unwrap_or(0);
        if let (Some(p), Some(c)) = (r.prompt_tokens, r.completion_tokens) {
            user.contexts.push(p + c);
        }
        if let Some(v) = r.tok_s {
            user.tok_s.add(v);
        }
        if let Some(t) = r.ttft_ms {
            user.ttft_ms.record(t);
        }
        if let Some(api) = r.api {
            let a = self.apis.entry(api).or_default();
            a.requests += 1;
            a.errors += r.outcome.is_error() as u64;
            a.prompt_tokens += r.prompt_tokens.unwrap_or(0);
            a.completion_tokens += r.completion_tokens.unwrap_or(0);
            if let Some(v) = r.tok_s {
                a.tok_s.add(v);
            }
            if let Some(t) = r.ttft_ms {
                a.ttft_ms.record(t);
            }
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
        self.replay.add(&self.scratch);
        let slo = encode_verdict(self.verdict(r));
        self.curve.clear();
        if let Some(text) = r.token_curve {
            // Checked by the parser.
            curve_values(text, |v| self.curve.push(v));
        }
        // The first token as the meter saw it (the guard's end): the TTFT, to the ns; a line
        // with a curve but no TTFT has its first point, to the ms. (The TTFT, not the rounded
        // point: the guard's cap is twice the longest recent first-token delay, so one rounded
        // delay would move the caps of every non-streamed request after it the same way.)
        let ttft = ttft_ns(&self.scratch);
        let first_token = match (token_curve::first_point(r.ts_ns, &self.curve), ttft) {
            (Some(p), t) => {
                self.placement.token_curve += 1;
                t.unwrap_or(p).min(end)
            }
            (None, Some(t)) => {
                self.placement.spread += 1;
                t
            }
            (None, None) => {
                self.placement.no_first_token += 1;
                0
            }
        };
        if let Some(spill) = self.spill.as_mut() {
            let (gen_from, _) = generation_interval(&self.scratch, end);
            let entry = SpillEntry {
                start: r.ts_ns,
                end,
                tok_s: r.tok_s.unwrap_or(f64::NAN),
                in_flight_at_start: r.in_flight_at_start,
                first_token,
                gen_from,
                completion_tokens: r.completion_tokens.map_or(f64::NAN, |c| c as f64),
                slo,
            };
            spill.push(entry, &self.curve)?;
        }
        Ok(())
    }
}

impl Pass1 {
    /// The record's service-level verdict: as logged, or, for a line written before the verdict
    /// existed, judged here as the proxy would (`scratch` holds the record).
    fn verdict(&self, r: &LeanRecord<'_>) -> Option<crate::slo::Verdict> {
        match r.slo_ok {
            Some(ok) => crate::slo::logged(ok, r.slo_miss),
            None => crate::slo::judge(&self.slo, &self.scratch.slo_input()),
        }
    }
}

/// Per-level min and max of `tok_s`, from pass 2.
pub type LevelTokS = BTreeMap<u32, (f64, f64)>;

/// What pass 2 finds: per-level tok/s extremes and the production-traffic sums.
#[derive(Debug, Clone, Default)]
pub struct Pass2 {
    /// Per-level min and max of `tok_s`.
    pub level_tok_s: LevelTokS,
    /// Service-level verdicts by the request's rounded mean in-flight level.
    pub verdicts: VerdictsByLevel,
    /// Clean and guarded time and tokens per level (the live meter's level attribution).
    pub level_sums: BTreeMap<u32, LevelSums>,
    /// How each second's time spread over levels (for the tolerant steady seconds).
    pub second_mixes: BTreeMap<u64, SecondMix>,
}

impl Pass1 {
    /// An empty accumulator with its own spill file.
    pub fn new(slo: SloConfig) -> std::io::Result<Pass1> {
        Ok(Pass1 {
            spill: Some(Spill::create()?),
            slo,
            ..Pass1::default()
        })
    }

    /// Counts and, when selected, accumulates one line of source `source`.
    pub fn line(
        &mut self,
        source: usize,
        line_no: u64,
        line: &[u8],
        filter: &Filter,
    ) -> std::io::Result<()> {
        self.counts.lines += 1;
        let parsed = if line == TOO_LONG_PLACEHOLDER {
            Parsed::Bad(BadReason::TooLong)
        } else {
            parse_line(line)
        };
        match parsed {
            Parsed::Request(r) => {
                self.counts.request_lines += 1;
                if filter.keeps(&r) {
                    self.add(&r)?;
                } else {
                    self.counts.filtered_out += 1;
                }
            }
            Parsed::Other => {
                self.counts.other_lines += 1;
                if let Some(s) = server_sample_of(line) {
                    let after_from = filter.from.is_none_or(|f| s.ts_ns >= f);
                    if after_from && filter.to.is_none_or(|t| s.ts_ns < t) {
                        self.server_samples.push(s);
                    }
                }
            }
            Parsed::Blank => {}
            Parsed::Bad(reason) => {
                *self.counts.bad.entry(reason).or_default() += 1;
                // Chunks of one worker arrive in reading order, so its first five are its earliest.
                if self.counts.bad_first.len() < BAD_POSITIONS {
                    self.counts.bad_first.push((source, line_no));
                }
            }
        }
        Ok(())
    }

    /// Adds everything `other` accumulated (spill files are kept, each read in pass 2).
    pub fn merge(&mut self, mut other: Pass1) {
        let (c, o) = (&mut self.counts, &mut other.counts);
        c.lines += o.lines;
        c.request_lines += o.request_lines;
        c.other_lines += o.other_lines;
        c.filtered_out += o.filtered_out;
        for (k, v) in &o.bad {
            *c.bad.entry(*k).or_default() += v;
        }
        c.bad_first.append(&mut o.bad_first);
        c.bad_first.sort_unstable();
        c.bad_first.truncate(BAD_POSITIONS);
        c.read_errors.append(&mut o.read_errors);
        for (a, b) in self.by_outcome.iter_mut().zip(other.by_outcome) {
            *a += b;
        }
        self.generation_requests += other.generation_requests;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.first_arrival = min_opt(self.first_arrival, other.first_arrival, u64::min);
        self.last_end = min_opt(self.last_end, other.last_end, u64::max);
        for (name, u) in other.users {
            let mine = self.users.entry(name).or_default();
            mine.requests += u.requests;
            mine.generation_requests += u.generation_requests;
            mine.completion_tokens += u.completion_tokens;
            mine.tok_s.merge(&u.tok_s);
            mine.ttft_ms.merge(&u.ttft_ms);
            let mut contexts = u.contexts;
            mine.contexts.append(&mut contexts);
        }
        for (api, a) in &other.apis {
            self.apis.entry(*api).or_default().merge(a);
        }
        for (m, n) in other.models {
            *self.models.entry(m).or_default() += n;
        }
        self.no_model += other.no_model;
        for (u, n) in other.upstreams {
            *self.upstreams.entry(u).or_default() += n;
        }
        self.replay.merge(std::mem::take(&mut other.replay));
        for (n, a) in other.arrivals {
            let mine = self.arrivals.entry(n).or_default();
            mine.requests += a.requests;
            mine.ttft_ms.merge(&a.ttft_ms);
        }
        self.server_samples.append(&mut other.server_samples);
        self.placement.merge(&other.placement);
        self.sessions.merge(std::mem::take(&mut other.sessions));
        self.cold_starts.append(&mut other.cold_starts);
        self.cold_starts.sort_by_key(|c| c.ts_ns);
        self.cold_starts.truncate(COLD_STARTS_LISTED);
        self.cold_start_count += other.cold_start_count;
        self.spills.extend(other.spill.take());
        self.spills.append(&mut other.spills);
    }

    /// Pass 2: every spilled request, in arrival order, through the exact level sweep (each
    /// `tok_s` is filed under the request's rounded mean in-flight level) and the production
    /// sweep.
    pub fn pass2(&mut self) -> std::io::Result<Pass2> {
        let mut out = LevelTokS::new();
        let mut production = ProductionSweep::new();
        self.spills.extend(self.spill.take());
        let mut verdicts = VerdictsByLevel::new();
        let mut visit = |(tok_s, slo, tokens): (f64, u8, f64), mean: f64| {
            let level = mean.round() as u32;
            let tokens = tokens.is_finite().then_some(tokens as u64);
            verdicts.add(level, decode_verdict(slo), tokens);
            if level > 0 && tok_s.is_finite() {
                let slot = out.entry(level).or_insert((tok_s, tok_s));
                slot.0 = slot.0.min(tok_s);
                slot.1 = slot.1.max(tok_s);
            }
        };
        let mut sweep = LevelSweep::new();
        for_each_by_start(&mut self.spills, |e, curve| {
            production.push(e, curve);
            let payload = (e.tok_s, e.slo, e.completion_tokens);
            sweep.push(e.start, e.end, e.in_flight_at_start, payload, &mut visit);
        })?;
        sweep.finish(&mut visit);
        let (level_sums, second_mixes) = production.finish();
        Ok(Pass2 {
            level_tok_s: out,
            verdicts,
            level_sums,
            second_mixes,
        })
    }
}

fn min_opt(a: Option<u64>, b: Option<u64>, pick: fn(u64, u64) -> u64) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(pick(x, y)),
        (x, y) => x.or(y),
    }
}

/// A `server_sample` line (the cross-check's scrape of vLLM's `/metrics`), if `line` is one.
fn server_sample_of(line: &[u8]) -> Option<ServerSample> {
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    ServerSample::from_json(&v)
}
