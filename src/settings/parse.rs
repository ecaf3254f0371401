//! One value read from its text: durations, numbers, booleans, choices, the broker's URLs, the
//! format. Every refusal names the setting (`label`) and the forms it takes; none repeats a URL
//! (which may hold a password).

use std::time::Duration;

use crate::connection::Address;
use crate::error::{Error, Result};

/// What a duration may be written as, for the refusals.
pub(crate) const DURATION_FORMS: &str = "seconds (`30`, `2.5`), a number with a unit (`500ms`, \
     `30s`, `5m`, `1h`, `1d`), ISO 8601 (`PT30S`, `PT1M30S`) or `H:MM:SS` (`0:00:30`)";

/// `{label}: {what}`, as an [`Error::InvalidArgument`].
pub(super) fn refuse(label: &str, what: impl std::fmt::Display) -> Error {
    Error::invalid(format!("{label}: {what}"))
}

/// A duration in any of [`DURATION_FORMS`].
pub(crate) fn duration(label: &str, text: &str) -> Result<Duration> {
    let t = text.trim();
    read_duration(t)
        .ok_or_else(|| refuse(label, format!("`{t}` is not a duration: {DURATION_FORMS}")))
}

/// A duration above zero.
pub(super) fn positive_duration(label: &str, text: &str) -> Result<Duration> {
    let d = duration(label, text)?;
    if d.is_zero() {
        return Err(refuse(
            label,
            format!("`{}` is zero; it must be above zero", text.trim()),
        ));
    }
    Ok(d)
}

fn read_duration(t: &str) -> Option<Duration> {
    if t.is_empty() {
        return None;
    }
    if let Some(iso) = t.strip_prefix('P').or_else(|| t.strip_prefix('p')) {
        return iso_8601(iso);
    }
    if t.contains(':') {
        return clock(t);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "ms" | "millis" | "milliseconds" => 0.001,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hour" | "hours" => 3600.0,
        "d" | "day" | "days" => 86_400.0,
        _ => return None,
    };
    seconds(number, scale)
}

/// `number × scale` seconds, from a plain decimal (no sign, no exponent).
fn seconds(number: &str, scale: f64) -> Option<Duration> {
    if number.is_empty()
        || number.starts_with('.')
        || number.ends_with('.')
        || number.matches('.').count() > 1
    {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    Duration::try_from_secs_f64(value * scale).ok()
}

/// ISO 8601 after the `P`: `[nD][T[nH][nM][nS]]`, each number a plain decimal (Python's
/// `timedelta` reading; no years or months, whose length is not fixed).
fn iso_8601(rest: &str) -> Option<Duration> {
    let (days, time) = match rest.find(['T', 't']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let mut total = Duration::ZERO;
    let mut any = false;
    if !days.is_empty() {
        let n = days.strip_suffix(['D', 'd'])?;
        total += seconds(n, 86_400.0)?;
        any = true;
    }
    if let Some(mut time) = time {
        if time.is_empty() {
            return None;
        }
        for (unit, scale) in [('H', 3600.0), ('M', 60.0), ('S', 1.0)] {
            if let Some(i) = time.find([unit, unit.to_ascii_lowercase()]) {
                total += seconds(&time[..i], scale)?;
                time = &time[i + 1..];
                any = true;
            }
        }
        if !time.is_empty() {
            return None;
        }
    }
    any.then_some(total)
}

/// `H:MM:SS` (or `MM:SS`), the seconds possibly with a fraction.
fn clock(t: &str) -> Option<Duration> {
    let parts: Vec<&str> = t.split(':').collect();
    let (h, m, s) = match parts.as_slice() {
        [h, m, s] => (*h, *m, *s),
        [m, s] => ("0", *m, *s),
        _ => return None,
    };
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !digits(h) || !digits(m) {
        return None;
    }
    let hours: u64 = h.parse().ok()?;
    let minutes: u64 = m.parse().ok()?;
    if minutes > 59 || m.len() != 2 || s.len() < 2 {
        return None;
    }
    let secs = seconds(s, 1.0)?;
    if secs >= Duration::from_secs(60) {
        return None;
    }
    Some(Duration::from_secs(hours.checked_mul(3600)? + minutes * 60) + secs)
}

/// A whole number from `min` to `max`.
pub(super) fn whole(label: &str, text: &str, min: u64, max: u64) -> Result<u64> {
    let t = text.trim();
    let range = if max == u64::MAX {
        format!("of at least {min}")
    } else {
        format!("from {min} to {max}")
    };
    t.parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| refuse(label, format!("`{t}` is not a whole number {range}")))
}

/// A decimal number from `min` to `max` (inclusive).
pub(super) fn decimal(label: &str, text: &str, min: f64, max: f64) -> Result<f64> {
    let t = text.trim();
    let range = if max == f64::INFINITY {
        format!("of at least {min}")
    } else {
        format!("from {min} to {max}")
    };
    t.parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && *n >= min && *n <= max)
        .ok_or_else(|| refuse(label, format!("`{t}` is not a number {range}")))
}

/// `true` or `false`, and the spellings pydantic reads (`1`/`0`, `yes`/`no`, `on`/`off`), any
/// case.
pub(super) fn boolean(label: &str, text: &str) -> Result<bool> {
    let t = text.trim();
    match t.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" | "y" | "t" => Ok(true),
        "false" | "0" | "no" | "off" | "n" | "f" => Ok(false),
        _ => Err(refuse(
            label,
            format!("`{t}` is not true or false (also read: 1/0, yes/no, on/off)"),
        )),
    }
}

/// One of `choices` (any case), returned in lower case.
pub(super) fn choice(label: &str, text: &str, choices: &[&str]) -> Result<String> {
    let t = text.trim();
    let lower = t.to_ascii_lowercase();
    if choices.contains(&lower.as_str()) {
        return Ok(lower);
    }
    let list: Vec<String> = choices.iter().map(|c| format!("`{c}`")).collect();
    Err(refuse(
        label,
        format!("`{t}` is not one of {}", list.join(", ")),
    ))
}

/// The schemes a URL of `ACEMQ_URL` starts with.
const SCHEMES: [&str; 3] = ["amqp://", "amqps://", "memory://"];

/// What an address may be, for the refusals.
const URL_FORMS: &str =
    "amqp://user:password@host:port/vhost, amqps://… (feature `tls`) or memory://name (feature \
     `memory`)";

fn reason(e: Error) -> String {
    match e {
        Error::InvalidArgument { reason } => reason,
        other => other.to_string(),
    }
}

/// `ACEMQ_URL`: one URL, or several separated by commas. A comma not followed by a scheme is
/// part of the URL before it (a password's), so only `…,amqp://…` splits. Each is parsed now;
/// no refusal repeats a URL, whose password it may hold.
pub(super) fn split_urls(label: &str, text: &str) -> Result<Vec<String>> {
    let mut urls: Vec<String> = Vec::new();
    for piece in text.split(',') {
        let starts = SCHEMES
            .iter()
            .any(|s| piece.trim_start().to_ascii_lowercase().starts_with(s));
        match urls.last_mut() {
            Some(last) if !starts => {
                last.push(',');
                last.push_str(piece);
            }
            _ => urls.push(piece.to_string()),
        }
    }
    let urls: Vec<String> = urls
        .iter()
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
        .collect();
    for (i, url) in urls.iter().enumerate() {
        if let Err(e) = Address::parse(url) {
            let which = if urls.len() > 1 {
                format!("its address number {} is not a broker URL", i + 1)
            } else {
                "not a broker URL".to_string()
            };
            return Err(refuse(
                label,
                format!("{which} ({URL_FORMS}): {}", reason(e)),
            ));
        }
    }
    Ok(urls)
}

/// A codec's name as [`codecs::by_name`](crate::codecs::by_name) reads it (any case; `string`
/// is `text`), in its canonical form; a refusal names the setting.
pub(super) fn format_name(label: &str, text: &str) -> Result<String> {
    match crate::codecs::canonical_name(text.trim()) {
        Ok(name) => Ok(name.to_string()),
        Err(Error::InvalidArgument { reason }) => Err(refuse(label, reason)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_duration_form_reads() {
        let d = |t: &str| read_duration(t);
        let s = Duration::from_secs;
        assert_eq!(d("30"), Some(s(30)));
        assert_eq!(d("2.5"), Some(Duration::from_millis(2500)));
        assert_eq!(d("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(d("30s"), Some(s(30)));
        assert_eq!(d("5m"), Some(s(300)));
        assert_eq!(d("1h"), Some(s(3600)));
        assert_eq!(d("1d"), Some(s(86_400)));
        assert_eq!(d("PT30S"), Some(s(30)));
        assert_eq!(d("PT1M30S"), Some(s(90)));
        assert_eq!(d("PT0.5S"), Some(Duration::from_millis(500)));
        assert_eq!(d("P1DT2H"), Some(s(93_600)));
        assert_eq!(d("0:00:30"), Some(s(30)));
        assert_eq!(d("1:02:03"), Some(s(3723)));
        assert_eq!(d("0:00:00.25"), Some(Duration::from_millis(250)));
        for bad in [
            "",
            "-1",
            "abc",
            "1.",
            ".5",
            "1..2",
            "P",
            "PT",
            "PT5X",
            "P1M",
            "1:2:3",
            "0:60:00",
            "0:00:60",
            "5 parsecs",
            "1e3",
            "inf",
            "NaN",
        ] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_a_comma_before_a_scheme_splits() {
        let urls = split_urls("ACEMQ_URL", "amqp://u:a,b@h1/, amqp://h2/").unwrap();
        assert_eq!(urls, ["amqp://u:a,b@h1/", "amqp://h2/"]);
    }
}
