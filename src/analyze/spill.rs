//! The per-request context pass 2 needs, spilled to a temporary file during pass 1 so the logs
//! are parsed only once and memory stays independent of the number of lines: 28 bytes per
//! generation request with a `tok_s` (arrival ns, end ns, tok/s, `in_flight_at_start`).

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::UnixNanos;

/// Bytes per spilled request.
pub const ENTRY_BYTES: usize = 28;

/// One spilled request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpillEntry {
    /// Arrival, Unix ns.
    pub start: UnixNanos,
    /// End, Unix ns.
    pub end: UnixNanos,
    /// completion_tokens / e2e.
    pub tok_s: f64,
    /// Requests in flight at arrival (the mean-level fallback for zero-length requests).
    pub in_flight_at_start: u32,
}

/// A temporary spill file, removed on drop.
#[derive(Debug)]
pub struct Spill {
    path: PathBuf,
    writer: Option<BufWriter<File>>,
    entries: u64,
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
            entries: 0,
        })
    }

    /// Appends one entry.
    pub fn push(&mut self, e: &SpillEntry) -> io::Result<()> {
        let mut b = [0u8; ENTRY_BYTES];
        b[0..8].copy_from_slice(&e.start.to_le_bytes());
        b[8..16].copy_from_slice(&e.end.to_le_bytes());
        b[16..24].copy_from_slice(&e.tok_s.to_le_bytes());
        b[24..28].copy_from_slice(&e.in_flight_at_start.to_le_bytes());
        if let Some(w) = self.writer.as_mut() {
            w.write_all(&b)?;
            self.entries += 1;
        }
        Ok(())
    }

    /// Entries written.
    pub fn len(&self) -> u64 {
        self.entries
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Flushes and calls `visit` for every entry in writing order.
    pub fn for_each(&mut self, mut visit: impl FnMut(&SpillEntry)) -> io::Result<()> {
        if let Some(mut w) = self.writer.take() {
            w.flush()?;
        }
        let mut r = BufReader::with_capacity(1 << 16, File::open(&self.path)?);
        let mut b = [0u8; ENTRY_BYTES];
        for _ in 0..self.entries {
            r.read_exact(&mut b)?;
            let u64_at = |i: usize| {
                let mut x = [0u8; 8];
                x.copy_from_slice(&b[i..i + 8]);
                x
            };
            let mut ifs = [0u8; 4];
            ifs.copy_from_slice(&b[24..28]);
            visit(&SpillEntry {
                start: u64::from_le_bytes(u64_at(0)),
                end: u64::from_le_bytes(u64_at(8)),
                tok_s: f64::from_le_bytes(u64_at(16)),
                in_flight_at_start: u32::from_le_bytes(ifs),
            });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_the_file_is_removed() {
        let mut s = Spill::create().unwrap();
        let path = s.path.clone();
        let e = SpillEntry {
            start: 7,
            end: 9,
            tok_s: 1.5,
            in_flight_at_start: 3,
        };
        s.push(&e).unwrap();
        s.push(&SpillEntry { start: 1, ..e }).unwrap();
        let mut got = vec![];
        s.for_each(|x| got.push(*x)).unwrap();
        assert_eq!(got, vec![e, SpillEntry { start: 1, ..e }]);
        drop(s);
        assert!(!path.exists());
    }
}
