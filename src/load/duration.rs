//! Parsing durations like `60s`, `2m`, `500ms`, `1m30s`, `1.5h`.

use std::time::Duration;

/// Parses a sequence of `<number><unit>` parts (units `ms`, `s`, `m`, `h`; a bare number is
/// seconds) and sums them; rejects empty input, unknown units and negative or huge values.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = s.parse::<f64>() {
        return secs_to_duration(secs, text);
    }
    let mut total = 0.0_f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("bad duration {text:?}: expected a number"));
        }
        let value: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("bad number in {text:?}"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 1e-3,
            "s" | "sec" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            "" => return Err(format!("bad duration {text:?}: unit missing after {value}")),
            u => return Err(format!("bad duration {text:?}: unknown unit {u:?}")),
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    secs_to_duration(total, text)
}

fn secs_to_duration(secs: f64, text: &str) -> Result<Duration, String> {
    // One week bounds every loop of the tool.
    if !secs.is_finite() || !(0.0..=7.0 * 86400.0).contains(&secs) {
        return Err(format!("duration {text:?} out of range (0 to 1 week)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_sums() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration(" 10 "), Ok(Duration::from_secs(10)));
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            "", "s", "10x", "-5s", "1e400", "10 s", "5m3", "..s", "8d", "NaN",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }
}
