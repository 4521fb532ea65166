//! One timeline for every measurement: Unix-epoch nanoseconds that advance with the monotonic
//! clock, so seconds line up with wall-clock seconds (and with vLLM's log) yet never jump back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch on the process's monotonic timeline.
pub type UnixNanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Maps `Instant`s onto Unix-epoch nanoseconds, anchored once at first use.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    anchor_instant: Instant,
    anchor_unix_ns: u64,
}

impl Clock {
    /// A clock anchored now.
    pub fn new() -> Self {
        let anchor_instant = Instant::now();
        let anchor_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_nanos() as u64;
        Clock {
            anchor_instant,
            anchor_unix_ns,
        }
    }

    /// The process-wide clock.
    pub fn global() -> &'static Clock {
        static GLOBAL: OnceLock<Clock> = OnceLock::new();
        GLOBAL.get_or_init(Clock::new)
    }

    /// The current time on this clock.
    pub fn now(&self) -> UnixNanos {
        self.at(Instant::now())
    }

    /// The time of `instant` on this clock.
    pub fn at(&self, instant: Instant) -> UnixNanos {
        match instant.checked_duration_since(self.anchor_instant) {
            Some(d) => self.anchor_unix_ns + d.as_nanos() as u64,
            None => self
                .anchor_unix_ns
                .saturating_sub(self.anchor_instant.duration_since(instant).as_nanos() as u64),
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// Where timing code reads "now": the real monotonic clock (the default, and the only one in the
/// binary), or a manual clock that a test advances by hand so measured durations are exact.
///
/// Measurements read it (request start, first byte, tokens, end); timeouts do not: they stay on
/// the runtime's timers, so a manual clock never stops the proxy from cutting a stalled upstream.
#[derive(Debug, Clone, Default)]
pub struct TimeSource(Option<Arc<ManualClock>>);

impl TimeSource {
    /// The real monotonic clock.
    pub fn real() -> Self {
        TimeSource(None)
    }

    /// A manual clock standing at the real `Instant::now()`, moved only by
    /// [`advance`](Self::advance).
    pub fn manual() -> Self {
        TimeSource(Some(Arc::new(ManualClock {
            base: Instant::now(),
            offset_ns: AtomicU64::new(0),
        })))
    }

    /// The current instant on this source.
    #[inline]
    pub fn now(&self) -> Instant {
        match &self.0 {
            None => Instant::now(),
            Some(m) => m.now(),
        }
    }

    /// The instant to record for an event the caller already timed at `real` (read for its own
    /// timers): `real` itself on the real clock, so the hot path reads the clock only once.
    #[inline]
    pub fn observe(&self, real: Instant) -> Instant {
        match &self.0 {
            None => real,
            Some(m) => m.now(),
        }
    }

    /// The current time on the shared Unix-nanosecond timeline ([`Clock::global`]).
    pub fn unix_now(&self) -> UnixNanos {
        Clock::global().at(self.now())
    }

    /// Moves a manual clock forward by `by`; does nothing on the real clock.
    pub fn advance(&self, by: Duration) {
        if let Some(m) = &self.0 {
            m.offset_ns.fetch_add(
                u64::try_from(by.as_nanos()).unwrap_or(u64::MAX),
                Ordering::AcqRel,
            );
        }
    }

    /// True for a manual clock.
    pub fn is_manual(&self) -> bool {
        self.0.is_some()
    }
}

/// A clock that stands still until advanced: a fixed base plus an atomic offset (no lock, so
/// serving threads may read it while a test moves it).
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    offset_ns: AtomicU64,
}

impl ManualClock {
    fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.offset_ns.load(Ordering::Acquire))
    }
}

/// `CLOCK_MONOTONIC` now, in nanoseconds: unlike an [`Instant`], comparable across processes on
/// the same host (the simulator stamps `tm_sent_ns` with it; the overhead bench reads it too).
/// 0 if the call fails.
#[allow(unsafe_code)] // the crate's one `unsafe`, wrapped here so no caller needs it
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `clock_gettime` only writes a `timespec` through the pointer, and `ts` is a live,
    // properly aligned `timespec` owned by this frame for the whole call; CLOCK_MONOTONIC exists
    // on every Linux kernel, and a failure is reported through `rc`, not undefined behaviour.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    u64::try_from(ts.tv_sec).unwrap_or(0) * NANOS_PER_SEC + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Formats `ns` as RFC 3339 UTC with microseconds, e.g. `2026-11-29T18:27:33.123456Z`.
pub fn format_rfc3339_micros(ns: UnixNanos) -> String {
    let secs = (ns / NANOS_PER_SEC) as i64;
    let micros = (ns % NANOS_PER_SEC) / 1_000;
    let dt =
        time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        dt.year(),
        u8::from(dt.month()),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second(),
        micros
    )
}

/// Parses an RFC 3339 timestamp (any offset, any fraction) into Unix nanoseconds.
pub fn parse_rfc3339(s: &str) -> Option<UnixNanos> {
    let dt = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    u64::try_from(dt.unix_timestamp_nanos()).ok()
}

/// Milliseconds between two instants on the timeline, as a float.
pub fn millis_between(from: UnixNanos, to: UnixNanos) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_to_the_microsecond() {
        let ns = 1_795_976_853_123_456_000;
        let s = format_rfc3339_micros(ns);
        assert_eq!(s, "2026-11-29T18:27:33.123456Z");
        assert_eq!(parse_rfc3339(&s), Some(ns));
        assert_eq!(parse_rfc3339("2026-11-29T19:27:33.123456+01:00"), Some(ns));
    }

    #[test]
    fn a_manual_source_moves_only_when_advanced() {
        let t = TimeSource::manual();
        let a = t.now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(t.now(), a, "still");
        assert_eq!(
            t.observe(Instant::now()),
            a,
            "observe ignores the real reading"
        );
        t.advance(Duration::from_millis(7));
        assert_eq!(t.now() - a, Duration::from_millis(7));
        assert_eq!(
            t.clone().unix_now() - Clock::global().at(a),
            7_000_000,
            "clones share it"
        );
        let r = TimeSource::real();
        let before = Instant::now();
        r.advance(Duration::from_secs(60));
        assert!(r.now() >= before && r.now() - before < Duration::from_secs(60));
        let real = Instant::now();
        assert_eq!(r.observe(real), real);
    }

    #[test]
    fn clock_is_monotonic_and_near_wall_time() {
        let c = Clock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(wall.abs_diff(b) < NANOS_PER_SEC);
    }
}
