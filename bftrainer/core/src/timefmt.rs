//! Civil-time conversion for trace timestamps (UTC, no leap seconds), written out so the
//! core needs no date crate: `YYYY-MM-DDTHH:MM:SS` or integer Unix seconds.

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

/// Whether year, month, day, hour, minute and second name a real time of day (leap
/// years counted; no leap seconds).
pub fn civil_ok(y: i64, mo: i64, d: i64, h: i64, mi: i64, s: i64) -> bool {
    let mdays = [
        31,
        if is_leap(y) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    (1..=12).contains(&mo)
        && (1..=mdays[(mo - 1) as usize]).contains(&d)
        && (0..=23).contains(&h)
        && (0..=59).contains(&mi)
        && (0..=59).contains(&s)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// Parses `YYYY-MM-DDTHH:MM:SS` (a space may replace the `T`; a trailing `Z` is
/// accepted) or an integer number of Unix seconds. Returns a message on failure.
pub fn parse_time(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'-') && !s[1..].contains('-')
    {
        return s.parse::<i64>().map_err(|_| {
            format!("bad timestamp {s:?}: expected YYYY-MM-DDTHH:MM:SS or Unix seconds")
        });
    }
    let b = s.strip_suffix('Z').unwrap_or(s).as_bytes();
    let bad = || format!("bad timestamp {s:?}: expected YYYY-MM-DDTHH:MM:SS or Unix seconds");
    if b.len() != 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b'T' || b[10] == b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let mut v = 0i64;
        for &c in &b[r] {
            if !c.is_ascii_digit() {
                return Err(bad());
            }
            v = v * 10 + i64::from(c - b'0');
        }
        Ok(v)
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    civil_ok(y, mo, d, h, mi, se)
        .then(|| days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se)
        .ok_or_else(|| format!("bad timestamp {s:?}: field out of range"))
}

/// Formats Unix seconds as `YYYY-MM-DDTHH:MM:SS` (UTC).
pub fn format_time(t: i64) -> String {
    let (days, secs) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_known_dates() {
        assert_eq!(parse_time("1970-01-01T00:00:00").unwrap(), 0);
        // 2021-02-10T20:21:15Z, checked with `date -u -d 2021-02-10T20:21:15 +%s`.
        assert_eq!(parse_time("2021-02-10T20:21:15").unwrap(), 1_612_988_475);
        assert_eq!(parse_time("2021-02-10 20:21:15Z").unwrap(), 1_612_988_475);
        assert_eq!(parse_time("1612988475").unwrap(), 1_612_988_475);
        assert_eq!(format_time(1_612_988_475), "2021-02-10T20:21:15");
        assert_eq!(
            format_time(parse_time("2024-02-29T23:59:59").unwrap()),
            "2024-02-29T23:59:59"
        );
    }

    #[test]
    fn rejects_malformed() {
        for s in [
            "",
            "2021-02-30T00:00:00",
            "2021-13-01T00:00:00",
            "2021-02-10T24:00:00",
            "2021-02-10",
            "21-02-10T00:00:00",
            "2021-02-10Tab:00:00",
            "12x",
        ] {
            assert!(parse_time(s).is_err(), "{s}");
        }
    }
}
