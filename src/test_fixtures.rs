//! The recorded vLLM wire samples (`tests/fixtures/vllm/`) for the library's unit tests.

/// The body of recorded response `name`: the bytes after its head, as vLLM sent them.
pub(crate) fn recorded_body(name: &str) -> Vec<u8> {
    let raw = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/vllm")
            .join(name),
    )
    .unwrap_or_else(|e| panic!("fixture {name}: {e}"));
    let start = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("fixture {name}: no head"))
        + 4;
    raw[start..].to_vec()
}
