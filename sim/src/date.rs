//! BFT times (Unix milliseconds) written as dates for people, in pure integer arithmetic (no
//! clock, no time zone database): `2026-11-26T15:10:38Z`.

use std::fmt;

/// A Unix time in milliseconds, displayed as an RFC 3339 date in UTC to the second.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UnixDate(pub u64);

impl fmt::Display for UnixDate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0 / 1000;
        let (days, rest) = (secs / 86_400, secs % 86_400);
        let (y, m, d) = civil_from_days(days);
        write!(f, "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
    }
}

/// Year, month and day of the `days`-th day after 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_read_as_the_calendar_says() {
        assert_eq!(UnixDate(0).to_string(), "1970-01-01T00:00:00Z");
        assert_eq!(UnixDate(1_795_705_838_565).to_string(), "2026-11-26T15:10:38Z");
        assert_eq!(UnixDate(951_782_400_000).to_string(), "2000-02-29T00:00:00Z");
        assert_eq!(UnixDate(4_107_542_399_000).to_string(), "2100-02-28T23:59:59Z");
        assert_eq!(UnixDate(4_107_542_400_000).to_string(), "2100-03-01T00:00:00Z");
    }
}
