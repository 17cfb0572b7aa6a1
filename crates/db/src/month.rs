//! Calendar months in UTC, for the audit table's monthly partitions (no calendar crate: civil-from-days).

use mcpfleet_core::time::civil_from_days;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A month of the UTC calendar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Month {
    pub year: i32,
    /// 1..=12.
    pub month: u32,
}

impl Month {
    /// The month `t` falls in.
    #[must_use]
    pub fn of(t: SystemTime) -> Self {
        let secs = match t.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        };
        let (year, month, _) = civil_from_days(secs.div_euclid(86_400));
        Self { year, month }
    }

    /// `n` months later (earlier when negative).
    #[must_use]
    pub fn plus(self, n: i32) -> Self {
        let i = self.index() + n;
        Self { year: i.div_euclid(12), month: u32::try_from(i.rem_euclid(12)).unwrap_or(0) + 1 }
    }

    fn index(self) -> i32 {
        self.year * 12 + i32::try_from(self.month).unwrap_or(1) - 1
    }

    /// Its first instant, as PostgreSQL reads a `timestamptz`: `2026-12-01 00:00:00+00`.
    #[must_use]
    pub fn start_literal(self) -> String {
        format!("{:04}-{:02}-01 00:00:00+00", self.year, self.month)
    }

    /// Its first instant.
    #[must_use]
    pub fn start(self) -> SystemTime {
        let days = days_from_civil(self.year, self.month, 1);
        let secs = u64::try_from(days * 86_400).unwrap_or(0);
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// The name of its audit partition: `audit_events_y2026m12`.
    #[must_use]
    pub fn partition(self) -> String {
        format!("audit_events_y{:04}m{:02}", self.year, self.month)
    }

    /// The month of a partition named by [`Month::partition`].
    #[must_use]
    pub fn of_partition(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("audit_events_y")?;
        let (y, m) = rest.split_once('m')?;
        let (year, month) = (y.parse().ok()?, m.parse().ok()?);
        ((1..=12).contains(&month) && y.len() == 4 && m.len() == 2).then_some(Self { year, month })
    }
}

impl std::fmt::Display for Month {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

impl std::str::FromStr for Month {
    type Err = String;
    /// `YYYY-MM`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a month like 2026-12");
        let (y, m) = s.split_once('-').ok_or_else(bad)?;
        let (year, month): (i32, u32) = (y.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
        if y.len() != 4 || !(1..=12).contains(&month) {
            return Err(bad());
        }
        Ok(Self { year, month })
    }
}

/// The inverse of [`mcpfleet_core::time::civil_from_days`].
fn days_from_civil(y: i32, m: u32, d: u32) -> i64 {
    let y = i64::from(if m <= 2 { y - 1 } else { y });
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let (m, d) = (i64::from(m), i64::from(d));
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use mcpfleet_core::time::rfc3339;

    #[test]
    fn months_from_instants_and_back() {
        let dec = Month::of(UNIX_EPOCH + Duration::from_secs(1_796_083_200)); // 2026-12-01T00:00:00Z
        assert_eq!(dec, Month { year: 2026, month: 12 });
        assert_eq!(Month::of(dec.start() - Duration::from_secs(1)), Month { year: 2026, month: 11 });
        assert_eq!(dec.plus(1), Month { year: 2027, month: 1 });
        assert_eq!(dec.plus(-12), Month { year: 2025, month: 12 });
        assert_eq!(dec.plus(14), Month { year: 2028, month: 2 });
        assert_eq!(dec.start_literal(), "2026-12-01 00:00:00+00");
        assert_eq!(rfc3339(dec.start() + Duration::from_secs(37_230)), "2026-12-01T10:20:30Z");
        assert_eq!(Month::of_partition(&dec.partition()), Some(dec));
        assert_eq!(Month::of_partition("audit_events_default"), None);
        assert_eq!("2024-02".parse::<Month>(), Ok(Month { year: 2024, month: 2 }));
        assert!("2024-13".parse::<Month>().is_err());
        for y in [1970, 2000, 2024, 2100] {
            for m in 1..=12 {
                let month = Month { year: y, month: m };
                assert_eq!(Month::of(month.start()), month);
            }
        }
    }
}
