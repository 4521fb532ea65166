//! What every request of one proxy shares: the observers, the in-flight count, request ids, the
//! clock, the service level and the session table.

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
        }
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
