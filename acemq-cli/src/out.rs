//! Output: text for people, one JSON object per line with `--json`. A URL printed shows its
//! password as `***` (see [`mask_url`]); nothing else in a line is changed, so queue names,
//! errors and ids print as they are even when they contain the password's text.

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

pub struct Out {
    json: bool,
}

impl Out {
    pub fn new(json: bool) -> Out {
        Out { json }
    }

    pub fn json(&self) -> bool {
        self.json
    }

    /// A human line (not printed with `--json`).
    pub fn text(&self, line: impl AsRef<str>) {
        if !self.json {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{}", scrub(line.as_ref()));
        }
    }

    /// A JSON object (printed only with `--json`).
    pub fn record(&self, value: Value) {
        if self.json {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{}", scrub(&value.to_string()));
        }
    }

    /// Raw text printed in both modes (the DDL).
    pub fn raw(&self, text: &str) {
        let mut o = std::io::stdout().lock();
        let _ = write!(o, "{text}");
    }

    /// The one-line error: on stderr, and as `{"error": …, "kind": …, "exit": n}` on stdout with
    /// `--json` (`kind`: `failed` 1, `usage` 2, `connect` 3).
    pub fn error(&self, message: &str, code: u8) {
        let line = scrub(message).replace('\n', " ");
        let _ = writeln!(std::io::stderr().lock(), "acemq: {line}");
        if self.json {
            let kind = match code {
                2 => "usage",
                3 => "connect",
                _ => "failed",
            };
            let _ = writeln!(
                std::io::stdout().lock(),
                "{}",
                json!({ "error": line, "kind": kind, "exit": code })
            );
        }
    }
}

/// `url` as it may be printed: `scheme://user:password@…` → `scheme://user:***@…`, and a
/// `password=…` of a `key=value` connection string → `password=***`. Only the password
/// component changes (a user, host or vhost with the password's text stays as it is); a URL
/// without a password is returned unchanged.
pub fn mask_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            // The userinfo ends at the last `@`: a password with an unescaped `@` or `/` is
            // masked whole.
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
                None => url.to_string(),
            },
            None => url.to_string(),
        },
        None => mask_password_keys(url),
    }
}

/// The URLs and `password=` values inside a line of output masked (see [`mask_url`]): a
/// library error may name an address. The rest of the line is left exactly as it is.
pub fn scrub(text: &str) -> String {
    let ends = |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        // The URL's scheme: the letters just before `://`.
        let start = rest[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |j| j + 1);
        out.push_str(&mask_password_keys(&rest[..start]));
        let url_end = rest[i + 3..].find(ends).map_or(rest.len(), |j| i + 3 + j);
        out.push_str(&mask_url(&rest[start..url_end]));
        rest = &rest[url_end..];
    }
    out.push_str(&mask_password_keys(rest));
    out
}

/// `password=VALUE` (a word of a `key=value` connection string, the value bare or quoted) →
/// `password=***`.
fn mask_password_keys(text: &str) -> String {
    const KEY: &str = "password=";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(KEY) {
        let at_word_start = rest[..i]
            .chars()
            .next_back()
            .is_none_or(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '('));
        let value = &rest[i + KEY.len()..];
        out.push_str(&rest[..i + KEY.len()]);
        if !at_word_start {
            rest = value;
            continue;
        }
        let len = match value.strip_prefix('\'') {
            Some(quoted) => quoted.find('\'').map_or(value.len(), |j| j + 2),
            None => value.find(char::is_whitespace).unwrap_or(value.len()),
        };
        out.push_str("***");
        rest = &value[len..];
    }
    out.push_str(rest);
    out
}

/// `3d 4h`, `2h 5m`, `4m 12s`, `12s`, `850ms`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    if s == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (days, hours, mins, secs) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}d {hours}h")
    } else if hours > 0 {
        format!("{hours}h {mins}m")
    } else if mins > 0 {
        format!("{mins}m {secs}s")
    } else {
        format!("{secs}s")
    }
}

/// The age of an epoch-milliseconds instant, now.
pub fn age_of_ms(ms: i64) -> Duration {
    let now = acemq_amqp::now_ms();
    Duration::from_millis(u64::try_from(now.saturating_sub(ms)).unwrap_or(0))
}

/// An epoch-milliseconds instant as RFC 3339 UTC (whole seconds).
pub fn rfc3339_ms(ms: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => ms.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_urls_password_is_masked() {
        assert_eq!(
            mask_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(mask_url("amqp://app:p/a@ss@h/v"), "amqp://app:***@h/v");
        assert_eq!(mask_url("amqp://guest@h/"), "amqp://guest@h/");
        assert_eq!(
            mask_url("host=db user=app password='a b' dbname=x"),
            "host=db user=app password=*** dbname=x"
        );
        assert_eq!(
            scrub("test.guest_orders.dlq: failed amqp://guest:guest@host/ (guest) and postgres://u:p@h:5432/db x"),
            "test.guest_orders.dlq: failed amqp://guest:***@host/ (guest) and postgres://u:***@h:5432/db x"
        );
        assert_eq!(
            scrub("{\"error\":\"at amqp://u:pw@h/%2f\",\"q\":\"pw\"}"),
            "{\"error\":\"at amqp://u:***@h/%2f\",\"q\":\"pw\"}"
        );
        assert_eq!(
            scrub("mypassword=x password=y"),
            "mypassword=x password=***"
        );
        assert_eq!(age(Duration::from_secs(3725)), "1h 2m");
        assert_eq!(age(Duration::from_millis(850)), "850ms");
    }
}
