//! The UTC calendar (Howard Hinnant's algorithms): RFC 3339 times for headers and exports, dates parsed from the
//! command line, and the day and month periods budgets reset on.

/// Milliseconds since the Unix epoch, now (the one wall clock every tier stamps with).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// (year, month 1-12, day 1-31) of a day counted from 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Days from 1970-01-01 of a civil date.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix seconds as RFC 3339 UTC, second precision.
pub fn rfc3339(secs: u64) -> String {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Unix seconds of `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM:SSZ`, or a plain number of unix seconds.
pub fn parse_time(s: &str) -> Option<u64> {
    if let Ok(n) = s.parse() {
        return Some(n);
    }
    let (date, time) = s.split_once('T').map_or((s, None), |(d, t)| (d, Some(t)));
    let mut parts = date.splitn(3, '-').map(str::parse::<u32>);
    let (y, m, d) = (parts.next()?.ok()?, parts.next()?.ok()?, parts.next()?.ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || y < 1970 {
        return None;
    }
    let mut secs = days_from_civil(i64::from(y), m, d) as u64 * 86_400;
    if let Some(t) = time {
        let t = t.strip_suffix('Z')?;
        let mut hms = t.splitn(3, ':').map(str::parse::<u64>);
        let (h, mi, se) = (hms.next()?.ok()?, hms.next()?.ok()?, hms.next().unwrap_or(Ok(0)).ok()?);
        if h > 23 || mi > 59 || se > 60 {
            return None;
        }
        secs += h * 3600 + mi * 60 + se;
    }
    Some(secs)
}

/// Start and end (unix seconds) of the UTC day or month holding `secs`.
pub fn period(secs: u64, monthly: bool) -> (u64, u64) {
    let day = secs / 86_400;
    if !monthly {
        return (day * 86_400, (day + 1) * 86_400);
    }
    let (y, m, _) = civil_from_days(day as i64);
    let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    (days_from_civil(y, m, 1) as u64 * 86_400, days_from_civil(ny, nm, 1) as u64 * 86_400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_083_200), "2026-12-01T00:00:00Z");
        assert_eq!(parse_time("2026-12-01"), Some(1_796_083_200));
        assert_eq!(parse_time("2026-12-01T01:02:03Z"), Some(1_796_083_200 + 3723));
        assert_eq!(parse_time("42"), Some(42));
        assert_eq!(parse_time("2026-13-01"), None);
        assert_eq!(parse_time("yesterday"), None);
        for days in [0i64, 59, 365, 10_957, 20_000, 60_000] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
