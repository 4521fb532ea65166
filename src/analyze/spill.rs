//! The per-request context pass 2 needs, spilled to temporary files during pass 1 so the logs
//! are parsed only once and memory stays independent of the number of lines: 53 bytes per
//! generation request (arrival ns, end ns, tok/s or NaN, `in_flight_at_start`, the first-token
//! instant, the start of the decode interval, the completion tokens, the length of its token
//! curve and the service-level verdict) followed by its token curve (4 bytes a value), written
//! in runs sorted by arrival (at most [`RUN_ENTRIES`] entries and [`RUN_CURVE_VALUES`] curve
//! values in memory at a time) and read back as one stream in arrival order by a k-way merge of
//! the runs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::UnixNanos;

/// Bytes per spilled request, before its curve.
pub const ENTRY_BYTES: usize = 53;
/// Entries sorted in memory before a run is written (8 MiB).
pub const RUN_ENTRIES: usize = 1 << 18;
/// Curve values held in memory before a run is written (4 MiB).
pub const RUN_CURVE_VALUES: usize = 1 << 20;

/// One spilled request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpillEntry {
    /// Arrival, Unix ns.
    pub start: UnixNanos,
    /// End, Unix ns.
    pub end: UnixNanos,
    /// completion_tokens / e2e; NaN when unknown.
    pub tok_s: f64,
    /// Requests in flight at arrival (the mean-level fallback for zero-length requests).
    pub in_flight_at_start: u32,
    /// The first token's instant (arrival + TTFT), Unix ns; 0 when unknown.
    pub first_token: UnixNanos,
    /// Start of the interval the completion tokens are spread over (see `generation_interval`).
    pub gen_from: UnixNanos,
    /// Completion tokens; NaN when unknown.
    pub completion_tokens: f64,
    /// The service-level verdict, [`encode_verdict`]'s code.
    pub slo: u8,
}

/// A verdict as one byte: 0 not judged, 1 met, 2 + the miss's index in [`SloMiss::ALL`].
pub fn encode_verdict(v: Option<crate::slo::Verdict>) -> u8 {
    use crate::slo::SloMiss;
    match v {
        None => 0,
        Some(Ok(())) => 1,
        Some(Err(m)) => 2 + SloMiss::ALL.iter().position(|x| *x == m).unwrap_or(0) as u8,
    }
}

/// The verdict of [`encode_verdict`]'s code.
pub fn decode_verdict(code: u8) -> Option<crate::slo::Verdict> {
    use crate::slo::SloMiss;
    match code {
        0 => None,
        1 => Some(Ok(())),
        c => SloMiss::ALL.get(usize::from(c - 2)).map(|m| Err(*m)),
    }
}

impl SpillEntry {
    fn encode(&self, curve_len: u32) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..8].copy_from_slice(&self.start.to_le_bytes());
        b[8..16].copy_from_slice(&self.end.to_le_bytes());
        b[16..24].copy_from_slice(&self.tok_s.to_le_bytes());
        b[24..28].copy_from_slice(&self.in_flight_at_start.to_le_bytes());
        b[28..36].copy_from_slice(&self.first_token.to_le_bytes());
        b[36..44].copy_from_slice(&self.gen_from.to_le_bytes());
        b[44..48].copy_from_slice(&(self.completion_tokens as f32).to_le_bytes());
        b[48..52].copy_from_slice(&curve_len.to_le_bytes());
        b[52] = self.slo;
        b
    }

    /// The entry and the length of the curve that follows it.
    fn decode(b: &[u8; ENTRY_BYTES]) -> (SpillEntry, u32) {
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            x
        };
        let u32_at = |i: usize| {
            let mut x = [0u8; 4];
            x.copy_from_slice(&b[i..i + 4]);
            x
        };
        let e = SpillEntry {
            start: u64::from_le_bytes(u64_at(0)),
            end: u64::from_le_bytes(u64_at(8)),
            tok_s: f64::from_le_bytes(u64_at(16)),
            in_flight_at_start: u32::from_le_bytes(u32_at(24)),
            first_token: u64::from_le_bytes(u64_at(28)),
            gen_from: u64::from_le_bytes(u64_at(36)),
            completion_tokens: f32::from_le_bytes(u32_at(44)) as f64,
            slo: b[52],
        };
        (e, u32::from_le_bytes(u32_at(48)))
    }
}

/// A temporary spill file of sorted runs, removed on drop.
#[derive(Debug)]
pub struct Spill {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
    /// Entries of the run being gathered, each with its curve's place in `curves`.
    pending: Vec<(SpillEntry, u32, u32)>,
    curves: Vec<u32>,
    /// (first byte, entries) of every written run.
    runs: Vec<(u64, u64)>,
    written: u64,
    written_bytes: u64,
}

impl Spill {
    /// Creates an empty spill file in the system temp directory.
    pub fn create() -> io::Result<Spill> {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "tokenmeter-analyze-{}-{}-{}.spill",
            std::process::id(),
            crate::clock::Clock::global().now(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let file = File::create(&path)?;
        Ok(Spill {
            path,
            writer: Some(BufWriter::with_capacity(1 << 16, file)),
            pending: Vec::new(),
            curves: Vec::new(),
            runs: Vec::new(),
            written: 0,
            written_bytes: 0,
        })
    }

    /// Appends one entry and its token curve (empty: none).
    pub fn push(&mut self, e: SpillEntry, curve: &[u32]) -> io::Result<()> {
        let at = self.curves.len() as u32;
        self.curves.extend_from_slice(curve);
        self.pending.push((e, at, curve.len() as u32));
        if self.pending.len() >= RUN_ENTRIES || self.curves.len() >= RUN_CURVE_VALUES {
            self.write_run()?;
        }
        Ok(())
    }

    fn write_run(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let Some(w) = self.writer.as_mut() else {
            return Err(io::Error::other("spill already read"));
        };
        self.pending.sort_unstable_by_key(|e| e.0.start);
        let first_byte = self.written_bytes;
        for &(e, at, len) in &self.pending {
            w.write_all(&e.encode(len))?;
            for v in &self.curves[at as usize..(at + len) as usize] {
                w.write_all(&v.to_le_bytes())?;
            }
            self.written_bytes += ENTRY_BYTES as u64 + 4 * u64::from(len);
        }
        let n = self.pending.len() as u64;
        self.runs.push((first_byte, n));
        self.written += n;
        self.pending.clear();
        self.curves.clear();
        Ok(())
    }

    fn finish_writing(&mut self) -> io::Result<()> {
        self.write_run()?;
        if let Some(mut w) = self.writer.take() {
            w.flush()?;
        }
        Ok(())
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        self.writer.take();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A cursor over one run.
struct RunReader {
    reader: BufReader<File>,
    left: u64,
    /// The curve of the entry last read.
    curve: Vec<u32>,
}

impl RunReader {
    fn next(&mut self) -> io::Result<Option<SpillEntry>> {
        if self.left == 0 {
            return Ok(None);
        }
        let mut b = [0u8; ENTRY_BYTES];
        self.reader.read_exact(&mut b)?;
        self.left -= 1;
        let (e, len) = SpillEntry::decode(&b);
        self.curve.clear();
        let mut v = [0u8; 4];
        for _ in 0..len {
            self.reader.read_exact(&mut v)?;
            self.curve.push(u32::from_le_bytes(v));
        }
        Ok(Some(e))
    }
}

/// Calls `visit` for every entry of every spill, with its token curve (empty: none), in arrival
/// order (ties in any order).
pub fn for_each_by_start(
    spills: &mut [Spill],
    mut visit: impl FnMut(&SpillEntry, &[u32]),
) -> io::Result<()> {
    let mut readers = Vec::new();
    for s in spills.iter_mut() {
        s.finish_writing()?;
        for &(first, n) in &s.runs {
            let mut f = File::open(&s.path)?;
            f.seek(SeekFrom::Start(first))?;
            readers.push(RunReader {
                reader: BufReader::with_capacity(1 << 15, f),
                left: n,
                curve: Vec::new(),
            });
        }
    }
    let mut heads: Vec<Option<SpillEntry>> = Vec::with_capacity(readers.len());
    let mut heap = BinaryHeap::new();
    for (i, r) in readers.iter_mut().enumerate() {
        let head = r.next()?;
        if let Some(e) = &head {
            heap.push(Reverse((e.start, i)));
        }
        heads.push(head);
    }
    while let Some(Reverse((_, i))) = heap.pop() {
        if let Some(e) = heads[i].take() {
            visit(&e, &readers[i].curve);
        }
        heads[i] = readers[i].next()?;
        if let Some(e) = &heads[i] {
            heap.push(Reverse((e.start, i)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_into_arrival_order_and_files_are_removed() {
        let mut a = Spill::create().unwrap();
        let mut b = Spill::create().unwrap();
        let paths = [a.path.clone(), b.path.clone()];
        let n = RUN_ENTRIES as u64 * 2 + 17;
        for i in 0..n {
            // A scrambled order of arrivals 0..2n over two spills.
            let start = (i * 7919) % n * 2;
            let e = SpillEntry {
                start,
                end: start + 5,
                tok_s: 1.5,
                in_flight_at_start: 3,
                first_token: start + 1,
                gen_from: start + 1,
                completion_tokens: 12.0,
                slo: 3,
            };
            // Every third entry of `a` has a curve of its own (a function of its arrival).
            let curve: Vec<u32> = if i % 3 == 0 {
                vec![start as u32, 1, 2, start as u32 % 7]
            } else {
                Vec::new()
            };
            a.push(e, &curve).unwrap();
            b.push(
                SpillEntry {
                    start: start + 1,
                    ..e
                },
                &[],
            )
            .unwrap();
        }
        assert_eq!(a.runs.len(), 2);
        let mut spills = [a, b];
        let mut got = Vec::new();
        let mut curves = 0;
        for_each_by_start(&mut spills, |e, c| {
            got.push(e.start);
            if !c.is_empty() {
                curves += 1;
                assert_eq!(c, [e.start as u32, 1, 2, e.start as u32 % 7]);
            }
        })
        .unwrap();
        assert_eq!(got, (0..2 * n).collect::<Vec<_>>());
        assert_eq!(curves, n.div_ceil(3));
        drop(spills);
        assert!(paths.iter().all(|p| !p.exists()));
    }
}
