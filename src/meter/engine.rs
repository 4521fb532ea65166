//! [`Meter`]: the single-threaded accounting core. Time is always passed in.

use std::collections::HashMap;
use std::sync::Arc;

use crate::clock::{UnixNanos, NANOS_PER_SEC};
use crate::itl::Gaps;
use crate::record::RequestRecord;
use crate::scrape::{ServerSample, ServerTrack};

use super::capacity::{CapacityAccumulator, RequestLevel};
use super::config::{MeterConfig, MAX_HORIZON_S};
use super::id_hash::IdMap;
use super::inflight::mean_level;
use super::kv;
use super::labels::{MAX_TRACKED_MODELS, OTHER, UNKNOWN_MODEL};
use super::levels::{GuardKey, LevelAttribution};
use super::prometheus::{PromState, Slot};
use super::scope::Scope;
use super::scope_slots::{ScopeSlot, Scopes};
use super::service_level::VerdictsByLevel;
use super::sessions::{SessionBook, SessionCallFigures, MAX_TRACKED_SESSIONS};
use super::timeline::{generation_interval, second_of};
use super::ttft_queueing::FirstTokenTrack;

#[derive(Debug, Clone)]
struct OpenRequest {
    start_ns: UnixNanos,
    /// Its user's and model's scopes: kept while it is open (their level counts it).
    user: ScopeSlot,
    model: ScopeSlot,
    attributed: f64,
    area_start: u128,
    /// Its counters' place in the Prometheus state.
    prom_slot: Slot,
    /// Prompt tokens already counted live (from a streamed usage).
    prompt_live: u64,
    /// The previous token event's time (`None` before the first).
    last_token_ns: Option<UnixNanos>,
    /// The first token event's time.
    first_token_ns: Option<UnixNanos>,
    /// ITL gaps were observed as they passed (the record's are then not observed again).
    itl_live: bool,
    /// Other requests were in flight at its arrival (its first token is judged for queueing).
    behind_others: bool,
    guard: GuardKey,
}

/// The live accounting of generation requests: aggregate, per-user and per-model seconds,
/// totals, the capacity curve and Prometheus counters.
#[derive(Debug)]
pub struct Meter {
    pub(super) config: MeterConfig,
    pub(super) origin: UnixNanos,
    pub(super) aggregate: Scope,
    pub(super) users: Scopes,
    pub(super) users_folded: u64,
    pub(super) models: Scopes,
    open: IdMap<OpenRequest>,
    pub(super) capacity: CapacityAccumulator,
    /// The production-traffic curve's attribution (aggregate scope).
    pub(super) levels: LevelAttribution,
    /// Service-level verdicts by arrival level.
    pub(super) verdicts: VerdictsByLevel,
    finalized_to: u64,
    last_tick_sec: u64,
    pub(super) prom: PromState,
    /// Scrape samples of the upstream, when the cross-check is on.
    pub(super) server: Option<ServerTrack>,
    /// The last scrape's KV-cache series and usage fraction, whether or not the cross-check
    /// keeps samples.
    pub(super) last_kv: Option<(crate::scrape::KvValues, Option<f64>)>,
    /// Agent sessions' figures (`/stats` `sessions`).
    pub(super) sessions: SessionBook,
    /// The live KV estimate's blocks per second, for its growth (while the block size is known).
    kv_history: kv::BlockHistory,
    /// Gaps and first tokens per second: saturation without a scrape.
    pub(super) first_tokens: FirstTokenTrack,
}

/// The numeric id in a proxy request id of the form `tm-<prefix hex>-<id hex>`: for records read
/// back from a log. The live meter is handed the number itself and never parses.
pub fn id_from_request_id(request_id: &str) -> Option<u64> {
    let tail = request_id.rsplit('-').next()?;
    u64::from_str_radix(tail, 16).ok()
}

impl Meter {
    /// A meter whose timeline starts at `origin`. Out-of-range settings are clamped (call
    /// [`MeterConfig::validate`] first to reject them instead).
    pub fn new(mut config: MeterConfig, origin: UnixNanos) -> Meter {
        config.horizon_s = config.horizon_s.clamp(1, MAX_HORIZON_S);
        let h = config.horizon_s;
        config.windows_s.retain(|w| (1..=h).contains(w));
        config.max_tracked_users = config.max_tracked_users.max(1);
        let origin_sec = second_of(origin);
        let levels = LevelAttribution::new(config.guard(), origin);
        let user_cap = config.max_tracked_users;
        Meter {
            prom: PromState::new(config.metrics_user_label, config.max_tracked_users),
            config,
            origin,
            aggregate: Scope::new(origin),
            users: Scopes::default(),
            users_folded: 0,
            models: Scopes::default(),
            open: HashMap::default(),
            capacity: CapacityAccumulator::new(),
            levels,
            verdicts: VerdictsByLevel::new(),
            finalized_to: origin_sec,
            last_tick_sec: origin_sec,
            server: None,
            last_kv: None,
            sessions: SessionBook::new(MAX_TRACKED_SESSIONS, user_cap),
            kv_history: kv::BlockHistory::default(),
            first_tokens: FirstTokenTrack::default(),
        }
    }

    /// The (clamped) settings in use.
    pub fn config(&self) -> &MeterConfig {
        &self.config
    }

    /// The in-flight requests' tokens held in the KV cache (prompt when known, plus generated so
    /// far): `(tokens, blocks by ceil per request with block_size, requests, prompt unknown)`.
    pub(super) fn open_kv(&self, block_size: Option<u64>) -> (u64, Option<u64>, u64, u64) {
        let (mut tokens, mut blocks, mut unknown) = (0u64, 0u64, 0u64);
        for o in self.open.values() {
            let held = o.prompt_live + o.attributed.round() as u64;
            tokens += held;
            unknown += (o.prompt_live == 0) as u64;
            if let Some(bs) = block_size {
                blocks += held.div_ceil(bs);
            }
        }
        let n = self.open.len() as u64;
        (tokens, block_size.map(|_| blocks), n, unknown)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.aggregate.in_flight.level()
    }

    /// Oldest second kept at `now_sec`: the last `horizon_s` complete seconds plus the current
    /// partial one, so a window as long as the horizon is still complete.
    pub(super) fn floor(&self, now_sec: u64) -> u64 {
        now_sec.saturating_sub(self.config.horizon_s)
    }

    /// Once per new second: integrate levels, feed final seconds to the capacity curve, evict
    /// seconds beyond the horizon and expire idle users.
    pub(super) fn tick(&mut self, now: UnixNanos) {
        let now_sec = second_of(now);
        if now_sec <= self.last_tick_sec {
            return;
        }
        self.last_tick_sec = now_sec;
        let block_size = self.last_kv.as_ref().and_then(|(v, _)| v.block_size);
        if let (_, Some(blocks), _, _) = self.open_kv(block_size.filter(|b| *b > 0)) {
            let keep = self.config.windows_s.iter().min().copied().unwrap_or(0);
            self.kv_history.push(now_sec, blocks, keep);
        }
        let floor = self.floor(now_sec);
        self.aggregate.advance(now, floor);
        // A second is final once no open request can still attribute tokens to it, or when it is
        // about to leave the horizon.
        let oldest_open = self
            .open
            .values()
            .map(|o| second_of(o.start_ns))
            .min()
            .unwrap_or(now_sec);
        let limit = now_sec.min(oldest_open).max(floor);
        if limit > self.finalized_to {
            for (_, b) in self.aggregate.ring.range(self.finalized_to, limit) {
                self.capacity.add_second(b);
            }
            self.finalized_to = limit;
        }
        self.aggregate.evict_before(floor);
        self.first_tokens.settle(now_sec);
        self.first_tokens.evict_before(floor);
        // A segment is final once every open request's remaining tokens would be spread after it.
        let decode_from = self
            .open
            .values()
            .map(|o| o.first_token_ns.unwrap_or(o.start_ns))
            .min()
            .unwrap_or(now);
        self.levels.advance(now);
        self.levels.finalize_before(decode_from);
        if let Some(t) = &mut self.server {
            t.evict_before(floor.saturating_mul(NANOS_PER_SEC));
        }
        let prom = &mut self.prom;
        self.sessions
            .close_idle(now, |wait_ms| prom.turn_closed(wait_ms));
        let expiry = self.config.user_idle_expiry_s.saturating_mul(NANOS_PER_SEC);
        self.users
            .retain(|s| s.in_flight.level() > 0 || now.saturating_sub(s.last_event_ns) <= expiry);
        for s in self.users.values_mut().chain(self.models.values_mut()) {
            if s.in_flight.level() > 0 {
                s.advance(now, floor);
            }
            s.evict_before(floor);
        }
    }

    fn user_key(&mut self, now: UnixNanos, user: &str) -> ScopeSlot {
        if let Some(slot) = self.users.find(user) {
            return slot;
        }
        let tracked = self.users.len() - self.users.contains_key(OTHER) as usize;
        let key: Arc<str> = if tracked < self.config.max_tracked_users {
            Arc::from(user)
        } else {
            self.users_folded += 1;
            if let Some(slot) = self.users.find(OTHER) {
                return slot;
            }
            Arc::from(OTHER)
        };
        self.users.insert(key, Scope::new(now))
    }

    fn model_key(&mut self, now: UnixNanos, model: Option<&str>) -> ScopeSlot {
        let name = model.unwrap_or(UNKNOWN_MODEL);
        if let Some(slot) = self.models.find(name) {
            return slot;
        }
        let name = if self.models.len() < MAX_TRACKED_MODELS {
            name
        } else {
            OTHER
        };
        if let Some(slot) = self.models.find(name) {
            return slot;
        }
        self.models.insert(Arc::from(name), Scope::new(now))
    }

    /// Turns the cross-check on (aggregate windows get a `server` object); idempotent.
    pub fn enable_server(&mut self, threshold_pct: f64) {
        if self.server.is_none() {
            self.server = Some(ServerTrack::new(threshold_pct));
        }
    }

    /// Keeps a scrape sample for the windows (ignored while the cross-check is off).
    pub fn server_sample(&mut self, sample: ServerSample) {
        self.last_kv = Some((sample.values.kv.clone(), sample.values.kv_cache_usage));
        if let Some(t) = &mut self.server {
            t.push(sample);
        }
    }

    /// Generation request `id` of `user` for `model` arrived at `now` (a repeated id is ignored).
    pub fn request_started(&mut self, now: UnixNanos, id: u64, user: &str, model: Option<&str>) {
        if self.open.contains_key(&id) {
            return;
        }
        self.tick(now);
        let floor = self.floor(second_of(now));
        let model_name = model;
        let user_name = user;
        let user = self.user_key(now, user);
        let model = self.model_key(now, model);
        self.aggregate.start(now, floor);
        let behind_others = self.aggregate.in_flight.level() > 1;
        for s in [self.users.get_mut(user), self.models.get_mut(model)]
            .into_iter()
            .flatten()
        {
            s.start(now, floor);
        }
        let area_start = self.aggregate.in_flight.area_ns();
        let prom_slot = self.prom.slot(model_name, user_name);
        let guard = self.levels.arrive(now);
        self.open.insert(
            id,
            OpenRequest {
                start_ns: now,
                user,
                model,
                attributed: 0.0,
                area_start,
                prom_slot,
                prompt_live: 0,
                last_token_ns: None,
                first_token_ns: None,
                itl_live: false,
                behind_others,
                guard,
            },
        );
    }

    /// `delta` completion tokens of request `id` passed the proxy at `now` (unknown ids ignored).
    pub fn tokens(&mut self, now: UnixNanos, id: u64, delta: u64) {
        self.tokens_with_gaps(now, id, delta, Gaps::default());
    }

    /// The same, with the ITL `gaps` measured since the request's previous report: observed
    /// now, as vLLM observes `inter_token_latency_seconds` at each step.
    pub fn tokens_with_gaps(&mut self, now: UnixNanos, id: u64, delta: u64, gaps: Gaps) {
        self.tick(now);
        let floor = self.floor(second_of(now));
        let Some(o) = self.open.get_mut(&id) else {
            return;
        };
        if gaps.count > 0 {
            o.itl_live = true;
            self.prom.gaps(o.prom_slot, gaps);
            self.first_tokens.gaps(now, gaps);
            self.aggregate.gaps(now, gaps, floor);
            for s in [self.users.get_mut(o.user), self.models.get_mut(o.model)]
                .into_iter()
                .flatten()
            {
                s.gaps(now, gaps, floor);
            }
        }
        let d = delta as f64;
        o.attributed += d;
        self.prom.generated(o.prom_slot, delta);
        // The tokens were made over the gap since this request's previous event (its decode
        // steps); the first event also ends the newcomer's guard.
        let from = o.last_token_ns.unwrap_or(o.start_ns);
        if o.first_token_ns.is_none() {
            o.first_token_ns = Some(now);
            self.levels.first_token(now, o.guard);
            self.first_tokens
                .first_token(o.start_ns, now, o.behind_others);
            // TTFT is observed now, as vLLM does, not when the stream ends.
            let ttft = std::time::Duration::from_nanos(now.saturating_sub(o.start_ns));
            self.prom.first_token(o.prom_slot, ttft.as_secs_f64());
            let ms = ttft.as_secs_f64() * 1e3;
            self.aggregate.first_token(now, ms, floor);
            for s in [self.users.get_mut(o.user), self.models.get_mut(o.model)]
                .into_iter()
                .flatten()
            {
                s.first_token(now, ms, floor);
            }
        } else {
            self.levels.advance(now);
        }
        self.levels.tokens(o.guard, from, now, d);
        o.last_token_ns = Some(o.last_token_ns.map_or(now, |t| t.max(now)));
        self.aggregate.tokens(now, d, floor);
        if let Some(s) = self.users.get_mut(o.user) {
            s.tokens(now, d, floor);
        }
        if let Some(s) = self.models.get_mut(o.model) {
            s.tokens(now, d, floor);
        }
    }

    /// Open request `id` reported its prompt size, `prompt_tokens`, before its end (a streamed
    /// usage); only the first report counts, the final usage settles the rest.
    pub fn prompt_tokens(&mut self, id: u64, prompt_tokens: u64) {
        if let Some(o) = self.open.get_mut(&id) {
            if o.prompt_live == 0 {
                o.prompt_live = prompt_tokens;
                self.prom.prompt_seen(o.prom_slot, prompt_tokens);
            }
        }
    }

    /// A request finished at `now`; its open state is found by the id in `record.request_id`
    /// (see [`id_from_request_id`]). Non-generation records are ignored.
    pub fn request_finished(&mut self, now: UnixNanos, record: &RequestRecord) {
        let id = id_from_request_id(&record.request_id);
        self.request_finished_id(now, id, record);
    }

    /// A request finished at `now`; `id` is the id its start was reported with (`None`, or an id
    /// never started, accounts the record without changing the in-flight level).
    pub fn request_finished_id(&mut self, now: UnixNanos, id: Option<u64>, record: &RequestRecord) {
        // Tick before removing the request: its seconds must not be finalized for the capacity
        // curve before its tokens are attributed to them.
        self.tick(now);
        let open = id.and_then(|id| self.open.remove(&id));
        if !record.is_generation() && open.is_none() {
            return;
        }
        if let Some(f) = SessionCallFigures::of(record) {
            if let Some(wait_ms) = self.sessions.add(&f) {
                self.prom.turn_closed(wait_ms);
            }
        }
        let floor = self.floor(second_of(now));
        let (user, model, attributed, started) = match &open {
            Some(o) => (o.user, o.model, o.attributed, true),
            None => {
                let u = self.user_key(now, &record.user);
                (u, self.model_key(now, record.model.as_deref()), 0.0, false)
            }
        };
        let live = open
            .as_ref()
            .map(|o| (o.first_token_ns.is_some(), o.itl_live));
        let (ttft_live, itl_live) = live.unwrap_or((false, false));
        let how = (started, ttft_live, itl_live);
        self.aggregate.finish(now, record, attributed, how, floor);
        for s in [self.users.get_mut(user), self.models.get_mut(model)]
            .into_iter()
            .flatten()
        {
            s.finish(now, record, attributed, how, floor);
        }
        if let Some(o) = &open {
            // The remainder is credited before the departure: when its interval is empty (a
            // non-streamed answer shorter than the guard's cap) it lands at the end instant, in
            // the request's own last segment, not in the one its departure opens (a level lower,
            // and clean).
            self.levels.advance(now);
            if let Some(total) = record.completion_tokens {
                let (from, to) = generation_interval(record, now);
                // Without a token event (non-streamed) the tokens were made after the newcomer's
                // guard, not during its queueing and prefill.
                let from = match o.first_token_ns {
                    Some(_) => from.max(o.start_ns),
                    None => o.start_ns.saturating_add(self.config.guard().guard_max_ns),
                };
                self.levels
                    .tokens(o.guard, from.min(to), to, total as f64 - o.attributed);
            }
            self.levels.depart(now, o.guard);
        }
        let level = match &open {
            Some(o) => mean_level(
                o.area_start,
                self.aggregate.in_flight.area_ns(),
                o.start_ns,
                now,
                record.in_flight_at_start,
            ),
            None => record.in_flight_at_start as f64,
        };
        self.verdicts.add_logged(
            level.round() as u32,
            record.slo_ok,
            record.slo_miss,
            record.completion_tokens,
        );
        self.capacity.add_request(&RequestLevel {
            level: level.round() as u32,
            tok_s: record.tok_s,
            ttft_ms: record.ttft_ms,
            in_flight_at_start: record.in_flight_at_start,
            cold_start: record.cold_start,
        });
        let (slot, live_prompt) = match &open {
            Some(o) => (o.prom_slot, o.prompt_live),
            None => (self.prom.slot(record.model.as_deref(), &record.user), 0),
        };
        // Tokens are attributed as whole events, so `attributed` is a whole number.
        let live = (attributed.round() as u64, live_prompt);
        self.prom
            .add_record(slot, record, live, (ttft_live, itl_live));
    }
}

impl Meter {
    /// The `kv` object at the meter's current instant, given the capacity at the service level.
    pub(super) fn kv_view(&self, service_level_in_flight: Option<u32>) -> kv::KvView {
        let (cache, usage) = match &self.last_kv {
            Some((v, usage)) => (
                Some(kv::KvCache::of(v)).filter(|c| c.basis.is_some()),
                *usage,
            ),
            None => (None, None),
        };
        let cache_reason = match (&self.last_kv, &cache) {
            (None, _) => Some("no scrape of the upstream's /metrics yet (metrics_url unset?)".into()),
            (Some(_), None) => Some(
                "the upstream's /metrics carries no vllm:cache_config_info with num_gpu_blocks or kv_cache_size_tokens"
                    .into(),
            ),
            _ => None,
        };
        let contexts = self.aggregate.contexts.view(0, UnixNanos::MAX);
        let (tokens, blocks, in_flight, prompt_unknown) =
            self.open_kv(cache.as_ref().and_then(|c| c.block_size));
        let server_blocks = cache
            .as_ref()
            .and_then(kv::KvCache::usable_blocks)
            .zip(usage)
            .map(|(n, u)| u * n as f64);
        let estimate = kv::KvEstimate {
            in_flight,
            prompt_unknown,
            tokens,
            blocks,
            server_blocks,
            diff_blocks: server_blocks.zip(blocks).map(|(s, b)| s - b as f64),
        };
        let window = self.config.windows_s.iter().min().copied().unwrap_or(0);
        let growth = blocks.and_then(|b| self.kv_history.growth(self.last_tick_sec, b, window));
        let headroom = kv::headroom(
            cache.as_ref(),
            &estimate,
            contexts.p90,
            self.config.kv_headroom_threshold_pct,
            growth,
        );
        kv::KvView {
            table: kv::table(
                cache.as_ref(),
                &contexts,
                service_level_in_flight,
                self.config.max_num_seqs,
            ),
            cache,
            cache_reason,
            contexts,
            estimate,
            headroom,
        }
    }
}
