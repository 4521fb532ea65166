//! Pass 1 in parallel: this thread reads (and decompresses) the inputs into chunks of whole
//! lines; workers parse them into their own order-independent accumulators, merged at the end.
//! The channel is bounded, so memory is a few chunks per worker whatever the input size.

use std::sync::mpsc::sync_channel;
use std::sync::Mutex;

use super::collect::Pass1;
use super::filter::Filter;
use super::input::{Chunk, Chunker, Source};

/// Most worker threads used.
pub const MAX_WORKERS: usize = 4;

/// Runs pass 1 over every source.
pub fn pass1(
    sources: &[Source],
    filter: &Filter,
    slo: &crate::slo::SloConfig,
) -> anyhow::Result<Pass1> {
    let workers = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .clamp(1, MAX_WORKERS);
    let (tx, rx) = sync_channel::<Chunk>(workers * 2);
    let rx = Mutex::new(rx);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut acc = Pass1::new(*slo);
                    loop {
                        // Held only to take one chunk (a megabyte of lines), never while parsing.
                        let next = match rx.lock() {
                            Ok(guard) => guard.recv(),
                            Err(_) => break,
                        };
                        let Ok(chunk) = next else { break };
                        // After a failure keep draining, so the reader never blocks on a full channel.
                        let Ok(p) = acc.as_mut() else { continue };
                        for (line_no, line) in chunk.lines() {
                            if let Err(e) = p.line(chunk.source, line_no, line, filter) {
                                acc = Err(e);
                                break;
                            }
                        }
                    }
                    acc
                })
            })
            .collect();
        let mut read_errors = Vec::new();
        'sources: for (idx, source) in sources.iter().enumerate() {
            let reader = match source.reader() {
                Ok(r) => r,
                Err(e) => {
                    read_errors.push((idx, e.to_string()));
                    continue;
                }
            };
            let mut chunker = Chunker::new(reader, idx);
            loop {
                match chunker.next_chunk() {
                    Ok(Some(chunk)) => {
                        if tx.send(chunk).is_err() {
                            break 'sources;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        read_errors.push((idx, e.to_string()));
                        break;
                    }
                }
            }
        }
        drop(tx);
        let mut total: Option<Pass1> = None;
        for h in handles {
            let part = h
                .join()
                .map_err(|_| anyhow::anyhow!("analyze worker panicked"))??;
            match total.as_mut() {
                Some(t) => t.merge(part),
                None => total = Some(part),
            }
        }
        let mut total = total.unwrap_or_default();
        total.counts.read_errors.extend(read_errors);
        total.counts.read_errors.sort();
        total.cold_starts.sort_by_key(|c| c.ts_ns);
        total
            .cold_starts
            .truncate(super::collect::COLD_STARTS_LISTED);
        Ok(total)
    })
}
