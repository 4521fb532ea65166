//! The event summary's fast path against serde's reading, on arbitrary bytes: wherever the
//! skimmer answers, it must give serde's answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmeter::openai::{summarize, summarize_reference};

fuzz_target!(|data: &[u8]| {
    assert_eq!(summarize(data), summarize_reference(data));
});
