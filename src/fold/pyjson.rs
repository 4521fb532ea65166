//! JSON text as vLLM writes its non-streamed answers, for values copied out of its stream.
//!
//! vLLM serializes a stream's events with pydantic (`model_dump_json`), whose floats use the
//! shortest round-trip digits laid out like JavaScript (`0.00001`, `1e-7`, `1e16`), and a
//! non-streamed answer with Python's `json.dumps` (`JSONResponse`), whose floats are Python's
//! `repr` (`1e-05`, `1e-07`, `1e+16`). The digits are the same; only the layout differs, so a
//! float copied from the stream is laid out again here. Strings and integers are written alike by
//! both, so they are copied byte for byte.

/// Appends `raw` (one JSON value) to `out` with every float laid out as Python's `repr`.
///
/// Strings are copied verbatim (escapes included); a number is a float when it has a fraction or
/// an exponent. Returns `None` when a float does not parse (then `raw` was not valid JSON).
pub fn copy_with_python_floats(raw: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == b'"' {
            let end = string_end(raw, i)?;
            out.extend_from_slice(&raw[i..end]);
            i = end;
        } else if b == b'-' || b.is_ascii_digit() {
            let start = i;
            while i < raw.len() && matches!(raw[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
            {
                i += 1;
            }
            let num = &raw[start..i];
            if num.iter().any(|c| matches!(c, b'.' | b'e' | b'E')) {
                let x: f64 = std::str::from_utf8(num).ok()?.parse().ok()?;
                push_python_float(x, out);
            } else {
                out.extend_from_slice(num);
            }
        } else {
            out.push(b);
            i += 1;
        }
    }
    Some(())
}

/// Index just past the closing quote of the string opening at `start`.
fn string_end(raw: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < raw.len() {
        match raw[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// Appends Python's `repr(x)` of a finite float: the shortest digits that read back as `x`, in
/// fixed notation when the decimal exponent is in `-5 < e < 16` (with at least one fractional
/// digit), else `d.ddde±XX` with at least two exponent digits.
pub fn push_python_float(x: f64, out: &mut Vec<u8>) {
    if x == 0.0 {
        out.extend_from_slice(if x.is_sign_negative() {
            b"-0.0"
        } else {
            b"0.0"
        });
        return;
    }
    // Rust's `{:e}` is the shortest round-trip representation, as Python's repr is.
    let s = format!("{:e}", x.abs());
    let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    if x < 0.0 {
        out.push(b'-');
    }
    if (-5 < exp) && (exp < 16) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            for k in 0..int_len {
                out.push(*digits.get(k).unwrap_or(&b'0'));
            }
            out.push(b'.');
            if digits.len() > int_len {
                out.extend_from_slice(&digits[int_len..]);
            } else {
                out.push(b'0');
            }
        } else {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', (-exp - 1) as usize));
            out.extend_from_slice(&digits);
        }
    } else {
        out.push(digits[0]);
        if digits.len() > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if exp < 0 { b'-' } else { b'+' });
        let e = exp.unsigned_abs();
        if e < 10 {
            out.push(b'0');
        }
        out.extend_from_slice(e.to_string().as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(x: f64) -> String {
        let mut v = Vec::new();
        push_python_float(x, &mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn floats_are_laid_out_as_python_repr() {
        // Each right-hand side is what CPython 3 prints for repr(x).
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (-7.250851154327393, "-7.250851154327393"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.2345e-5, "-1.2345e-05"),
            (1.5e-7, "1.5e-07"),
            (-9999.0, "-9999.0"),
            (123456789012345.0, "123456789012345.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (0.1, "0.1"),
            (100.5, "100.5"),
        ];
        for (x, want) in cases {
            assert_eq!(py(x), want, "{x:e}");
        }
    }

    #[test]
    fn values_are_copied_with_floats_relaid_and_strings_untouched() {
        let raw = br#"{"token":"1e-5 \"0.00001\"","logprob":-0.00001,"bytes":[49,101],"top":[{"logprob":-1e-7}],"n":-3,"t":0.0}"#;
        let mut out = Vec::new();
        copy_with_python_floats(raw, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"token":"1e-5 \"0.00001\"","logprob":-1e-05,"bytes":[49,101],"top":[{"logprob":-1e-07}],"n":-3,"t":0.0}"#
        );
    }
}
