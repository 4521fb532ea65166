//! The process's own resource use (CPU time, resident memory, open descriptors), read from
//! `/proc` on Linux; elsewhere nothing is reported rather than a made-up zero.

/// What the kernel reports about this process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU time, seconds.
    pub cpu_s: f64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// When the process started, seconds since the Unix epoch.
    pub start_time_s: f64,
}

impl ProcessStats {
    /// Reads `/proc/self`; `None` where it cannot be read. `start_time_s` is passed in: the
    /// caller knows when it started, and `/proc` gives it only relative to boot.
    pub fn read(start_time_s: f64) -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        // The command name (field 2) is in parentheses and may hold spaces: split after it.
        let rest = &stat[stat.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state is field 3, utime 14 and stime 15 (1-based, man proc).
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse()
            .ok()?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
        Some(ProcessStats {
            cpu_s: (utime + stime) as f64 / USER_HZ,
            rss_bytes: rss_kib * 1024,
            // read_dir itself holds one descriptor while counting.
            open_fds: open_fds.saturating_sub(1),
            start_time_s,
        })
    }
}

/// Clock ticks per second of `/proc`'s CPU times: Linux fixes USER_HZ at 100 for userspace on
/// every architecture (what `sysconf(_SC_CLK_TCK)` returns), whatever the kernel's own HZ.
const USER_HZ: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process() {
        let before = ProcessStats::read(1.0).expect("linux /proc");
        // Burn a little CPU and open a file: both must show.
        let mut x = 0u64;
        for i in 0..30_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let after = ProcessStats::read(1.0).unwrap();
        assert!(after.cpu_s >= before.cpu_s);
        assert!(after.open_fds > before.open_fds, "{before:?} {after:?}");
        assert!(after.rss_bytes > 1 << 20);
        drop(f);
    }
}
