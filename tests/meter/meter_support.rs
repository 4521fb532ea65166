//! Builders shared by the meter tests.

use tokenmeter::clock::{UnixNanos, NANOS_PER_SEC};
use tokenmeter::record::{DerivedRates, RequestRecord};

/// A fixed base time: 2026-11-29T18:00:00Z, on a second boundary.
pub const T0: UnixNanos = 1_795_975_200 * NANOS_PER_SEC;

/// `T0 + s` seconds.
pub fn at(s: f64) -> UnixNanos {
    T0 + (s * 1e9).round() as u64
}

/// A successful generation record of user `alice`; rates derived from the given figures (the
/// analyze fixtures' record with the counts given here).
pub fn record(
    start: UnixNanos,
    e2e_ms: f64,
    ttft_ms: Option<f64>,
    completion: Option<u64>,
    prompt: Option<u64>,
    stream: bool,
) -> RequestRecord {
    let base = tokenmeter::analyze::synth::record(start, e2e_ms, ttft_ms, 0, stream, "alice");
    let rates = DerivedRates::compute(ttft_ms, Some(e2e_ms), completion);
    RequestRecord {
        request_id: "r".into(),
        upstream: None,
        prompt_tokens: prompt,
        completion_tokens: completion,
        tpot_ms: rates.tpot_ms,
        tok_s: rates.tok_s,
        decode_tok_s: rates.decode_tok_s,
        bytes_in: 100,
        bytes_out: 1000,
        ..base
    }
}

/// Whether two floats agree to 1e-9 relative (or absolute near 0).
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// The same JSON document, numbers [`close`]; `at` names the place in failures.
pub fn json_close(a: &serde_json::Value, b: &serde_json::Value, at: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(close(x, y), "{at}: {x} vs {y}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                json_close(x, y, &format!("{at}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, v) in x {
                json_close(v, &y[k], &format!("{at}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// A simulator sink that records every event a request's stream was sent, for tests that step
/// the engine in simulated time and read the events back.
#[derive(Clone, Default)]
pub struct Rec(pub std::rc::Rc<std::cell::RefCell<Vec<tokenmeter::sim::engine::Ev>>>);

impl tokenmeter::sim::engine::Sink for Rec {
    fn is_closed(&self) -> bool {
        false
    }
    fn deliver(&mut self, ev: tokenmeter::sim::engine::Ev) -> bool {
        self.0.borrow_mut().push(ev);
        true
    }
}
