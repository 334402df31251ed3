//! Times for people: BFT times as dates, spans as durations (never raw milliseconds).

/// A Unix time in milliseconds as an RFC 3339 date in UTC, to the second.
pub fn date(unix_ms: u64) -> String {
    metatopia_sim::date::UnixDate(unix_ms).to_string()
}

/// Milliseconds as a duration a person reads: the two largest units, `2d 1h`, `15m`, `4s`,
/// `450ms`.
pub fn duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let units = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];
    let mut left = ms / 1000;
    let mut parts = Vec::new();
    for (name, size) in units {
        if left >= size || !parts.is_empty() {
            parts.push((left / size, name));
            left %= size;
        }
        if parts.len() == 2 {
            break;
        }
    }
    parts.iter().filter(|(n, _)| *n > 0).map(|(n, u)| format!("{n}{u}")).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_durations_read_as_such() {
        assert_eq!(date(1_795_705_838_565), "2026-11-26T15:10:38Z");
        assert_eq!(duration(15 * 60 * 1000), "15m");
        assert_eq!(duration(2 * 86_400_000 + 3_600_000 + 1_234), "2d 1h");
        assert_eq!(duration(61_500), "1m 1s");
        assert_eq!(duration(4_000), "4s");
        assert_eq!(duration(450), "450ms");
    }
}
