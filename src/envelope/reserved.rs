//! [`Envelope`]: the reserved `x-acemq-` headers as fields, written onto a header table and read
//! back forgivingly, as every AceMQ library reads them; and the id rule (`read_id`).

use std::collections::BTreeMap;

use crate::wire::{AmqpValue, FieldTable};

use super::headers;
use super::ids::{new_id, now_ms};
use super::validate::{check_short, MAX_SHORT_STRING};
use super::value::HeaderValue;
use crate::error::{Error, Result};

/// The AceMQ envelope: the identity and history of a message, carried in the reserved headers.
///
/// Rust names are Rust's; on the wire each field is the header named in [`headers`]
/// (`correlation_id` travels as `x-acemq-correlation`, `message_type` as `x-acemq-type`, …).
///
/// Reading is forgiving, as in every AceMQ library: a string may arrive as a long string or as a
/// byte array (UTF-8), an integer in any width or as decimal text; an empty string is absent and
/// an unreadable value takes its default. A received message's envelope has every default
/// applied: its type is the routing key it arrived on when it carried none, its correlation id
/// its own id, its version and attempt at least 1 and at most 2^31 − 1 (the family's 32-bit
/// integers: a larger foreign value reads as that), its first-seen time now when missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Stable identity, the same on every redelivery and retry; also the AMQP `message_id`. On a
    /// received message without `x-acemq-id` and `message_id`, an id derived from the delivery
    /// (exchange, routing key, properties, body), the same on every redelivery.
    ///
    /// A foreign `x-acemq-id` that cannot go on the wire as it came is replaced **as it is
    /// read**, so the handler sees on attempt 1 the id every copy carries: a string over 255
    /// bytes (it could not be the `message_id`, a short string) or a byte array that is not
    /// UTF-8 by the SHA-256 hex of its bytes; a value that is neither a string nor an integer
    /// (an integer reads as its decimal text, as the family reads it) by `message_id`, else the
    /// derived id. Each replacement is logged at warn and reported to the consumer's
    /// [`Observer::id_replaced`](crate::observe::Observer::id_replaced).
    pub id: String,
    /// Message type, e.g. `order.placed`. When not set, the routing key it is published with
    /// (`message` when that is empty).
    pub message_type: Option<String>,
    /// Schema version of the payload, from 1. Defaults to 1.
    pub version: u32,
    /// Correlation of one business action. When not set, the message's own id.
    pub correlation_id: Option<String>,
    /// Id of the message that caused this one.
    pub causation_id: Option<String>,
    /// 1 on first delivery, +1 per retry.
    pub attempt: u32,
    /// Epoch milliseconds when first published.
    pub first_seen_ms: i64,
    /// `service@host` of the service that first published it. When not set, the connection's
    /// (see [`ConnectionOptions::service`](crate::ConnectionOptions::service)).
    pub origin: Option<String>,
    /// Why a copy was dead-lettered or parked.
    pub error: Option<String>,
    /// Where a claim-checked payload is kept.
    pub claim: Option<String>,
}

impl Envelope {
    /// A new envelope: a fresh id, version 1, attempt 1, first seen now.
    pub fn new() -> Envelope {
        Envelope {
            id: new_id(),
            message_type: None,
            version: 1,
            correlation_id: None,
            causation_id: None,
            attempt: 1,
            first_seen_ms: now_ms(),
            origin: None,
            error: None,
            claim: None,
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        // The id is also the AMQP `message_id`, a short string; the other fields travel only as
        // long-string header values, which have no such limit.
        check_short(headers::ID, &self.id)?;
        if self.id.is_empty() {
            return Err(Error::InvalidHeader {
                name: headers::ID.into(),
                reason: "the message id is empty".into(),
            });
        }
        Ok(())
    }

    /// The type written for a message published with `routing_key`.
    pub(super) fn type_for<'a>(&'a self, routing_key: &'a str) -> &'a str {
        match self.message_type.as_deref() {
            Some(t) if !t.is_empty() => t,
            _ if !routing_key.is_empty() => routing_key,
            _ => "message",
        }
    }

    /// Writes the reserved headers with the family's types: strings as long strings, version and
    /// attempt as 32-bit integers, first-seen as a 64-bit integer; empty optional values are
    /// absent.
    pub(super) fn write(&self, table: &mut FieldTable, routing_key: &str, origin: Option<&str>) {
        let text = |s: &str| AmqpValue::LongString(s.to_string());
        let int32 = |n: u32| AmqpValue::LongInt(i32::try_from(n).unwrap_or(i32::MAX));
        table.insert(headers::ID.into(), text(&self.id));
        table.insert(headers::TYPE.into(), text(self.type_for(routing_key)));
        table.insert(headers::VERSION.into(), int32(self.version.max(1)));
        let correlation = match self.correlation_id.as_deref() {
            Some(c) if !c.is_empty() => c,
            _ => &self.id,
        };
        table.insert(headers::CORRELATION.into(), text(correlation));
        table.insert(headers::ATTEMPT.into(), int32(self.attempt.max(1)));
        table.insert(
            headers::FIRST_SEEN.into(),
            AmqpValue::LongLongInt(self.first_seen_ms),
        );
        let optional = [
            (headers::CAUSATION, self.causation_id.as_deref()),
            (
                headers::ORIGIN,
                self.origin.as_deref().filter(|o| !o.is_empty()).or(origin),
            ),
            (headers::ERROR, self.error.as_deref()),
            (headers::CLAIM, self.claim.as_deref()),
        ];
        for (name, value) in optional {
            if let Some(v) = value.filter(|v| !v.is_empty()) {
                table.insert(name.into(), text(v));
            }
        }
    }

    /// Reads the envelope from received headers, the AMQP `message_id` and the routing key it
    /// arrived on, applying every default; `fallback_id` gives the id when neither `x-acemq-id`
    /// nor `message_id` is there. Also returns why a foreign `x-acemq-id` was not used as it
    /// came, if it was not (see [`read_id`]).
    pub(super) fn read(
        table: &BTreeMap<String, HeaderValue>,
        message_id: Option<&str>,
        routing_key: &str,
        fallback_id: &dyn Fn() -> String,
    ) -> (Envelope, Option<&'static str>) {
        let text = |name: &str| table.get(name).and_then(read_text);
        let int = |name: &str| table.get(name).and_then(read_int);
        // Version and attempt travel as the family's 32-bit integers: a larger value (another
        // library's 64-bit integer or text) reads as the largest one a copy can carry, so a
        // copy never changes it.
        let counter = |name: &str| {
            int(name)
                .filter(|n| *n >= 1)
                .map(|n| u32::try_from(n.min(i64::from(i32::MAX))).unwrap_or(1))
                .unwrap_or(1)
        };
        let (id, replaced) = read_id(table.get(headers::ID));
        let id = id
            .or_else(|| message_id.filter(|m| !m.is_empty()).map(str::to_string))
            .unwrap_or_else(fallback_id);
        let envelope = Envelope {
            message_type: Some(text(headers::TYPE).unwrap_or_else(|| routing_key.to_string()))
                .filter(|t| !t.is_empty()),
            version: counter(headers::VERSION),
            correlation_id: Some(text(headers::CORRELATION).unwrap_or_else(|| id.clone())),
            causation_id: text(headers::CAUSATION),
            attempt: counter(headers::ATTEMPT),
            first_seen_ms: int(headers::FIRST_SEEN).unwrap_or_else(now_ms),
            origin: text(headers::ORIGIN),
            error: text(headers::ERROR),
            claim: text(headers::CLAIM),
            id,
        };
        (envelope, replaced)
    }
}

/// Reads `x-acemq-id` so that a message has **one identity on every attempt**: the id its
/// first reader sees is the one every copy (retry, dead letter, parked, replay) carries, also
/// as the AMQP `message_id`, a short string. The rule:
///
/// - a string (a long string, or a byte array holding UTF-8) of 1 to 255 bytes is the id, as
///   it came;
/// - a longer string cannot be a `message_id`: the id is the SHA-256 hex of its bytes (64
///   characters), already when it is read, so the handler sees the same id on attempt 1 as on
///   every copy;
/// - a byte array that is not UTF-8 is not dropped: the id is the SHA-256 hex of its bytes;
/// - an integer (any width) is its decimal text, as the family's Python and Go readers read it
///   (`777` is `"777"`), so that consumers of one queue in two languages agree on its identity;
/// - any other value (a float, a boolean, a table, …) is not an id this crate can carry as it
///   came: the message falls back to `message_id`, then to the derived id, as without one;
/// - absent, empty or void: `message_id`, then the derived id (nothing was replaced).
///
/// Returns the id (`None`: fall back) and, when a foreign id was there but not used as it
/// came, why — for the caller's log line and [`Observer::id_replaced`](crate::observe::Observer::id_replaced).
/// (The family's readers differ beyond integers: Python decodes bytes lossily and prints
/// other values, Go keeps the raw bytes and prints other values; neither can happen on this
/// crate's wire, where the id must be a UTF-8 short string.)
pub(crate) fn read_id(value: Option<&HeaderValue>) -> (Option<String>, Option<&'static str>) {
    let text = match value {
        None | Some(HeaderValue::Void) => return (None, None),
        Some(HeaderValue::Text(s)) => s.as_str(),
        Some(HeaderValue::Bytes(b)) => match std::str::from_utf8(b) {
            Ok(s) => s,
            Err(_) => return (Some(hash_id(b)), Some("it is not UTF-8")),
        },
        Some(HeaderValue::Int(i)) => return (Some(i.to_string()), None),
        Some(_) => return (None, Some("it is not a string")),
    };
    if text.is_empty() {
        (None, None)
    } else if text.len() > MAX_SHORT_STRING {
        (
            Some(hash_id(text.as_bytes())),
            Some("it is longer than 255 bytes (an AMQP short string)"),
        )
    } else {
        (Some(text.to_string()), None)
    }
}

/// The id that stands for an id that cannot go on the wire as it is: the SHA-256 hex of its
/// bytes (64 characters), the same every time.
pub(crate) fn hash_id(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A string header as the family reads it: a long string or a byte array holding UTF-8; empty
/// is absent.
fn read_text(value: &HeaderValue) -> Option<String> {
    let s = match value {
        HeaderValue::Text(s) => s.clone(),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok()?,
        _ => return None,
    };
    Some(s).filter(|s| !s.is_empty())
}

/// An integer header as the family reads it: any integer width, a whole finite float, or
/// decimal text (long string or byte array).
fn read_int(value: &HeaderValue) -> Option<i64> {
    match value {
        HeaderValue::Int(i) => Some(*i),
        HeaderValue::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e18 => {
            // Checked above: whole and well inside i64's range.
            #[allow(clippy::cast_possible_truncation)]
            Some(*f as i64)
        }
        HeaderValue::Text(s) => s.trim().parse().ok(),
        HeaderValue::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        _ => None,
    }
}

impl Default for Envelope {
    fn default() -> Self {
        Envelope::new()
    }
}
