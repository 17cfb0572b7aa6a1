//! Wall-clock times: the one reading of epoch milliseconds and seconds ([`epoch_ms`], [`epoch_secs`]), and the
//! times the protocol and the audit trail write (RFC 3339, UTC), from one calendar routine.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now. A clock before the epoch reads 0; one past `u64::MAX` ms saturates.
#[must_use]
pub fn epoch_ms() -> u64 {
    epoch_ms_of(SystemTime::now())
}

/// `t` in milliseconds since the Unix epoch: 0 before the epoch, saturating at `u64::MAX`.
#[must_use]
pub fn epoch_ms_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whole seconds since the Unix epoch, now; a clock before the epoch reads 0.
#[must_use]
pub fn epoch_secs() -> u64 {
    epoch_secs_of(SystemTime::now())
}

/// `t` in whole seconds since the Unix epoch; 0 before the epoch.
#[must_use]
pub fn epoch_secs_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `t` as an RFC 3339 UTC time with seconds: `2026-12-01T10:00:00Z`.
#[must_use]
pub fn rfc3339(t: SystemTime) -> String {
    let (date, s) = date_and_seconds(i64::try_from(epoch_secs_of(t)).unwrap_or(i64::MAX));
    format!("{date}T{:02}:{:02}:{:02}Z", s / 3600, s % 3600 / 60, s % 60)
}

/// `ms` (milliseconds since the Unix epoch) as an RFC 3339 UTC time with milliseconds:
/// `2026-12-01T10:00:00.042Z`.
#[must_use]
pub fn rfc3339_millis(ms: u64) -> String {
    let (date, s) = date_and_seconds(i64::try_from(ms / 1000).unwrap_or(i64::MAX));
    format!("{date}T{:02}:{:02}:{:02}.{:03}Z", s / 3600, s % 3600 / 60, s % 60, ms % 1000)
}

fn date_and_seconds(secs: i64) -> (String, i64) {
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    (format!("{y:04}-{m:02}-{d:02}"), secs.rem_euclid(86_400))
}

/// Howard Hinnant's `civil_from_days`: days since 1970-01-01 → (year, month, day).
#[must_use]
pub fn civil_from_days(z: i64) -> (i32, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (i32::try_from(y).unwrap_or(i32::MAX), u32::try_from(m).unwrap_or(1), u32::try_from(d).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_083_200 + 3_661);
        assert_eq!(rfc3339(t), "2026-12-01T01:01:01Z");
        assert_eq!(rfc3339_millis(1_796_083_200_042), "2026-12-01T00:00:00.042Z");
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn epoch_readings_saturate() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_083_200_042);
        assert_eq!(epoch_ms_of(t), 1_796_083_200_042);
        assert_eq!(epoch_secs_of(t), 1_796_083_200);
        assert_eq!(epoch_ms_of(UNIX_EPOCH - Duration::from_secs(1)), 0, "before the epoch");
        assert_eq!(epoch_secs_of(UNIX_EPOCH - Duration::from_secs(1)), 0, "before the epoch");
        if let Some(far) = UNIX_EPOCH.checked_add(Duration::from_secs(u64::MAX / 100)) {
            assert_eq!(epoch_ms_of(far), u64::MAX, "past u64::MAX ms");
        }
        assert!(epoch_ms() / 1000 >= epoch_secs().saturating_sub(1));
    }
}
