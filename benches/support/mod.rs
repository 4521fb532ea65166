//! What the benches share: the machine's load average (every result records it) and the
//! open-files limit raised for runs that hold thousands of streams.
#![allow(dead_code)]

/// `/proc/loadavg`'s first three fields.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Raises the soft open-files limit to the hard one (children inherit it) and returns it.
pub fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    // `None` is "unlimited", RLIM_INFINITY.
    let hard = getrlimit(Resource::Nofile).maximum;
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: hard,
            maximum: hard,
        },
    );
    hard.unwrap_or(u64::MAX)
}
