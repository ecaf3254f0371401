//! Output: text for people, one JSON object per line with `--json`; every line scrubbed of the
//! passwords the command was given.

use std::io::Write;
use std::time::Duration;

use serde_json::{json, Value};

pub struct Out {
    json: bool,
    secrets: Vec<String>,
}

impl Out {
    pub fn new(json: bool) -> Out {
        Out {
            json,
            secrets: Vec::new(),
        }
    }

    pub fn json(&self) -> bool {
        self.json
    }

    /// Remembers the password in `url` (`scheme://user:password@…` or `password=…`), raw and
    /// percent-decoded, so that no line printed carries it.
    pub fn secret_from_url(&mut self, url: &str) {
        if let Some(p) = password_in(url) {
            if !p.is_empty() {
                let decoded = percent_decode(&p);
                self.secrets.push(p);
                self.secrets.push(decoded);
                // Longest first, so that a password containing another is scrubbed whole.
                self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
                self.secrets.dedup();
            }
        }
    }

    pub fn scrub(&self, text: &str) -> String {
        let mut t = scrub_userinfo(text);
        for s in &self.secrets {
            t = t.replace(s.as_str(), "***");
        }
        t
    }

    /// A human line (not printed with `--json`).
    pub fn text(&self, line: impl AsRef<str>) {
        if !self.json {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{}", self.scrub(line.as_ref()));
        }
    }

    /// A JSON object (printed only with `--json`).
    pub fn record(&self, value: Value) {
        if self.json {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{}", self.scrub(&value.to_string()));
        }
    }

    /// Raw text printed in both modes (the DDL).
    pub fn raw(&self, text: &str) {
        let mut o = std::io::stdout().lock();
        let _ = write!(o, "{}", self.scrub(text));
    }

    /// The one-line error: on stderr, and as `{"error": …, "exit": n}` on stdout with `--json`.
    pub fn error(&self, message: &str, code: u8) {
        let line = self.scrub(message).replace('\n', " ");
        let _ = writeln!(std::io::stderr().lock(), "acemq: {line}");
        if self.json {
            let _ = writeln!(
                std::io::stdout().lock(),
                "{}",
                json!({ "error": line, "exit": code })
            );
        }
    }
}

/// The password part of a URL or a `key=value` connection string.
fn password_in(url: &str) -> Option<String> {
    if let Some(rest) = url.split_once("://").map(|(_, r)| r) {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            return userinfo.split_once(':').map(|(_, p)| p.to_string());
        }
        return None;
    }
    url.split_whitespace()
        .find_map(|kv| kv.strip_prefix("password="))
        .map(|p| p.trim_matches('\'').to_string())
}

/// `scheme://user:secret@` → `scheme://user:***@` wherever it appears in `text`.
fn scrub_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        let end = rest
            .find(|c: char| c == '/' || c.is_whitespace() || c == '"' || c == '\'')
            .unwrap_or(rest.len());
        let authority = &rest[..end];
        if let Some((userinfo, host)) = authority.rsplit_once('@') {
            if let Some((user, _)) = userinfo.split_once(':') {
                out.push_str(user);
                out.push_str(":***@");
                out.push_str(host);
                rest = &rest[end..];
                continue;
            }
        }
    }
    out.push_str(rest);
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
    fn passwords_are_scrubbed() {
        let mut out = Out::new(false);
        out.secret_from_url("amqp://guest:s3cr%40t@127.0.0.1:5672/%2f");
        out.secret_from_url("host=db user=app password=hunter2 dbname=x");
        assert_eq!(
            out.scrub("failed amqp://guest:s3cr%40t@host/ with s3cr@t and hunter2"),
            "failed amqp://guest:***@host/ with *** and ***"
        );
        assert_eq!(
            scrub_userinfo("postgres://u:p@h:5432/db x"),
            "postgres://u:***@h:5432/db x"
        );
        assert_eq!(age(Duration::from_secs(3725)), "1h 2m");
        assert_eq!(age(Duration::from_millis(850)), "850ms");
    }
}
