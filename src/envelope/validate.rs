//! Checks on what goes on the wire: header names, short strings, the reserved prefix.

use super::headers;

/// The longest AMQP short string: routing keys, ids, header names, property strings.
pub const MAX_SHORT_STRING: usize = 255;
use crate::error::{Error, Result};

/// True for a name in the reserved namespace: a case-sensitive prefix match, as in every AceMQ
/// library (`X-AceMQ-Tenant` is an application header there, so it is one here too, and a copy
/// of a message carrying it keeps it).
pub(super) fn is_reserved(name: &str) -> bool {
    name.starts_with(headers::RESERVED_PREFIX)
}

pub(super) fn check_header_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidHeader {
            name: String::new(),
            reason: "a header name must not be empty".into(),
        });
    }
    check_short(name, name)
}

pub(super) fn check_short(name: &str, value: &str) -> Result<()> {
    if value.len() > MAX_SHORT_STRING {
        return Err(Error::InvalidHeader {
            name: truncate(name),
            reason: format!(
                "{} bytes is over the AMQP short-string limit of {MAX_SHORT_STRING}",
                value.len()
            ),
        });
    }
    Ok(())
}

/// Checks a name that travels as an AMQP short string (queue, exchange, routing key, consumer
/// tag): at most 255 bytes; `allow_empty` for the default exchange or a server-named queue.
pub(crate) fn check_name(kind: &'static str, name: &str, allow_empty: bool) -> Result<()> {
    if name.len() > MAX_SHORT_STRING {
        return Err(Error::InvalidName {
            kind,
            name: truncate(name),
            reason: format!(
                "{} bytes is over the AMQP short-string limit of {MAX_SHORT_STRING}",
                name.len()
            ),
        });
    }
    if !allow_empty && name.is_empty() {
        return Err(Error::InvalidName {
            kind,
            name: String::new(),
            reason: "must not be empty".into(),
        });
    }
    Ok(())
}

/// Shortens a long name for an error message (on a character boundary).
pub(crate) fn truncate(s: &str) -> String {
    const KEEP: usize = 64;
    if s.len() <= KEEP {
        return s.to_string();
    }
    let mut end = KEEP;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}
