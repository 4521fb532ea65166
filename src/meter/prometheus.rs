//! Prometheus text exposition (format 0.0.4) of the proxy's own measurements.
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
use std::fmt::Write;
use std::sync::Arc;

use crate::dialect::Api;
use crate::exposition::{
    escape_label as escape, header, REQUEST_BUCKETS as E2E_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS,
};
use crate::itl::VLLM_ITL_BOUNDS_S;
use crate::record::{Outcome, RequestRecord};

use super::labels::{MAX_TRACKED_MODELS, OTHER, UNKNOWN_MODEL};
use super::snapshot::AccessLogView;

/// First-byte bucket upper bounds, seconds: the TTFT bounds (the first byte usually comes with
/// the response headers, long before the first token, so the low end matters as much).
pub const FIRST_BYTE_BUCKETS: &[f64] = TTFT_BUCKETS;

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

#[derive(Debug, Clone)]
struct Hists {
    ttft: FixedHist,
    tpot: FixedHist,
    e2e: FixedHist,
    first_byte: FixedHist,
    itl: FixedHist,
}

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
    hists: HashMap<Arc<str>, Hists>,
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
            hists: HashMap::new(),
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

    /// Counts a finished generation request of `slot`, whose streamed events already added
    /// `live_completion` generated and `live_prompt` prompt tokens: the counters are settled to
    /// the record's counts (usage, else the tokens counted).
    pub fn add_record(
        &mut self,
        slot: Slot,
        r: &RequestRecord,
        live_completion: u64,
        live_prompt: u64,
    ) {
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
        let h = self.hists.entry(model).or_insert_with(|| Hists {
            ttft: FixedHist::new(TTFT_BUCKETS),
            tpot: FixedHist::new(TPOT_BUCKETS),
            e2e: FixedHist::new(E2E_BUCKETS),
            first_byte: FixedHist::new(FIRST_BYTE_BUCKETS),
            itl: FixedHist::new(&VLLM_ITL_BOUNDS_S),
        });
        if let Some(itl) = &r.itl {
            // The request's own counts per vLLM bucket: exact, no re-binning.
            for (slot, n) in h.itl.counts.iter_mut().zip(itl.vllm_buckets().iter()) {
                *slot += u64::from(*n);
            }
            h.itl.count += u64::from(itl.count());
            h.itl.sum += itl.sum_s();
        }
        let secs = |ms: Option<f64>| ms.map(|v| v / 1e3);
        for (hist, bounds, v) in [
            (&mut h.ttft, TTFT_BUCKETS, r.ttft_ms),
            (&mut h.tpot, TPOT_BUCKETS, r.tpot_ms),
            (&mut h.e2e, E2E_BUCKETS, r.e2e_ms),
            (&mut h.first_byte, FIRST_BYTE_BUCKETS, r.first_byte_ms),
        ] {
            if let Some(v) = secs(v) {
                hist.observe(bounds, v);
            }
        }
    }

    /// The exposition text; `in_flight` is the current gauge value.
    pub fn render(&self, in_flight: u32) -> String {
        let mut out = String::with_capacity(4096);
        let mut order: Vec<Slot> = (0..self.keys.len()).collect();
        order.sort_by(|a, b| self.keys[*a].cmp(&self.keys[*b]));
        let labels = |s: Slot| match &self.keys[s] {
            (model, Some(u)) => format!("model=\"{}\",user=\"{}\"", escape(model), escape(u)),
            (model, None) => format!("model=\"{}\"", escape(model)),
        };
        let mut fkeys: Vec<&FinishedKey> = self.finished.keys().collect();
        fkeys.sort();
        let flabels = |(model, api, user): &FinishedKey| match user {
            Some(u) => format!(
                "model=\"{}\",api=\"{}\",user=\"{}\"",
                escape(model),
                api.as_str(),
                escape(u)
            ),
            None => format!("model=\"{}\",api=\"{}\"", escape(model), api.as_str()),
        };
        header(
            &mut out,
            "tokenmeter_requests_total",
            "counter",
            "Generation requests finished, by outcome and class of the status sent to the client.",
        );
        for k in &fkeys {
            let f = &self.finished[*k];
            let l = flabels(k);
            for (o, by_status) in Outcome::ALL.iter().zip(&f.outcomes) {
                for (class, n) in STATUS_CLASSES.iter().zip(by_status) {
                    // A series appears with its first request and stays.
                    if *n > 0 {
                        let o = o.as_str();
                        let _ = writeln!(
                            out,
                            "tokenmeter_requests_total{{{l},outcome=\"{o}\",status=\"{class}\"}} {n}"
                        );
                    }
                }
            }
        }
        for (name, help, generation) in [
            (
                "tokenmeter_generation_tokens_total",
                "Generated tokens as they stream past the proxy, settled to usage when each \
                 request ends (compare with vllm:generation_tokens_total).",
                true,
            ),
            (
                "tokenmeter_prompt_tokens_total",
                "Prompt tokens, from the first output event once a usage gave them, else from \
                 the final usage (compare with vllm:prompt_tokens_total).",
                false,
            ),
        ] {
            header(&mut out, name, "counter", help);
            for &s in &order {
                let c = &self.counters[s];
                let v = if generation {
                    c.generation.value
                } else {
                    c.prompt.value
                };
                let _ = writeln!(out, "{name}{{{}}} {v}", labels(s));
            }
        }
        let name = "tokenmeter_completion_tokens_total";
        header(
            &mut out,
            name,
            "counter",
            "Completion tokens counted when requests finish (usage, else counted); moves in \
             steps at each request's end: for rates use tokenmeter_generation_tokens_total.",
        );
        for k in &fkeys {
            let _ = writeln!(
                out,
                "{name}{{{}}} {}",
                flabels(k),
                self.finished[*k].completion
            );
        }
        let mut models: Vec<_> = self.hists.keys().collect();
        models.sort();
        for (name, help, bounds, pick) in [
            (
                "tokenmeter_time_to_first_token_seconds",
                "Arrival to first content event, seconds.",
                TTFT_BUCKETS,
                0,
            ),
            (
                "tokenmeter_time_per_output_token_seconds",
                "(e2e - ttft) / (completion_tokens - 1), seconds.",
                TPOT_BUCKETS,
                1,
            ),
            (
                "tokenmeter_e2e_request_latency_seconds",
                "Arrival to last byte sent to the client, seconds.",
                E2E_BUCKETS,
                2,
            ),
            (
                "tokenmeter_first_byte_seconds",
                "Arrival to the first response byte from the upstream, seconds.",
                FIRST_BYTE_BUCKETS,
                3,
            ),
            (
                "tokenmeter_inter_token_latency_seconds",
                "Gaps between output-carrying events (vllm bench serve's ITL), seconds; vLLM's bounds.",
                &VLLM_ITL_BOUNDS_S[..],
                4,
            ),
        ] {
            header(&mut out, name, "histogram", help);
            for m in &models {
                let hs = &self.hists[*m];
                let h = [&hs.ttft, &hs.tpot, &hs.e2e, &hs.first_byte, &hs.itl][pick];
                let m = escape(m);
                let mut cum = 0;
                for (b, n) in bounds.iter().zip(&h.counts) {
                    cum += n;
                    let _ = writeln!(out, "{name}_bucket{{model=\"{m}\",le=\"{b}\"}} {cum}");
                }
                let _ = writeln!(
                    out,
                    "{name}_bucket{{model=\"{m}\",le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(out, "{name}_sum{{model=\"{m}\"}} {}", h.sum);
                let _ = writeln!(out, "{name}_count{{model=\"{m}\"}} {}", h.count);
            }
        }
        header(
            &mut out,
            "tokenmeter_requests_in_flight",
            "gauge",
            "Generation requests in flight now.",
        );
        let _ = writeln!(out, "tokenmeter_requests_in_flight {in_flight}");
        out
    }
}

/// Counters kept outside the meter thread, appended to its exposition by the HTTP handler.
#[derive(Debug, Clone, Copy, Default)]
pub struct SelfMetrics {
    /// The access-log writer's counters.
    pub access_log: AccessLogView,
    /// Successful and failed scrapes of the upstream's `/metrics`, when scraping is on.
    pub scrapes: Option<(u64, u64)>,
    /// The process's own resource use, when the platform reports it.
    pub process: Option<super::process::ProcessStats>,
}

/// Appends build information, the access-log and scrape counters and the process metrics.
pub fn render_self(out: &mut String, m: &SelfMetrics) {
    header(
        out,
        "tokenmeter_build_info",
        "gauge",
        "Always 1; the labels name the running build.",
    );
    let _ = writeln!(
        out,
        "tokenmeter_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    for (name, help, v) in [
        (
            "tokenmeter_access_log_written_total",
            "Access-log lines written.",
            m.access_log.written,
        ),
        (
            "tokenmeter_access_log_dropped_total",
            "Access-log records dropped (channel full or writer gone).",
            m.access_log.dropped,
        ),
        (
            "tokenmeter_access_log_failed_total",
            "Access-log records lost to write errors.",
            m.access_log.failed,
        ),
    ] {
        header(out, name, "counter", help);
        let _ = writeln!(out, "{name} {v}");
    }
    if let Some((ok, errors)) = m.scrapes {
        for (name, help, v) in [
            (
                "tokenmeter_upstream_scrapes_total",
                "Successful scrapes of the upstream's /metrics.",
                ok,
            ),
            (
                "tokenmeter_upstream_scrape_errors_total",
                "Failed scrapes of the upstream's /metrics (connection, timeout, status, no vllm: series).",
                errors,
            ),
        ] {
            header(out, name, "counter", help);
            let _ = writeln!(out, "{name} {v}");
        }
    }
    if let Some(p) = m.process {
        // The names client libraries use for these, so existing process dashboards work.
        header(
            out,
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time of the process, seconds.",
        );
        let _ = writeln!(out, "process_cpu_seconds_total {}", p.cpu_s);
        header(
            out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident set size, bytes.",
        );
        let _ = writeln!(out, "process_resident_memory_bytes {}", p.rss_bytes);
        header(out, "process_open_fds", "gauge", "Open file descriptors.");
        let _ = writeln!(out, "process_open_fds {}", p.open_fds);
        header(
            out,
            "process_start_time_seconds",
            "gauge",
            "Start of the process, seconds since the Unix epoch.",
        );
        let _ = writeln!(out, "process_start_time_seconds {}", p.start_time_s);
    }
}

/// Appends the capacity at the service level: `tokenmeter_capacity_at_service_level` (the
/// in-flight level) and `tokenmeter_capacity_at_service_level_reached` (1 when a level above it
/// missed, 0 while it is a lower bound). Both are absent while the figure is unknown (no level
/// has `slo.min_requests` judged requests), never 0.
pub fn render_service_level(out: &mut String, c: &super::service_level::ServiceCapacity) {
    use std::fmt::Write;
    let Some(n) = c.in_flight else { return };
    let _ = write!(
        out,
        "# HELP tokenmeter_capacity_at_service_level Highest in-flight level at which the service \
         level's attainment target is met (a lower bound while ..._reached is 0).\n\
         # TYPE tokenmeter_capacity_at_service_level gauge\n\
         tokenmeter_capacity_at_service_level {n}\n\
         # HELP tokenmeter_capacity_at_service_level_reached 1 when a level above the capacity \
         missed the service level, 0 while traffic never went high enough to miss.\n\
         # TYPE tokenmeter_capacity_at_service_level_reached gauge\n\
         tokenmeter_capacity_at_service_level_reached {}\n",
        u8::from(c.reached)
    );
}
