//! JSON-lines access log (stub: counters only until the writer lands).

use std::sync::atomic::AtomicU64;

/// Counters the access-log writer keeps, shown in `/stats` and the process log.
#[derive(Debug, Default)]
pub struct AccessLogCounters {
    /// Lines written to the file.
    pub written: AtomicU64,
    /// Records dropped because the channel was full or the writer was gone.
    pub dropped: AtomicU64,
    /// Records lost to write errors (full disk, unwritable file).
    pub failed: AtomicU64,
}
