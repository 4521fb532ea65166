//! Order-independent per-second accumulators for replaying a log, stored sparsely in chunks so
//! memory follows the number of active seconds, whatever the timestamps.

use std::collections::BTreeMap;

use crate::clock::{UnixNanos, NANOS_PER_SEC};

/// Seconds per storage chunk (a power of two, so the chunk of a second is a shift away).
const CHUNK_SECS: u64 = 256;

/// What the records contributed to one second; every field is a sum, so records may arrive in any
/// order and partial accumulators merge by addition.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SecondAcc {
    /// Completion tokens attributed to this second.
    pub gen_tokens: f64,
    /// Prompt tokens attributed to this second.
    pub prompt_tokens: f64,
    /// Requests whose arrival falls in this second.
    pub requests_started: u32,
    /// Requests whose end falls in this second.
    pub requests_finished: u32,
    /// Finished requests whose outcome counts as an error.
    pub errors: u32,
    /// Finished requests refused for the client's own fault (`client_error`).
    pub client_errors: u32,
    /// Level changes (+1 start, -1 end) exactly at this second's first instant: they set the
    /// level carried into the second rather than happening inside it.
    pub boundary_delta: i64,
    /// Starts strictly inside the second.
    pub inside_starts: u32,
    /// Ends strictly inside the second.
    pub inside_ends: u32,
    /// Sum over inside events of delta x (second end - event time), level x ns: what the events
    /// add to the area of this second on top of the carried-in level x 1 s.
    pub area_delta_ns: i64,
    /// Wrapping sum over inside events of delta x [`instant_hash`]`(t)`: 0 when the changes at
    /// every instant cancel out (an end and a start at the same nanosecond), so the level never
    /// changed for any length of time; otherwise 0 only by a 2^-64 coincidence.
    pub net_check: u64,
}

/// A well-mixed 64-bit hash of an instant (SplitMix64's finalizer), for [`SecondAcc::net_check`].
pub fn instant_hash(t: UnixNanos) -> u64 {
    let mut z = t.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SecondAcc {
    /// Adds every field of `other`.
    pub fn merge(&mut self, other: &SecondAcc) {
        self.gen_tokens += other.gen_tokens;
        self.prompt_tokens += other.prompt_tokens;
        self.requests_started += other.requests_started;
        self.requests_finished += other.requests_finished;
        self.errors += other.errors;
        self.client_errors += other.client_errors;
        self.boundary_delta += other.boundary_delta;
        self.inside_starts += other.inside_starts;
        self.inside_ends += other.inside_ends;
        self.area_delta_ns += other.area_delta_ns;
        self.net_check = self.net_check.wrapping_add(other.net_check);
    }

    /// Whether nothing was ever added (an idle second, unless a level is carried through it).
    pub fn is_empty(&self) -> bool {
        *self == SecondAcc::default()
    }

    /// Records a level change of `delta` at `t`, which lies in this second.
    pub fn level_event(&mut self, t: UnixNanos, delta: i64) {
        let into = t % NANOS_PER_SEC;
        if into == 0 {
            self.boundary_delta += delta;
            return;
        }
        if delta > 0 {
            self.inside_starts += 1;
        } else {
            self.inside_ends += 1;
        }
        self.area_delta_ns += delta * (NANOS_PER_SEC - into) as i64;
        let h = instant_hash(t);
        self.net_check = if delta > 0 {
            self.net_check.wrapping_add(h)
        } else {
            self.net_check.wrapping_sub(h)
        };
    }
}

type Chunk = Box<[SecondAcc; CHUNK_SECS as usize]>;

/// Sparse map from Unix second to [`SecondAcc`], in chunks of [`CHUNK_SECS`] seconds.
#[derive(Debug, Clone, Default)]
pub struct SecondStore {
    /// Chunk number to its index in `chunks` (ordered, for the sweep).
    index: BTreeMap<u64, usize>,
    chunks: Vec<Chunk>,
    /// The last chunk used: consecutive seconds of one spread hit it without a map lookup.
    last: Option<(u64, usize)>,
}

impl SecondStore {
    /// An empty store.
    pub fn new() -> Self {
        SecondStore::default()
    }

    /// The accumulator of second `sec`, created (zeroed) when absent.
    pub fn at(&mut self, sec: u64) -> &mut SecondAcc {
        let key = sec / CHUNK_SECS;
        let idx = match self.last {
            Some((k, i)) if k == key => i,
            _ => {
                let next = self.chunks.len();
                let i = *self.index.entry(key).or_insert(next);
                if i == next {
                    self.chunks
                        .push(Box::new([SecondAcc::default(); CHUNK_SECS as usize]));
                }
                self.last = Some((key, i));
                i
            }
        };
        &mut self.chunks[idx][(sec % CHUNK_SECS) as usize]
    }

    /// Adds everything in `other` into `self`.
    pub fn merge(&mut self, other: SecondStore) {
        let mut theirs: Vec<Option<Chunk>> = other.chunks.into_iter().map(Some).collect();
        for (key, idx) in other.index {
            let Some(chunk) = theirs.get_mut(idx).and_then(Option::take) else {
                continue;
            };
            match self.index.get(&key) {
                Some(&mine) => self.chunks[mine]
                    .iter_mut()
                    .zip(chunk.iter())
                    .for_each(|(a, b)| a.merge(b)),
                None => {
                    self.index.insert(key, self.chunks.len());
                    self.chunks.push(chunk);
                }
            }
        }
        self.last = None;
    }

    /// Every non-empty second in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &SecondAcc)> + '_ {
        self.index.iter().flat_map(move |(&key, &idx)| {
            self.chunks[idx]
                .iter()
                .enumerate()
                .filter(|(_, acc)| !acc.is_empty())
                .map(move |(i, acc)| (key * CHUNK_SECS + i as u64, acc))
        })
    }

    /// Heap bytes held by the chunks (for memory accounting).
    pub fn heap_bytes(&self) -> usize {
        self.chunks.len() * std::mem::size_of::<[SecondAcc; CHUNK_SECS as usize]>()
    }
}
