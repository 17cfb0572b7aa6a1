//! What every area's flags share: one duration syntax, the deprecated unit-named aliases of duration flags, and
//! the one-line configuration error.

use crate::ServerError;
use mcpfleet_limits::parse_duration;
use std::time::Duration;

/// This machine's host name (`/proc/sys/kernel/hostname`, the pod's name in Kubernetes); `None` when unknown.
pub(super) fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
}

/// A one-line [`ServerError::Config`] (exit code 64) with this reason.
pub(super) fn config_error(msg: impl Into<String>) -> ServerError {
    ServerError::Config(msg.into())
}

/// A clap value parser: a duration with a unit (`250ms`, `30s`, `5m`, `1h`, `1d`; zero needs none) between `min`
/// and `max`, which are written the same way. The message of a value out of range names the range.
pub(super) fn duration(
    min: &'static str,
    max: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s| {
        let d = any_duration(s)?;
        if d < any_duration(min)? || d > any_duration(max)? {
            return Err(format!("must be between {min} and {max}"));
        }
        Ok(d)
    }
}

/// [`duration`], or zero.
pub(super) fn duration_or_zero(
    min: &'static str,
    max: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    let bounded = duration(min, max);
    move |s| match any_duration(s)? {
        Duration::ZERO => Ok(Duration::ZERO),
        _ => bounded(s),
    }
}

/// A duration with a unit; `0` (with a unit or without) is zero, which `parse_duration` does not take.
fn any_duration(s: &str) -> Result<Duration, String> {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let zero = !digits.is_empty() && digits.bytes().all(|b| b == b'0');
    if zero && matches!(&s[digits.len()..], "" | "ms" | "s" | "m" | "h" | "d") {
        return Ok(Duration::ZERO);
    }
    parse_duration(s).map_err(|e| e.to_string())
}

/// A duration that a flag used to take as a bare number of seconds under the same name (`--jwt-leeway 10`): a
/// bare number still means seconds, deprecated, and `bare` says it was one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MaybeBare {
    pub value: Duration,
    pub bare: bool,
}

/// [`duration`], or a bare number of seconds (not zero, which needs no unit) in the same range.
pub(super) fn duration_or_bare_secs(
    min: &'static str,
    max: &'static str,
) -> impl Fn(&str) -> Result<MaybeBare, String> + Clone + Send + Sync + 'static {
    let with_unit = duration(min, max);
    move |s| {
        let bare = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && s.bytes().any(|b| b != b'0');
        let value = if bare { with_unit(&format!("{s}s"))? } else { with_unit(s)? };
        Ok(MaybeBare { value, bare })
    }
}

/// The unit of a deprecated duration flag, the number it takes being bare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Unit {
    /// `--NAME-ms`, `MCPFLEET_NAME_MS`.
    Ms,
    /// `--NAME-secs`, `MCPFLEET_NAME_SECS`.
    Secs,
}

impl Unit {
    fn suffix(self) -> &'static str {
        match self {
            Self::Ms => "ms",
            Self::Secs => "secs",
        }
    }

    fn of(self, n: u64) -> Duration {
        match self {
            Self::Ms => Duration::from_millis(n),
            Self::Secs => Duration::from_secs(n),
        }
    }
}

/// The value of the duration flag `--NAME` (`MCPFLEET_NAME`), or of its deprecated alias `--NAME-ms` or
/// `--NAME-secs` (and its variable) when that was given instead, with one warning in `deprecated`. clap refuses
/// both at once: the new flag `conflicts_with` the alias.
pub(super) fn renamed(
    name: &str,
    value: Duration,
    alias: Option<u64>,
    unit: Unit,
    deprecated: &mut Vec<String>,
) -> Duration {
    let Some(n) = alias else { return value };
    let d = unit.of(n);
    let env = |flag: &str| format!("MCPFLEET_{}", flag.replace('-', "_").to_uppercase());
    let old = format!("{name}-{}", unit.suffix());
    deprecated.push(format!(
        "--{old} ({}) is deprecated: use --{name} ({}) with a unit, like {}",
        env(&old),
        env(name),
        human(d)
    ));
    d
}

/// A duration in its largest exact unit (`1500ms`, `6s`, `30m`), the way the flags take it.
pub(super) fn human(d: Duration) -> String {
    mcpfleet_core::HumanDuration(d).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_syntax_with_a_range() {
        let p = duration("300ms", "10m");
        assert_eq!(p("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(p("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(p("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(p("299ms"), Err("must be between 300ms and 10m".to_owned()));
        assert_eq!(p("0"), Err("must be between 300ms and 10m".to_owned()));
        assert_eq!(p("11m"), Err("must be between 300ms and 10m".to_owned()));
        let bare = p("1500").unwrap_err();
        assert!(bare.contains("needs a number and a unit"), "{bare}");
        assert!(p("-1s").is_err() && p("1.5s").is_err() && p("").is_err() && p("s").is_err());
        let zero = duration("0s", "10m");
        assert_eq!(zero("0"), Ok(Duration::ZERO));
        assert_eq!(zero("0ms"), Ok(Duration::ZERO));
        assert_eq!(zero("00s"), Ok(Duration::ZERO));
        assert!(zero("0x").is_err());
        let or_zero = duration_or_zero("1s", "30d");
        assert_eq!(or_zero("0s"), Ok(Duration::ZERO));
        assert_eq!(or_zero("500ms"), Err("must be between 1s and 30d".to_owned()));
        assert_eq!(or_zero("5m"), Ok(Duration::from_secs(300)));
    }

    #[test]
    fn a_bare_number_of_seconds_is_still_taken_and_flagged() {
        let p = duration_or_bare_secs("0s", "30s");
        assert_eq!(p("10"), Ok(MaybeBare { value: Duration::from_secs(10), bare: true }));
        assert_eq!(p("10s"), Ok(MaybeBare { value: Duration::from_secs(10), bare: false }));
        assert_eq!(p("500ms"), Ok(MaybeBare { value: Duration::from_millis(500), bare: false }));
        assert_eq!(p("0"), Ok(MaybeBare { value: Duration::ZERO, bare: false }));
        assert_eq!(p("31"), Err("must be between 0s and 30s".to_owned()));
        assert_eq!(p("31s"), Err("must be between 0s and 30s".to_owned()));
    }

    #[test]
    fn an_alias_keeps_its_unit_and_warns_once() {
        let mut warnings = Vec::new();
        let d = Duration::from_secs(6);
        assert_eq!(renamed("lease-ttl", d, None, Unit::Ms, &mut warnings), d);
        assert!(warnings.is_empty());
        assert_eq!(renamed("lease-ttl", d, Some(1500), Unit::Ms, &mut warnings), Duration::from_millis(1500));
        assert_eq!(renamed("drain-delay", d, Some(2), Unit::Secs, &mut warnings), Duration::from_secs(2));
        assert_eq!(
            warnings,
            [
                "--lease-ttl-ms (MCPFLEET_LEASE_TTL_MS) is deprecated: use --lease-ttl (MCPFLEET_LEASE_TTL) with a \
                 unit, like 1500ms",
                "--drain-delay-secs (MCPFLEET_DRAIN_DELAY_SECS) is deprecated: use --drain-delay \
                 (MCPFLEET_DRAIN_DELAY) with a unit, like 2s",
            ]
        );
    }

    #[test]
    fn human_durations_use_the_largest_exact_unit() {
        let h = |ms| human(Duration::from_millis(ms));
        assert_eq!(
            [h(0), h(50), h(1500), h(6000), h(1_800_000), h(86_400_000)],
            ["0ms", "50ms", "1500ms", "6s", "30m", "1d"]
        );
    }
}
