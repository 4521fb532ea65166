//! The event summary's fast path against serde's reading, on arbitrary bytes: wherever the
//! skimmer answers, it must give serde's answer, read alone or after the events of a stream
//! before it (the input's lines, which teach the memo its prefix and template).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmeter::openai::{summarize, summarize_in_stream, summarize_reference, EventMemo};

fuzz_target!(|data: &[u8]| {
    assert_eq!(summarize(data), summarize_reference(data));
    let mut memo = EventMemo::default();
    for event in data.split(|&b| b == b'\n') {
        assert_eq!(
            summarize_in_stream(event, &mut memo),
            summarize_reference(event)
        );
    }
});
