//! The access-log line of a [`RequestRecord`], written without serde_json's per-key work.
//!
//! serde's derived `Serialize` escapes every key of every line (about 50 keys, 650 bytes: most of
//! the writer thread's instructions per request). Here each key is one constant, and each value
//! goes through serde_json, so numbers, floats (`NaN` as `null`), enums and string escapes are
//! exactly serde_json's. The test below holds the line to `serde_json::to_vec` byte for byte:
//! a field added to the record and not here fails it.

use std::io::{self, Write};

use serde::Serialize;

use super::RequestRecord;

/// One value as serde_json writes it.
#[inline]
fn value<W: Write, T: Serialize + ?Sized>(out: &mut W, v: &T) -> io::Result<()> {
    v.serialize(&mut serde_json::Serializer::new(out))
        .map_err(io::Error::from)
}

/// Writes `{"type":..,"f1":v1,...}`: `kind` under its serde name `type`, then the other fields
/// under their own names, in declaration order (serde's).
/// Fields after the `;` are left out when `None` (serde's `skip_serializing_if`): the session
/// fields, which only agent calls have.
macro_rules! object {
    ($out:ident, $r:ident; $($f:ident),+ ; $($o:ident),+ $(,)?) => {{
        $out.write_all(b"{\"type\":")?;
        value($out, &$r.kind)?;
        $(
            $out.write_all(concat!(",\"", stringify!($f), "\":").as_bytes())?;
            value($out, &$r.$f)?;
        )+
        $(
            if let Some(v) = &$r.$o {
                $out.write_all(concat!(",\"", stringify!($o), "\":").as_bytes())?;
                value($out, v)?;
            }
        )+
        $out.write_all(b"}\n")
    }};
}

/// Writes `r` as one JSON line, newline included.
pub(super) fn write<W: Write>(out: &mut W, r: &RequestRecord) -> io::Result<()> {
    object!(out, r;
        schema,
        ts,
        ts_ns,
        request_id,
        client_request_id,
        upstream,
        user,
        user_source,
        model,
        method,
        path,
        user_agent,
        client_ip,
        status,
        stream,
        outcome,
        api,
        prompt_tokens,
        completion_tokens,
        cached_prompt_tokens,
        reasoning_tokens,
        tokens_source,
        n,
        first_byte_ms,
        ttft_ms,
        ttft_source,
        ttft_fallback,
        bench_ttft_ms,
        e2e_ms,
        tpot_ms,
        itl_max_ms,
        itl_mean_ms,
        itl_p50_ms,
        itl_p99_ms,
        tok_s,
        decode_tok_s,
        slo_ok,
        slo_miss,
        in_flight_at_start,
        cold_start,
        finish_reason,
        bytes_in,
        bytes_out,
        error,
        server_queue_ms,
        server_ttft_ms,
        server_mean_itl_ms,
        token_curve;
        session,
        session_source,
        turn,
        session_call,
        session_gap_ms,
        prefix_expected_tokens,
        prefix_lost_tokens,
        prefix_audit,
    )
}

#[cfg(test)]
mod tests {
    use crate::dialect::Api;
    use crate::record::{Outcome, RequestRecord, TokensSource, UserSource};

    /// A streamed chat request's line as the proxy wrote it.
    const LINE: &str = r#"{"type":"request","schema":1,"ts":"2026-12-02T13:35:21.686939Z","ts_ns":1796218521686939762,"request_id":"tm-6b101e99-00000002","client_request_id":null,"upstream":"127.0.0.1:18101","user":"key-bf287c5d","user_source":"key_hash","model":"sim-model","method":"POST","path":"/v1/chat/completions","user_agent":"curl/7.88.1","client_ip":null,"status":200,"stream":true,"outcome":"ok","api":"chat","prompt_tokens":8,"completion_tokens":64,"cached_prompt_tokens":null,"reasoning_tokens":null,"tokens_source":"usage","n":null,"first_byte_ms":38.840972,"ttft_ms":47.856691,"ttft_source":"stream","ttft_fallback":null,"bench_ttft_ms":38.840972,"e2e_ms":100.611412,"tpot_ms":0.8373765238095239,"itl_max_ms":1.222245,"itl_mean_ms":0.7699558888888889,"itl_p50_ms":1.1387886347566916,"itl_p99_ms":1.222245,"tok_s":636.1107425865368,"decode_tok_s":1194.2059176087766,"slo_ok":null,"slo_miss":null,"in_flight_at_start":1,"cold_start":true,"finish_reason":"length","bytes_in":95,"bytes_out":14587,"error":null,"server_queue_ms":null,"server_ttft_ms":null,"server_mean_itl_ms":null,"token_curve":[48,1,53,63]}"#;

    fn record() -> RequestRecord {
        serde_json::from_str(LINE).unwrap()
    }

    fn same_as_serde(r: &RequestRecord) {
        let mut want = serde_json::to_vec(r).unwrap();
        want.push(b'\n');
        let got = r.to_json_line();
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want)
        );
    }

    #[test]
    fn lines_are_serde_json_s_byte_for_byte() {
        let r = record();
        same_as_serde(&r);
        assert_eq!(r.to_json_line(), format!("{LINE}\n").into_bytes());
        // Every optional field set, strings that need escapes, floats serde writes as null.
        let mut r = record();
        r.client_request_id = Some("ab\"c\\d\u{1}".into());
        r.upstream = Some("gpu-ä/1".into());
        r.user = "line\nbreak\ttab \u{7f} \u{2028}".into();
        r.user_source = UserSource::Body;
        r.model = Some("m\u{0}".into());
        r.user_agent = Some("é✓ agent/1".into());
        r.client_ip = Some("::1".into());
        r.status = Some(599);
        r.stream = Some(false);
        r.outcome = Outcome::ClientAborted;
        r.api = Some(Api::Messages);
        r.cached_prompt_tokens = Some(u64::MAX);
        r.reasoning_tokens = Some(0);
        r.tokens_source = TokensSource::Counted;
        r.n = Some(u32::MAX);
        r.ttft_ms = Some(f64::NAN);
        r.ttft_source = Some("upstream_stream".into());
        r.ttft_fallback = Some("why".into());
        r.bench_ttft_ms = Some(f64::INFINITY);
        r.e2e_ms = Some(-0.0);
        r.tpot_ms = Some(1e-300);
        r.itl_max_ms = Some(1.5e300);
        r.itl_mean_ms = Some(0.1 + 0.2);
        r.finish_reason = Some("stop".into());
        r.error = Some("x\u{1f}y".into());
        r.server_queue_ms = Some(3.25);
        r.server_ttft_ms = Some(f64::NEG_INFINITY);
        r.server_mean_itl_ms = Some(12.0);
        r.session = Some("s-3f2a9c01b4d7".into());
        r.session_source = Some(crate::record::SessionSource::MetadataUserId);
        r.turn = Some(2);
        r.session_call = Some(4);
        r.session_gap_ms = Some(812.5);
        r.prefix_expected_tokens = Some(12016);
        r.prefix_lost_tokens = Some(0);
        r.prefix_audit = Some("kept".into());
        same_as_serde(&r);
        // Every optional field unset.
        let mut r = record();
        r.client_request_id = None;
        r.upstream = None;
        r.model = None;
        r.user_agent = None;
        r.client_ip = None;
        r.status = None;
        r.stream = None;
        r.api = None;
        r.prompt_tokens = None;
        r.completion_tokens = None;
        r.n = None;
        r.first_byte_ms = None;
        r.ttft_ms = None;
        r.e2e_ms = None;
        r.finish_reason = None;
        r.error = None;
        r.token_curve = None;
        same_as_serde(&r);
    }
}
