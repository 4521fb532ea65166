//! What every request of one proxy shares: the observers, the in-flight count, request ids, the
//! clock, the service level, the session table and the upstreams' KV block sizes.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, TimeSource, NANOS_PER_SEC};
use crate::observe::Observer;
use crate::proxy::in_flight::InFlight;
use crate::proxy::session_table::SessionTable;
use crate::proxy::token_run::LevelChanges;
use crate::slo::SloConfig;

/// What is shared by all requests of one proxy.
pub struct TrackerShared {
    /// Receivers of measurements.
    pub observers: Vec<Arc<dyn Observer>>,
    /// Receivers of one upstream's measurements, by upstream index (empty with one upstream:
    /// the aggregate is that upstream's).
    pub per_upstream: Vec<Arc<dyn Observer>>,
    /// In-flight generation requests.
    pub in_flight: InFlight,
    pub(super) next_id: AtomicU64,
    pub(super) id_prefix: u32,
    /// Where measurements read the time (the real clock outside tests).
    pub(super) time: TimeSource,
    /// What token reports are coalesced against.
    pub(super) level_changes: LevelChanges,
    /// The service level each finished request is judged against.
    pub(super) slo: SloConfig,
    /// The agent sessions seen, for the prefix-cache audit.
    pub sessions: SessionTable,
    /// Each scraped upstream's KV `block_size` (0 while unknown), by upstream index, set by its
    /// scrape: a token that starts a new block is reported at once, so the meter's live KV
    /// estimate counts every request's blocks exactly (`docs/kv-cache.md`).
    pub kv_block_size: Vec<AtomicU64>,
}

impl TrackerShared {
    /// Shared state feeding `observers`.
    pub fn new(observers: Vec<Arc<dyn Observer>>, cold_start_idle: Duration) -> Self {
        let id_prefix = (Clock::global().now() / NANOS_PER_SEC) as u32;
        TrackerShared {
            observers,
            per_upstream: Vec::new(),
            in_flight: InFlight::new(cold_start_idle),
            next_id: AtomicU64::new(1),
            id_prefix,
            time: TimeSource::real(),
            level_changes: LevelChanges::default(),
            slo: SloConfig::default(),
            sessions: SessionTable::default(),
            kv_block_size: vec![AtomicU64::new(0)],
        }
    }

    /// One KV block size per upstream (`n` scraped upstreams; at least one).
    #[must_use]
    pub fn with_kv_upstreams(mut self, n: usize) -> Self {
        self.kv_block_size = (0..n.max(1)).map(|_| AtomicU64::new(0)).collect();
        self
    }

    /// Whether a sequence growing from `before` to `after` tokens (prompt and generated, on the
    /// upstream of index `upstream`) starts a KV block: `ceil(n / block_size)` changes. False
    /// while the block size is unknown.
    pub(super) fn starts_block(&self, upstream: usize, before: u64, after: u64) -> bool {
        let bs = self
            .kv_block_size
            .get(upstream)
            .or(self.kv_block_size.first())
            .map_or(0, |b| b.load(std::sync::atomic::Ordering::Relaxed));
        bs > 0 && before.div_ceil(bs) != after.div_ceil(bs)
    }

    /// The same, judging requests against `slo` (default: [`SloConfig::default`]).
    #[must_use]
    pub fn with_slo(mut self, slo: SloConfig) -> Self {
        self.slo = slo;
        self
    }

    /// Token reports coalesced per request and second (on by default) or made per event; see
    /// the module `proxy::token_run` for when coalescing changes nothing.
    #[must_use]
    pub fn with_token_coalescing(mut self, on: bool) -> Self {
        self.level_changes = LevelChanges::new(on);
        self
    }

    /// The same, measuring on `time` (tests pass a manual clock).
    #[must_use]
    pub fn with_time_source(mut self, time: TimeSource) -> Self {
        self.time = time;
        self
    }

    /// Where measurements read the time.
    pub fn time(&self) -> &TimeSource {
        &self.time
    }
}
