//! The request body scan against serde's reading, on arbitrary bytes: wherever the scan says a
//! body is the usage injection's plain case (`"stream": true`, no `stream_options`), serde's
//! `RequestInfo` must say the same, or the proxy would edit a body it should not.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenmeter::proxy::request::RequestInfo;
use tokenmeter::proxy::request_scan::plain_stream;

fuzz_target!(|data: &[u8]| {
    if plain_stream(data) {
        let info = RequestInfo::parse(data);
        assert!(info.wants_injection() && !info.has_stream_options);
    }
});
