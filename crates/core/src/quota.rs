//! The flag syntax of limits: a quota (`10/1h`) and a duration with a unit (`250ms`), parsed in one place.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A value that does not follow the syntax; the message names the value and what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError(pub String);

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SyntaxError {}

/// A fixed-window quota: at most `limit` calls per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub limit: u64,
    pub window: Duration,
}

impl Quota {
    #[must_use]
    pub const fn new(limit: u64, window: Duration) -> Self {
        Self { limit, window }
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {}", self.limit, HumanDuration(self.window))
    }
}

/// `LIMIT/WINDOW`, e.g. `10/1h`; `LIMIT` ≥ 1.
impl FromStr for Quota {
    type Err = SyntaxError;
    fn from_str(s: &str) -> Result<Self, SyntaxError> {
        let bad = || SyntaxError(format!("quota {s:?} is not LIMIT/WINDOW, like 10/1h"));
        let (limit, window) = s.split_once('/').ok_or_else(bad)?;
        let limit: u64 = limit.trim().parse().map_err(|_| bad())?;
        if limit == 0 {
            return Err(SyntaxError(format!("quota {s:?}: the limit must be at least 1")));
        }
        Ok(Self { limit, window: parse_duration(window.trim())? })
    }
}

/// A duration with a unit: `250ms`, `60s`, `5m`, `1h`, `1d`. Between 1 ms and 30 days.
///
/// # Errors
/// A [`SyntaxError`] naming the value.
pub fn parse_duration(s: &str) -> Result<Duration, SyntaxError> {
    let bad = || SyntaxError(format!("duration {s:?} needs a number and a unit: ms, s, m, h or d (like 60s)"));
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| bad())?;
    let ms = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        _ => return Err(bad()),
    };
    match ms {
        Some(ms) if (1..=30 * 86_400_000).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(SyntaxError(format!("duration {s:?} must be between 1ms and 30d"))),
    }
}

/// A duration in its largest exact unit (`1500ms`, `6s`, `30m`, `1d`), the way the flags and documents take it.
#[derive(Debug, Clone, Copy)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)] {
            if ms >= size && ms.is_multiple_of(size) {
                return write!(f, "{}{unit}", ms / size);
            }
        }
        write!(f, "{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_and_durations_parse_strictly() {
        assert_eq!("10/1h".parse::<Quota>().ok(), Some(Quota::new(10, Duration::from_secs(3600))));
        assert_eq!("3/250ms".parse::<Quota>().ok(), Some(Quota::new(3, Duration::from_millis(250))));
        for bad in ["", "10", "0/1h", "10/", "10/1", "10/1w", "-1/1h", "10/0s", "10/31d", "x/1h", "10/1.5h"] {
            assert!(bad.parse::<Quota>().is_err(), "{bad}");
        }
        assert_eq!(Quota::new(10, Duration::from_secs(3600)).to_string(), "10 per 1h");
        assert_eq!(Quota::new(2, Duration::from_millis(1500)).to_string(), "2 per 1500ms");
    }
}
