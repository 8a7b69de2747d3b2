//! Wall-clock helpers: RFC 3339 parsing (key expiry) and formatting (audit records).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch, now.
pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses `2027-01-31T23:59:59Z`, `2027-01-31T23:59:59.5+02:00` or a bare date `2027-01-31`
/// (midnight UTC) into Unix seconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let s = s.trim();
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if s.get(4..5)? != "-" || s.get(7..8)? != "-" || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let days = days_from_civil(y, m, d);
    if s.len() == 10 {
        return Some(days * 86_400);
    }
    if !matches!(s.get(10..11)?, "T" | "t" | " ") || s.get(13..14)? != ":" || s.get(16..17)? != ":" {
        return None;
    }
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.get(0..1)? {
                "+" => 1,
                "-" => -1,
                _ => return None,
            };
            let oh = rest.get(1..3)?.parse::<i64>().ok()?;
            let om = rest.get(4..6)?.parse::<i64>().ok()?;
            sign * (oh * 3600 + om * 60)
        }
    };
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss - offset)
}

/// `SystemTime` as RFC 3339 UTC with milliseconds.
pub fn format_rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let sod = secs % 86_400;
    // Every audit record carries one: digits are pushed rather than run through `format!`
    // (a time before 1970 is written as 1970, so no part is negative).
    let mut s = String::with_capacity(24);
    for (n, width, after) in [
        (y.unsigned_abs(), 4, '-'),
        (m.unsigned_abs(), 2, '-'),
        (day.unsigned_abs(), 2, 'T'),
        (sod / 3600, 2, ':'),
        (sod % 3600 / 60, 2, ':'),
        (sod % 60, 2, '.'),
        (u64::from(d.subsec_millis()), 3, 'Z'),
    ] {
        push_padded(&mut s, n, width);
        s.push(after);
    }
    s
}

/// `n` in decimal, zero-padded to `width` digits (more when it needs them).
fn push_padded(s: &mut String, n: u64, width: u32) {
    let digits = n.checked_ilog10().map_or(1, |l| l + 1);
    for _ in digits..width {
        s.push('0');
    }
    for place in (0..digits).rev() {
        s.push(char::from(b'0' + (n / 10u64.pow(place) % 10) as u8));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn round_trips_and_offsets() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2026-11-30T04:11:15Z"), Some(1_796_011_875));
        assert_eq!(parse_rfc3339("2026-11-30T06:11:15.250+02:00"), Some(1_796_011_875));
        assert_eq!(parse_rfc3339("2026-11-30"), Some(1_795_996_800));
        assert_eq!(parse_rfc3339("30/11/2026"), None);
        let t = UNIX_EPOCH + Duration::from_millis(1_796_011_875_042);
        assert_eq!(format_rfc3339(t), "2026-11-30T04:11:15.042Z");
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let late = UNIX_EPOCH + Duration::from_millis(253_402_300_799_999);
        assert_eq!(format_rfc3339(late), "9999-12-31T23:59:59.999Z");
        let beyond = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        assert_eq!(format_rfc3339(beyond), "10000-01-01T00:00:00.000Z");
    }
}
