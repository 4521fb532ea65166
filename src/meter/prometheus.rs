//! Prometheus text exposition (format 0.0.4) of the proxy's own measurements.
//!
//! Every metric is prefixed `tokenmeter_` rather than reusing vLLM's `vllm:` names: a dashboard
//! scraping both the proxy and the server must be able to tell the client-side view (network,
//! queueing in front of the server, client aborts included) from the server's own, and names
//! that look alike but measure different things would silently mix in a query. Histogram
//! bucket bounds follow the shape of vLLM's so the two can be compared bucket by bucket.
//!
//! Labels are bounded: `model` (at most [`MAX_TRACKED_MODELS`] names, then `"other"`), `api`
//! (the four generation APIs, on the counters), `outcome` (six values) and, only with `metrics_user_label`, `user` on the counters (at most
//! `max_tracked_users` names ever, then `"other"`; histograms never carry `user`). Only
//! generation requests are counted. Series never disappear, so counters stay monotonic.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::sync::Arc;

use crate::dialect::Api;
use crate::itl::VLLM_ITL_BOUNDS_S;
use crate::record::{Outcome, RequestRecord};

use crate::exposition::{
    escape_label as escape, header, REQUEST_BUCKETS as E2E_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS,
};

use super::labels::{MAX_TRACKED_MODELS, OTHER, UNKNOWN_MODEL};

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

#[derive(Debug, Clone, Default)]
struct Counters {
    outcomes: [u64; 6],
    prompt: u64,
    completion: u64,
}

#[derive(Debug, Clone)]
struct Hists {
    ttft: FixedHist,
    tpot: FixedHist,
    e2e: FixedHist,
    itl: FixedHist,
}

/// Counter series key: model, API, and the user when the user label is on.
type CounterKey = (Arc<str>, Api, Option<Arc<str>>);

/// The counters and histograms behind `/stats/metrics`.
#[derive(Debug)]
pub struct PromState {
    user_label: bool,
    max_users: usize,
    models: HashSet<Arc<str>>,
    users: HashSet<Arc<str>>,
    counters: HashMap<CounterKey, Counters>,
    hists: HashMap<Arc<str>, Hists>,
}

fn bounded(set: &mut HashSet<Arc<str>>, name: &str, cap: usize) -> Arc<str> {
    if let Some(k) = set.get(name) {
        return k.clone();
    }
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
            counters: HashMap::new(),
            hists: HashMap::new(),
        }
    }

    /// Counts a finished generation request.
    pub fn add_record(&mut self, r: &RequestRecord) {
        let model = bounded(
            &mut self.models,
            r.model.as_deref().unwrap_or(UNKNOWN_MODEL),
            MAX_TRACKED_MODELS,
        );
        let user = self
            .user_label
            .then(|| bounded(&mut self.users, &r.user, self.max_users));
        // Only generation requests reach here; a record read back without `api` is known by its
        // path.
        let api = r
            .api
            .or_else(|| crate::dialect::detect(&r.path))
            .unwrap_or(Api::Chat);
        let c = self.counters.entry((model.clone(), api, user)).or_default();
        if let Some(i) = Outcome::ALL.iter().position(|o| *o == r.outcome) {
            c.outcomes[i] += 1;
        }
        c.prompt += r.prompt_tokens.unwrap_or(0);
        c.completion += r.completion_tokens.unwrap_or(0);
        let h = self.hists.entry(model).or_insert_with(|| Hists {
            ttft: FixedHist::new(TTFT_BUCKETS),
            tpot: FixedHist::new(TPOT_BUCKETS),
            e2e: FixedHist::new(E2E_BUCKETS),
            itl: FixedHist::new(&VLLM_ITL_BOUNDS_S),
        });
        if let Some(itl) = &r.itl {
            // The request's own counts per vLLM bucket: exact, no re-binning.
            let per = itl.vllm_buckets();
            for (slot, n) in h.itl.counts.iter_mut().zip(per.iter()) {
                *slot += *n as u64;
            }
            h.itl.count += itl.count() as u64;
            h.itl.sum += itl.sum_s();
        }
        let secs = |ms: Option<f64>| ms.map(|v| v / 1e3);
        if let Some(v) = secs(r.ttft_ms) {
            h.ttft.observe(TTFT_BUCKETS, v);
        }
        if let Some(v) = secs(r.tpot_ms) {
            h.tpot.observe(TPOT_BUCKETS, v);
        }
        if let Some(v) = secs(r.e2e_ms) {
            h.e2e.observe(E2E_BUCKETS, v);
        }
    }

    /// The exposition text; `in_flight` is the current gauge value.
    pub fn render(&self, in_flight: u32) -> String {
        let mut out = String::with_capacity(4096);
        let mut keys: Vec<_> = self.counters.keys().collect();
        keys.sort();
        let labels = |model: &str, api: Api, user: &Option<Arc<str>>| match user {
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
            "Generation requests finished, by outcome.",
        );
        for k in &keys {
            let c = &self.counters[*k];
            for (o, n) in Outcome::ALL.iter().zip(c.outcomes) {
                let _ = writeln!(
                    out,
                    "tokenmeter_requests_total{{{},outcome=\"{}\"}} {n}",
                    labels(&k.0, k.1, &k.2),
                    o.as_str()
                );
            }
        }
        for (name, help, get) in [
            (
                "tokenmeter_prompt_tokens_total",
                "Prompt tokens of finished generation requests (from usage).",
                0,
            ),
            (
                "tokenmeter_completion_tokens_total",
                "Completion tokens of finished generation requests (usage, else counted).",
                1,
            ),
        ] {
            header(&mut out, name, "counter", help);
            for k in &keys {
                let c = &self.counters[*k];
                let v = if get == 0 { c.prompt } else { c.completion };
                let _ = writeln!(out, "{name}{{{}}} {v}", labels(&k.0, k.1, &k.2));
            }
        }
        let mut models: Vec<_> = self.hists.keys().collect();
        models.sort();
        for (name, help, bounds, pick) in [
            (
                "tokenmeter_time_to_first_token_seconds",
                "Arrival to first generated output (any API), seconds.",
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
                "tokenmeter_inter_token_latency_seconds",
                "Gaps between output-carrying events (vllm bench serve's ITL), seconds; vLLM's bounds.",
                &VLLM_ITL_BOUNDS_S[..],
                3,
            ),
        ] {
            header(&mut out, name, "histogram", help);
            for m in &models {
                let hs = &self.hists[*m];
                let h = [&hs.ttft, &hs.tpot, &hs.e2e, &hs.itl][pick];
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

/// Appends the access-log counter (the writer's counters live outside the meter).
pub fn render_access_log(out: &mut String, dropped: u64) {
    header(
        out,
        "tokenmeter_access_log_dropped_total",
        "counter",
        "Access-log records dropped (channel full or writer gone).",
    );
    let _ = writeln!(out, "tokenmeter_access_log_dropped_total {dropped}");
}
