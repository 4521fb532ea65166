//! Prometheus text exposition (format 0.0.4) of the proxy's own measurements: the counters and
//! histograms of generation requests, each declared once here ([`Metric`]); the meter's gauges
//! are in [`super::gauges`], the access-log, scrape, build and process series in
//! [`super::self_metrics`].
//!
//! Every metric is prefixed `tokenmeter_` rather than reusing vLLM's `vllm:` names: a dashboard
//! scraping both the proxy and the server must be able to tell the client-side view (network,
//! queueing in front of the server, client aborts included) from the server's own, and names
//! that look alike but measure different things would silently mix in a query. Histogram
//! bucket bounds follow the shape of vLLM's so the two can be compared bucket by bucket.
//!
//! Labels are bounded: `model` (at most [`MAX_TRACKED_MODELS`] names, then `"other"`), `api`
//! (the four generation APIs, on the counters of finished requests), `outcome` (seven values),
//! `status` (five classes) and, only with `metrics_user_label`, `user` on the counters (at most
//! `max_tracked_users` names ever, then `"other"`; histograms never carry `user`). The live
//! token counters carry `model` (and `user`) only: they are fed from the request's start, before
//! the record that names its API exists. Only generation requests are counted. Series never
//! disappear, so counters stay monotonic.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::dialect::Api;
use crate::exposition::{Metric, Style, Text, Unit, REQUEST_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS};
use crate::itl::VLLM_ITL_BOUNDS_S;
use crate::record::{Outcome, RequestRecord};

use super::labels::{MAX_TRACKED_MODELS, OTHER, UNKNOWN_MODEL};

/// Finished generation requests.
pub const REQUESTS_TOTAL: Metric = Metric::counter(
    "tokenmeter_requests_total",
    "Generation requests finished, by outcome and class of the status sent to the client.",
    Unit::Count("{request}"),
    &["model", "api", "user", "outcome", "status"],
);

/// Generated tokens, live.
pub const GENERATION_TOKENS_TOTAL: Metric = Metric::counter(
    "tokenmeter_generation_tokens_total",
    "Generated tokens as they stream past the proxy, settled to usage when each request ends \
     (compare with vllm:generation_tokens_total).",
    Unit::Count("{token}"),
    &["model", "user"],
);

/// Prompt tokens, live.
pub const PROMPT_TOKENS_TOTAL: Metric = Metric::counter(
    "tokenmeter_prompt_tokens_total",
    "Prompt tokens, from the first output event once a usage gave them, else from the final \
     usage (compare with vllm:prompt_tokens_total).",
    Unit::Count("{token}"),
    &["model", "user"],
);

/// Completion tokens of finished requests.
pub const COMPLETION_TOKENS_TOTAL: Metric = Metric::counter(
    "tokenmeter_completion_tokens_total",
    "Completion tokens counted when requests finish (usage, else counted); moves in steps at \
     each request's end: for rates use tokenmeter_generation_tokens_total.",
    Unit::Count("{token}"),
    &["model", "api", "user"],
);

/// TTFT.
pub const TIME_TO_FIRST_TOKEN_SECONDS: Metric = Metric::histogram(
    "tokenmeter_time_to_first_token_seconds",
    "Arrival to first content event, seconds.",
    Unit::Seconds,
    &["model"],
    TTFT_BUCKETS,
);

/// TPOT.
pub const TIME_PER_OUTPUT_TOKEN_SECONDS: Metric = Metric::histogram(
    "tokenmeter_time_per_output_token_seconds",
    "(e2e - ttft) / (completion_tokens - 1), seconds.",
    Unit::Seconds,
    &["model"],
    TPOT_BUCKETS,
);

/// End-to-end latency.
pub const E2E_REQUEST_LATENCY_SECONDS: Metric = Metric::histogram(
    "tokenmeter_e2e_request_latency_seconds",
    "Arrival to last byte sent to the client, seconds.",
    Unit::Seconds,
    &["model"],
    REQUEST_BUCKETS,
);

/// Time to the upstream's first byte: the TTFT bounds (the first byte usually comes with the
/// response headers, long before the first token, so the low end matters as much).
pub const FIRST_BYTE_SECONDS: Metric = Metric::histogram(
    "tokenmeter_first_byte_seconds",
    "Arrival to the first response byte from the upstream, seconds.",
    Unit::Seconds,
    &["model"],
    TTFT_BUCKETS,
);

/// Inter-token latency, on vLLM's bounds.
pub const INTER_TOKEN_LATENCY_SECONDS: Metric = Metric::histogram(
    "tokenmeter_inter_token_latency_seconds",
    "Gaps between output-carrying events (vllm bench serve's ITL), seconds; vLLM's bounds.",
    Unit::Seconds,
    &["model"],
    &VLLM_ITL_BOUNDS_S,
);

/// The per-model histograms in the order they are written; [`Hists`] holds one of each, at the
/// same index.
const HISTOGRAMS: [&Metric; 5] = [
    &TIME_TO_FIRST_TOKEN_SECONDS,
    &TIME_PER_OUTPUT_TOKEN_SECONDS,
    &E2E_REQUEST_LATENCY_SECONDS,
    &FIRST_BYTE_SECONDS,
    &INTER_TOKEN_LATENCY_SECONDS,
];
const TTFT: usize = 0;
const TPOT: usize = 1;
const E2E: usize = 2;
const FIRST_BYTE: usize = 3;
const ITL: usize = 4;

/// Values of the `status` label: the class of the status sent to the client, `none` when none
/// was sent (the client left first, or the proxy failed before an answer).
pub const STATUS_CLASSES: [&str; 5] = ["2xx", "3xx", "4xx", "5xx", "none"];

/// Index into [`STATUS_CLASSES`] of a status.
pub fn status_class(status: Option<u16>) -> usize {
    match status {
        Some(200..=299) => 0,
        Some(300..=399) => 1,
        Some(400..=499) => 2,
        Some(500..=599) => 3,
        // 1xx or out-of-range codes are not final answers the client acted on.
        _ => 4,
    }
}

/// A cumulative-on-render histogram with fixed bounds.
#[derive(Debug, Clone)]
struct FixedHist {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl FixedHist {
    fn new(bounds: &[f64]) -> Self {
        FixedHist {
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, bounds: &[f64], v: f64) {
        if !v.is_finite() || v < 0.0 {
            return;
        }
        if let Some(i) = bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }
}

/// A counter fed live (from streamed events) and corrected to the exact total at the end of
/// each request. A correction downwards cannot be shown (a counter never decreases), so it is
/// held as `debt` and paid from the next increments: the counter then briefly runs ahead of
/// the exact total, never behind the live count, and meets the exact total again.
#[derive(Debug, Clone, Copy, Default)]
struct LiveCounter {
    value: u64,
    debt: u64,
}

impl LiveCounter {
    fn add(&mut self, n: u64) {
        let paid = n.min(self.debt);
        self.debt -= paid;
        self.value += n - paid;
    }

    /// The request whose live increments summed to `live` ended with the exact count `exact`.
    fn settle(&mut self, live: u64, exact: u64) {
        if exact >= live {
            self.add(exact - live);
        } else {
            self.debt += live - exact;
        }
    }
}

/// The live counters of one `(model, user)` label set.
#[derive(Debug, Clone, Default)]
struct Counters {
    /// Prompt tokens: at the first streamed usage that carries them, else at the end.
    prompt: LiveCounter,
    /// Generated tokens, as they stream.
    generation: LiveCounter,
}

/// The counters of finished requests of one `(model, api, user)` label set.
#[derive(Debug, Clone, Default)]
struct Finished {
    /// Finished requests by outcome and status class.
    outcomes: [[u64; 5]; Outcome::ALL.len()],
    /// Completion tokens counted when requests finish (the exposition before live counting).
    completion: u64,
}

/// Series key of the counters of finished requests: model, API, and the user when the user
/// label is on.
type FinishedKey = (Arc<str>, Api, Option<Arc<str>>);

/// One model's histograms, by their index in [`HISTOGRAMS`].
#[derive(Debug, Clone)]
struct Hists([FixedHist; 5]);

/// A label set's place in [`PromState`]: open requests keep it so a streamed event costs one
/// indexed add, no string hashing.
pub type Slot = usize;

/// The counters and histograms behind the meter's Prometheus exposition.
#[derive(Debug)]
pub struct PromState {
    user_label: bool,
    max_users: usize,
    models: HashSet<Arc<str>>,
    users: HashSet<Arc<str>>,
    slots: HashMap<(Arc<str>, Option<Arc<str>>), Slot>,
    keys: Vec<(Arc<str>, Option<Arc<str>>)>,
    counters: Vec<Counters>,
    finished: HashMap<FinishedKey, Finished>,
    /// The latency histograms per model, in order of their first observation.
    hists: Vec<(Arc<str>, Hists)>,
    /// A model's place in `hists`.
    hist_index: HashMap<Arc<str>, usize>,
    /// A counters slot's place in `hists`, once it observed one: the per-event observations
    /// (first token, ITL gaps) index it instead of hashing the model's name.
    slot_hists: Vec<Option<usize>>,
    sessions: super::session_metrics::SessionSeries,
}

fn bounded(set: &mut HashSet<Arc<str>>, name: &str, cap: usize) -> Arc<str> {
    if let Some(k) = set.get(name) {
        return k.clone();
    }
    if set.len() >= cap {
        if let Some(k) = set.get(OTHER) {
            return k.clone();
        }
    }
    // `other` itself takes a place only once the cap is reached (or when a user is so named).
    let key: Arc<str> = Arc::from(if set.len() < cap { name } else { OTHER });
    set.insert(key.clone());
    key
}

impl PromState {
    /// Observes an agent turn's wait once the turn closed (`meter::sessions`), ms.
    pub fn turn_closed(&mut self, wait_ms: f64) {
        self.sessions.turn_closed(wait_ms);
    }

    /// Empty state; `user_label` adds a `user` label to counters, at most `max_users` names.
    pub fn new(user_label: bool, max_users: usize) -> Self {
        PromState {
            user_label,
            max_users,
            models: HashSet::new(),
            users: HashSet::new(),
            slots: HashMap::new(),
            keys: Vec::new(),
            counters: Vec::new(),
            finished: HashMap::new(),
            hists: Vec::new(),
            hist_index: HashMap::new(),
            slot_hists: Vec::new(),
            sessions: Default::default(),
        }
    }

    /// The counters' place for requests of `user` for `model` (created on first use, names
    /// beyond the caps folded into `"other"`).
    pub fn slot(&mut self, model: Option<&str>, user: &str) -> Slot {
        let model = bounded(
            &mut self.models,
            model.unwrap_or(UNKNOWN_MODEL),
            MAX_TRACKED_MODELS,
        );
        let user = self
            .user_label
            .then(|| bounded(&mut self.users, user, self.max_users));
        let key = (model, user);
        if let Some(s) = self.slots.get(&key) {
            return *s;
        }
        let s = self.counters.len();
        self.counters.push(Counters::default());
        self.slot_hists.push(None);
        self.keys.push(key.clone());
        self.slots.insert(key, s);
        s
    }

    /// `n` completion tokens of an open request in `slot` streamed past the proxy.
    #[inline]
    pub fn generated(&mut self, slot: Slot, n: u64) {
        if let Some(c) = self.counters.get_mut(slot) {
            c.generation.add(n);
        }
    }

    /// An open request in `slot` reported its prompt size before its end.
    pub fn prompt_seen(&mut self, slot: Slot, n: u64) {
        if let Some(c) = self.counters.get_mut(slot) {
            c.prompt.add(n);
        }
    }

    /// The histograms of `slot`'s model (created with its first observation).
    fn hists_of(&mut self, slot: Slot) -> Option<&mut Hists> {
        let i = match *self.slot_hists.get(slot)? {
            Some(i) => i,
            None => {
                let model = self.keys.get(slot)?.0.clone();
                let i = self.hists_index(model);
                self.slot_hists[slot] = Some(i);
                i
            }
        };
        self.hists.get_mut(i).map(|(_, h)| h)
    }

    /// The place of `model`'s histograms in `hists` (created with its first observation).
    fn hists_index(&mut self, model: Arc<str>) -> usize {
        if let Some(i) = self.hist_index.get(&model) {
            return *i;
        }
        let i = self.hists.len();
        let h = Hists(HISTOGRAMS.map(|m| FixedHist::new(m.buckets)));
        self.hists.push((model.clone(), h));
        self.hist_index.insert(model, i);
        i
    }

    /// An open request of `slot` passed its first token `ttft_s` seconds after it started: its
    /// TTFT is observed now, as vLLM observes `time_to_first_token_seconds`, not at its end.
    pub fn first_token(&mut self, slot: Slot, ttft_s: f64) {
        if let Some(h) = self.hists_of(slot) {
            h.0[TTFT].observe(HISTOGRAMS[TTFT].buckets, ttft_s);
        }
    }

    /// An open request of `slot` passed ITL `gaps` (one vLLM bucket): observed now, as vLLM
    /// observes `inter_token_latency_seconds`; exact counts per bucket and sum.
    pub fn gaps(&mut self, slot: Slot, gaps: crate::itl::Gaps) {
        if let Some(h) = self.hists_of(slot) {
            let h = &mut h.0[ITL];
            if let Some(c) = h.counts.get_mut(usize::from(gaps.bucket)) {
                *c += u64::from(gaps.count);
            }
            h.count += u64::from(gaps.count);
            h.sum += gaps.sum_ns as f64 / 1e9;
        }
    }

    /// Counts a finished generation request of `slot`, whose streamed events already added
    /// `live_completion` generated and `live_prompt` prompt tokens: the counters are settled to
    /// the record's counts (usage, else the tokens counted). `ttft_live`, `itl_live`: its TTFT
    /// and ITL gaps were observed as they passed ([`PromState::first_token`],
    /// [`PromState::gaps`]) and are not observed again.
    pub fn add_record(
        &mut self,
        slot: Slot,
        r: &RequestRecord,
        (live_completion, live_prompt): (u64, u64),
        (ttft_live, itl_live): (bool, bool),
    ) {
        self.sessions.add_record(r);
        let Some(c) = self.counters.get_mut(slot) else {
            return;
        };
        let completion = r.completion_tokens.unwrap_or(0);
        c.generation.settle(live_completion, completion);
        c.prompt
            .settle(live_prompt, r.prompt_tokens.unwrap_or(live_prompt));
        let (model, user) = self.keys[slot].clone();
        // Only generation requests reach here; a record read back without `api` is known by its
        // path.
        let api = r
            .api
            .or_else(|| crate::dialect::detect(&r.path))
            .unwrap_or(Api::Chat);
        let f = self.finished.entry((model.clone(), api, user)).or_default();
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == r.outcome) {
            f.outcomes[i][status_class(r.status)] += 1;
        }
        f.completion += completion;
        let i = self.hists_index(model);
        let h = &mut self.hists[i].1;
        if let Some(itl) = r.itl.as_ref().filter(|_| !itl_live) {
            // The request's own counts per vLLM bucket: exact, no re-binning.
            let h = &mut h.0[ITL];
            for (slot, n) in h.counts.iter_mut().zip(itl.vllm_buckets().iter()) {
                *slot += u64::from(*n);
            }
            h.count += u64::from(itl.count());
            h.sum += itl.sum_s();
        }
        for (i, ms) in [
            (TTFT, r.ttft_ms.filter(|_| !ttft_live)),
            (TPOT, r.tpot_ms),
            (E2E, r.e2e_ms),
            (FIRST_BYTE, r.first_byte_ms),
        ] {
            if let Some(ms) = ms {
                h.0[i].observe(HISTOGRAMS[i].buckets, ms / 1e3);
            }
        }
    }

    /// Appends the exposition of the counters and histograms (the meter's gauges follow them:
    /// [`super::gauges`]).
    pub fn render(&self, out: &mut String) {
        let mut w = Text::new(out, Style::Native);
        let mut order: Vec<Slot> = (0..self.keys.len()).collect();
        order.sort_by(|a, b| self.keys[*a].cmp(&self.keys[*b]));
        let mut fkeys: Vec<&FinishedKey> = self.finished.keys().collect();
        fkeys.sort();
        let m = &REQUESTS_TOTAL;
        w.header(m);
        for k in &fkeys {
            let (model, api, user) = k;
            let f = &self.finished[*k];
            for (o, by_status) in Outcome::ALL.iter().zip(&f.outcomes) {
                for (class, n) in STATUS_CLASSES.iter().zip(by_status) {
                    // A series appears with its first request and stays.
                    if *n > 0 {
                        let labels = [
                            Some(&**model),
                            Some(api.as_str()),
                            user.as_deref(),
                            Some(o.as_str()),
                            Some(class),
                        ];
                        w.sample(m, labels, *n);
                    }
                }
            }
        }
        for (m, generation) in [
            (&GENERATION_TOKENS_TOTAL, true),
            (&PROMPT_TOKENS_TOTAL, false),
        ] {
            w.header(m);
            for &s in &order {
                let c = &self.counters[s];
                let v = if generation {
                    c.generation.value
                } else {
                    c.prompt.value
                };
                let (model, user) = &self.keys[s];
                w.sample(m, [Some(&**model), user.as_deref()], v);
            }
        }
        let m = &COMPLETION_TOKENS_TOTAL;
        w.header(m);
        for k in &fkeys {
            let (model, api, user) = k;
            let labels = [Some(&**model), Some(api.as_str()), user.as_deref()];
            w.sample(m, labels, self.finished[*k].completion);
        }
        let mut models: Vec<&(Arc<str>, Hists)> = self.hists.iter().collect();
        models.sort_by(|a, b| a.0.cmp(&b.0));
        for (i, m) in HISTOGRAMS.iter().enumerate() {
            w.header(m);
            for (model, hists) in &models {
                let h = &hists.0[i];
                w.histogram(m, [&**model], &h.counts, h.count, h.sum);
            }
        }
        self.sessions.render(&mut w);
    }
}
