//! What the operator sets: the bucket, the quotas, the caps and the failure policy. Parsed by the server's config
//! module; the parsers here are the one definition of the flag syntax (`10/1h`, `250ms`).

use crate::LimitError;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The per-principal token bucket of the transport.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Requests a principal may make at once (the bucket's capacity).
    pub burst: u32,
    /// Tokens added per second.
    pub per_second: f64,
}

impl RateLimit {
    /// The window of the `RateLimit-Policy` header: how long an empty bucket takes to fill, in whole seconds.
    #[must_use]
    pub fn window_secs(&self) -> u64 {
        whole_secs(f64::from(self.burst) / self.per_second)
    }

    /// The bucket's state for the headers: `remaining` requests, `reset` seconds.
    #[must_use]
    pub fn status(&self, remaining: u64, reset: u64) -> crate::RateStatus {
        crate::RateStatus { limit: self.burst, window: self.window_secs(), remaining, reset }
    }
}

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
    type Err = LimitError;
    fn from_str(s: &str) -> Result<Self, LimitError> {
        let bad = || LimitError::Config(format!("quota {s:?} is not LIMIT/WINDOW, like 10/1h"));
        let (limit, window) = s.split_once('/').ok_or_else(bad)?;
        let limit: u64 = limit.trim().parse().map_err(|_| bad())?;
        if limit == 0 {
            return Err(LimitError::Config(format!("quota {s:?}: the limit must be at least 1")));
        }
        Ok(Self { limit, window: parse_duration(window.trim())? })
    }
}

/// A duration with a unit: `250ms`, `60s`, `5m`, `1h`, `1d`. Between 1 ms and 30 days.
///
/// # Errors
/// [`LimitError::Config`] naming the value.
pub fn parse_duration(s: &str) -> Result<Duration, LimitError> {
    let bad = || LimitError::Config(format!("duration {s:?} needs a number and a unit: ms, s, m, h or d (like 60s)"));
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
        _ => Err(LimitError::Config(format!("duration {s:?} must be between 1ms and 30d"))),
    }
}

struct HumanDuration(Duration);

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

pub(crate) fn whole_secs(s: f64) -> u64 {
    // Saturating float-to-int conversion: a NaN or negative value is 0.
    #[expect(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "clamped and saturating")]
    let n = s.ceil().max(0.0) as u64;
    n
}

/// What the transport bucket does when the store cannot answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailMode {
    /// Refuse with 503 and `Retry-After` (the default): a limit nobody can check is not a limit.
    #[default]
    Closed,
    /// Decide on a local per-replica bucket of capacity ÷ replicas, and count every such decision. Session checks,
    /// caps and quotas still fail closed.
    Open,
}

/// Every limit, as the operator configured it.
#[derive(Clone, Debug)]
pub struct LimitsConfig {
    /// `None`: no bucket (`--rate-burst 0`).
    pub rate: Option<RateLimit>,
    /// The operator's quotas by tool (`--quota TOOL=LIMIT/WINDOW`), over the tools' own; `None` lifts a tool's
    /// quota (`--quota TOOL=off`).
    pub quotas: BTreeMap<String, Option<Quota>>,
    /// Open sessions per principal; 0 means no cap.
    pub max_sessions: u64,
    /// Open SSE streams (GET) per principal; 0 means no cap.
    pub max_streams: u64,
    /// Tool calls in flight per principal; 0 means no cap.
    pub max_inflight: u64,
    pub fail_mode: FailMode,
    /// How many replicas share the limits: the fail-open bucket is capacity ÷ replicas.
    pub replicas: u32,
    /// How long a stream's or call's slot lasts without renewal: a dead replica's slots are free after this.
    pub slot_ttl: Duration,
    /// After this many store failures in a row, admission stops calling the store for `breaker_cooldown`.
    pub breaker_threshold: u32,
    pub breaker_cooldown: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            rate: Some(RateLimit { burst: 60, per_second: 1.0 }),
            quotas: BTreeMap::new(),
            max_sessions: 64,
            max_streams: 16,
            max_inflight: 16,
            fail_mode: FailMode::Closed,
            replicas: 1,
            slot_ttl: Duration::from_secs(6),
            breaker_threshold: 3,
            breaker_cooldown: Duration::from_secs(1),
        }
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
        assert_eq!(RateLimit { burst: 60, per_second: 1.0 }.window_secs(), 60);
        assert_eq!(RateLimit { burst: 5, per_second: 2.0 }.window_secs(), 3);
    }
}
