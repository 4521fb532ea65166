//! The hasher of the meter's maps keyed by request id, on the per-event path.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes request ids with one multiplication. The ids are the proxy's own counters, chosen by
/// nobody, so SipHash's resistance to chosen keys buys nothing, and its cost showed in the
/// instructions per streamed event (`scripts/callgrind.sh`; figures in docs/performance.md).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: the low bits (the bucket) of consecutive ids all differ, the high
        // bits (hashbrown's tags) are mixed.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by request id, hashed with [`IdHasher`].
pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;
/// A set of request ids, hashed with [`IdHasher`].
pub(crate) type IdSet = HashSet<u64, BuildHasherDefault<IdHasher>>;
