//! The `server` object of a `/stats` window: vLLM's own counts over the window beside the
//! proxy's, computed from scrape samples and the proxy's per-second buckets.

use std::collections::VecDeque;

use serde::Serialize;

use crate::clock::{UnixNanos, NANOS_PER_SEC};

use super::sample::ServerSample;

/// Lowest and highest value over a window's samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MinMax {
    /// Smallest sampled value.
    pub min: f64,
    /// Largest sampled value.
    pub max: f64,
}

/// vLLM's own accounting over a window, beside the proxy's over the same interval. Every field
/// is `null` while the window holds no sample (rates need two samples carrying the counter).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerWindow {
    /// Scrape samples whose timestamp falls inside the window.
    pub samples: u64,
    /// `t_last − t_first`, seconds: the interval between the first and the last sample inside the
    /// window that carry `vllm:generation_tokens_total`; every rate below is over it.
    pub interval_s: Option<f64>,
    /// Increase of `vllm:generation_tokens_total` over the interval / `interval_s`.
    pub gen_tok_s: Option<f64>,
    /// Increase of `vllm:prompt_tokens_total` over the interval / `interval_s`.
    pub prompt_tok_s: Option<f64>,
    /// Counter resets seen inside the interval (a counter went down: the server restarted).
    pub counter_resets: u64,
    /// `vllm:num_requests_running` over the samples.
    pub running: Option<MinMax>,
    /// `vllm:num_requests_waiting` over the samples.
    pub waiting: Option<MinMax>,
    /// KV-cache usage (fraction) of the last sample.
    pub kv_cache_usage: Option<f64>,
    /// The proxy's completion tokens attributed to `[t_first, t_last]` (each 1-second bucket
    /// counted in proportion to its overlap with the interval) / `interval_s`.
    pub proxy_gen_tok_s: Option<f64>,
    /// `100 × (proxy_gen_tok_s − gen_tok_s) / gen_tok_s`; `null` when the server counted no token
    /// or the interval holds a counter reset.
    pub disagreement_pct: Option<f64>,
    /// `|disagreement_pct| > disagreement_threshold_pct`; when the server counted no token:
    /// whether the proxy saw at least one. `null` where `disagreement_pct` is null otherwise.
    pub disagreement: Option<bool>,
    /// Mean over the samples of the proxy's generation requests in flight at scrape time.
    pub proxy_in_flight: Option<f64>,
    /// Mean over the samples of `running + waiting`.
    pub server_running_plus_waiting: Option<f64>,
    /// `proxy_in_flight − server_running_plus_waiting`: > 0 means the proxy holds requests the
    /// server does not (or counts `n > 1` requests once); < 0, traffic reaching the server
    /// another way.
    pub in_flight_diff: Option<f64>,
}

impl ServerWindow {
    /// The object of a window with no sample.
    pub fn empty() -> Self {
        ServerWindow {
            samples: 0,
            interval_s: None,
            gen_tok_s: None,
            prompt_tok_s: None,
            counter_resets: 0,
            running: None,
            waiting: None,
            kv_cache_usage: None,
            proxy_gen_tok_s: None,
            disagreement_pct: None,
            disagreement: None,
            proxy_in_flight: None,
            server_running_plus_waiting: None,
            in_flight_diff: None,
        }
    }
}

/// Counter increase over consecutive values: a value below its predecessor is a reset (the
/// counter restarted from 0), whose increase is the new value itself (a lower bound: what was
/// counted between the last sample and the restart is lost). Returns (increase, resets).
pub fn increase(values: &[f64]) -> (f64, u64) {
    let (mut total, mut resets) = (0.0, 0u64);
    for w in values.windows(2) {
        if w[1] >= w[0] {
            total += w[1] - w[0];
        } else {
            resets += 1;
            total += w[1];
        }
    }
    (total, resets)
}

/// The proxy's completion tokens over an interval, as the cross-check compares them with vLLM's
/// counter. The meter's ring implements it; this module needs no meter.
pub trait ProxyTokens {
    /// Completion tokens attributed to `[t0, t1]`.
    fn proxy_tokens(&self, t0: UnixNanos, t1: UnixNanos) -> f64;
}

/// Sum of `(second, tokens)` over `[t0, t1]`, each second weighted by its overlap with it.
pub fn pro_rata(seconds: impl Iterator<Item = (u64, f64)>, t0: UnixNanos, t1: UnixNanos) -> f64 {
    if t1 <= t0 {
        return 0.0;
    }
    let mut total = 0.0;
    for (s, tokens) in seconds {
        let lo = s.saturating_mul(NANOS_PER_SEC).max(t0);
        let hi = s.saturating_add(1).saturating_mul(NANOS_PER_SEC).min(t1);
        if hi > lo {
            total += tokens * (hi - lo) as f64 / NANOS_PER_SEC as f64;
        }
    }
    total
}

fn min_max(it: impl Iterator<Item = f64>) -> Option<MinMax> {
    it.fold(None, |acc: Option<MinMax>, v| {
        Some(match acc {
            None => MinMax { min: v, max: v },
            Some(m) => MinMax {
                min: m.min.min(v),
                max: m.max.max(v),
            },
        })
    })
}

fn mean(it: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, s) = it.fold((0u32, 0.0), |(n, s), v| (n + 1, s + v));
    (n > 0).then(|| s / n as f64)
}

/// Samples kept for the horizon, oldest first.
#[derive(Debug, Clone)]
pub struct ServerTrack {
    samples: VecDeque<ServerSample>,
    threshold_pct: f64,
}

impl ServerTrack {
    /// An empty track flagging disagreements beyond `threshold_pct`.
    pub fn new(threshold_pct: f64) -> Self {
        ServerTrack {
            samples: VecDeque::new(),
            threshold_pct,
        }
    }

    /// Adds a sample, kept in timestamp order.
    pub fn push(&mut self, s: ServerSample) {
        let i = self.samples.partition_point(|x| x.ts_ns <= s.ts_ns);
        self.samples.insert(i, s);
    }

    /// Forgets samples before `ns`.
    pub fn evict_before(&mut self, ns: UnixNanos) {
        while self.samples.front().is_some_and(|s| s.ts_ns < ns) {
            self.samples.pop_front();
        }
    }

    /// Samples kept.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no sample is kept.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `server` object for samples with `from <= ts < to`, the proxy's tokens read from
    /// `proxy` (the meter's ring).
    pub fn window(&self, from: UnixNanos, to: UnixNanos, proxy: &impl ProxyTokens) -> ServerWindow {
        self.window_with(from, to, |a, b| proxy.proxy_tokens(a, b))
    }

    /// All samples, oldest first.
    pub fn samples(&self) -> impl Iterator<Item = &ServerSample> {
        self.samples.iter()
    }

    /// The last sample before `from` and the samples in `[from, to)`, found by bisection (the
    /// samples are kept in time order).
    pub fn around(
        &self,
        from: UnixNanos,
        to: UnixNanos,
    ) -> (Option<&ServerSample>, impl Iterator<Item = &ServerSample>) {
        let i = self.samples.partition_point(|s| s.ts_ns < from);
        let j = self.samples.partition_point(|s| s.ts_ns < to).max(i);
        let before = i.checked_sub(1).and_then(|k| self.samples.get(k));
        (before, self.samples.range(i..j))
    }

    /// As [`ServerTrack::window`], the proxy's tokens over `[t_first, t_last]` given by `proxy`.
    pub fn window_with(
        &self,
        from: UnixNanos,
        to: UnixNanos,
        proxy: impl Fn(UnixNanos, UnixNanos) -> f64,
    ) -> ServerWindow {
        let start = self.samples.partition_point(|s| s.ts_ns < from);
        let inside: Vec<&ServerSample> = self
            .samples
            .range(start..)
            .take_while(|s| s.ts_ns < to)
            .collect();
        let mut w = ServerWindow::empty();
        w.samples = inside.len() as u64;
        if inside.is_empty() {
            return w;
        }
        w.running = min_max(inside.iter().filter_map(|s| s.values.running));
        w.waiting = min_max(inside.iter().filter_map(|s| s.values.waiting));
        w.kv_cache_usage = inside.last().and_then(|s| s.values.kv_cache_usage);
        w.proxy_in_flight = mean(
            inside
                .iter()
                .filter_map(|s| s.proxy_in_flight.map(|v| v as f64)),
        );
        w.server_running_plus_waiting = mean(
            inside
                .iter()
                .filter_map(|s| Some(s.values.running? + s.values.waiting?)),
        );
        if let (Some(p), Some(s)) = (w.proxy_in_flight, w.server_running_plus_waiting) {
            w.in_flight_diff = Some(p - s);
        }
        let counted: Vec<&&ServerSample> = inside
            .iter()
            .filter(|s| s.values.generation_tokens_total.is_some())
            .collect();
        let (Some(first), Some(last)) = (counted.first(), counted.last()) else {
            return w;
        };
        if last.ts_ns <= first.ts_ns {
            return w;
        }
        let secs = (last.ts_ns - first.ts_ns) as f64 / NANOS_PER_SEC as f64;
        w.interval_s = Some(secs);
        let gen: Vec<f64> = counted
            .iter()
            .filter_map(|s| s.values.generation_tokens_total)
            .collect();
        let (server_gen, resets) = increase(&gen);
        let prompt: Option<Vec<f64>> = counted
            .iter()
            .map(|s| s.values.prompt_tokens_total)
            .collect();
        let prompt_inc = prompt.map(|p| increase(&p));
        w.counter_resets = resets.max(prompt_inc.map_or(0, |(_, r)| r));
        w.gen_tok_s = Some(server_gen / secs);
        w.prompt_tok_s = prompt_inc.map(|(p, _)| p / secs);
        let proxy = proxy(first.ts_ns, last.ts_ns);
        w.proxy_gen_tok_s = Some(proxy / secs);
        if w.counter_resets == 0 {
            if server_gen > 0.0 {
                let pct = 100.0 * (proxy - server_gen) / server_gen;
                w.disagreement_pct = Some(pct);
                w.disagreement = Some(pct.abs() > self.threshold_pct);
            } else {
                w.disagreement = Some(proxy >= 1.0);
            }
        }
        w
    }
}
