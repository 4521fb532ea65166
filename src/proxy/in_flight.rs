//! [`InFlight`]: the count of generation requests in flight, shared by all trackers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::UnixNanos;

/// Generation requests in flight, and whether the next arrival follows an idle gap (cold start).
#[derive(Debug)]
pub struct InFlight {
    count: AtomicU64,
    /// When the count last dropped to zero; 0 before any request.
    idle_since: AtomicU64,
    cold_after: u64,
}

impl InFlight {
    /// A tracker that calls an arrival cold after `cold_start_idle` without traffic.
    pub fn new(cold_start_idle: Duration) -> Self {
        InFlight {
            count: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            cold_after: cold_start_idle.as_nanos() as u64,
        }
    }

    /// Requests in flight now.
    pub fn current(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Counts an arrival: (requests in flight including it, whether it is a cold start).
    pub(super) fn arrive(&self, now: UnixNanos) -> (u32, bool) {
        let before = self.count.fetch_add(1, Ordering::AcqRel);
        let cold = before == 0 && {
            let idle = self.idle_since.load(Ordering::Acquire);
            idle == 0 || now.saturating_sub(idle) > self.cold_after
        };
        ((before + 1).min(u32::MAX as u64) as u32, cold)
    }

    pub(super) fn depart(&self, now: UnixNanos) {
        if self.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle_since.store(now.max(1), Ordering::Release);
        }
    }
}
