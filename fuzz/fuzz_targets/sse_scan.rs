//! The SSE scanner and event summary on arbitrary bytes cut at arbitrary points: no panic, memory
//! bounded, and the same events whatever the split.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmeter::openai::summarize;
use tokenmeter::sse::SseScanner;

const MAX: usize = 512;

fn events(pieces: &[&[u8]]) -> Vec<(Vec<u8>, bool)> {
    let mut s = SseScanner::new(MAX);
    let mut out = Vec::new();
    for p in pieces {
        s.feed(p, |e| {
            assert!(e.data.len() <= MAX);
            let _ = summarize(e.data);
            out.push((e.data.to_vec(), e.oversize));
        });
        // One event's data plus one pending line, each bounded (see `SseScanner::new`).
        assert!(s.buffered() <= 2 * MAX + 6);
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    // The first byte picks a split size; the rest is the stream.
    let split = 1 + data[0] as usize;
    let stream = &data[1..];
    let whole = events(&[stream]);
    let pieces: Vec<&[u8]> = stream.chunks(split).collect();
    assert_eq!(events(&pieces), whole);
});
