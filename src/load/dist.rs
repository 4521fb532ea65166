//! Distributions of think times and request sizes for agent-like load, parsed from the command
//! line: `500` (always 500), `200..3000` (uniform, both ends included), `exp:1500` (exponential
//! with mean 1500, the memoryless think time of independent users).

use rand::Rng;
use serde::Serialize;

/// A distribution of non-negative integers (milliseconds, words or tokens, per the flag).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Dist {
    /// Always `value`.
    Fixed {
        /// The value.
        value: u64,
    },
    /// Uniform over `min..=max`.
    Uniform {
        /// Smallest value.
        min: u64,
        /// Largest value.
        max: u64,
    },
    /// Exponential with this mean (rounded to an integer).
    Exponential {
        /// The mean.
        mean: f64,
    },
}

impl Dist {
    /// Parses `N`, `MIN..MAX` or `exp:MEAN`.
    pub fn parse(text: &str) -> Result<Dist, String> {
        let t = text.trim();
        let int = |s: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("{s:?} is not a whole number (in {text:?})"))
        };
        if let Some(mean) = t.strip_prefix("exp:") {
            let mean: f64 = mean
                .trim()
                .parse()
                .map_err(|_| format!("bad mean in {text:?}"))?;
            if !(mean.is_finite() && mean >= 0.0) {
                return Err(format!("the mean must be >= 0 in {text:?}"));
            }
            return Ok(Dist::Exponential { mean });
        }
        if let Some((a, b)) = t.split_once("..") {
            let (min, max) = (int(a)?, int(b)?);
            if min > max {
                return Err(format!("{min} > {max} in {text:?}"));
            }
            return Ok(Dist::Uniform { min, max });
        }
        Ok(Dist::Fixed { value: int(t)? })
    }

    /// One draw.
    pub fn sample(&self, rng: &mut impl Rng) -> u64 {
        match *self {
            Dist::Fixed { value } => value,
            Dist::Uniform { min, max } => rng.gen_range(min..=max),
            Dist::Exponential { mean } => {
                let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
                (-u.ln() * mean).round().min(u64::MAX as f64 / 2.0) as u64
            }
        }
    }

    /// The distribution's mean.
    pub fn mean(&self) -> f64 {
        match *self {
            Dist::Fixed { value } => value as f64,
            Dist::Uniform { min, max } => (min as f64 + max as f64) / 2.0,
            Dist::Exponential { mean } => mean,
        }
    }
}

impl std::fmt::Display for Dist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dist::Fixed { value } => write!(f, "{value}"),
            Dist::Uniform { min, max } => write!(f, "{min}..{max}"),
            Dist::Exponential { mean } => write!(f, "exp:{mean}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn parses_and_samples_within_bounds() {
        assert_eq!(Dist::parse("500"), Ok(Dist::Fixed { value: 500 }));
        assert_eq!(
            Dist::parse(" 200..3000 "),
            Ok(Dist::Uniform {
                min: 200,
                max: 3000
            })
        );
        assert_eq!(
            Dist::parse("exp:1500"),
            Ok(Dist::Exponential { mean: 1500.0 })
        );
        assert!(Dist::parse("3000..200").is_err());
        assert!(Dist::parse("x").is_err());
        assert!(Dist::parse("exp:-1").is_err());
        let mut rng = SmallRng::seed_from_u64(1);
        let u = Dist::parse("10..20").unwrap();
        assert!((0..1000).all(|_| (10..=20).contains(&u.sample(&mut rng))));
        let e = Dist::parse("exp:1000").unwrap();
        let mean = (0..20_000).map(|_| e.sample(&mut rng) as f64).sum::<f64>() / 20_000.0;
        assert!((mean - 1000.0).abs() < 40.0, "{mean}");
    }
}
