//! The envelope of the AceMQ wire contract, header values and their validation, and [`Message`].
//!
//! Every message this crate publishes carries the reserved `x-acemq-` headers (see
//! [`headers`]); the id is also the AMQP `message_id`. Applications may add their own headers,
//! but never with the reserved prefix.
//!
//! Values are checked **before** anything is handed to amiquip, because amiquip writes an AMQP
//! short string over 255 bytes with a truncated length byte (a corrupt frame that closes the
//! connection) and, when it reads a `longstr` header that is not UTF-8, drops it and every header
//! after it. Text is always UTF-8 here (a Rust `String`); bytes that may not be text go as
//! [`HeaderValue::Bytes`] (an AMQP byte array), and [`HeaderValue::try_text`] refuses bytes that
//! are not UTF-8.

pub mod headers;
mod ids;
mod message;
#[cfg(test)]
mod tests;
mod validate;
mod value;

use std::collections::BTreeMap;

use amiquip::{AmqpValue, FieldTable};

pub use ids::{new_id, now_ms};
pub(crate) use ids::{random_u64, uuid_v8};
pub use message::{Message, Received};
pub(crate) use validate::check_name;
pub use value::HeaderValue;

use crate::error::{Error, Result};
use validate::check_short;

/// The longest AMQP short string: routing keys, ids, header names, property strings.
pub const MAX_SHORT_STRING: usize = 255;

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

    fn validate(&self) -> Result<()> {
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
    fn type_for<'a>(&'a self, routing_key: &'a str) -> &'a str {
        match self.message_type.as_deref() {
            Some(t) if !t.is_empty() => t,
            _ if !routing_key.is_empty() => routing_key,
            _ => "message",
        }
    }

    /// Writes the reserved headers with the family's types: strings as long strings, version and
    /// attempt as 32-bit integers, first-seen as a 64-bit integer; empty optional values are
    /// absent.
    fn write(&self, table: &mut FieldTable, routing_key: &str, origin: Option<&str>) {
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
    /// nor `message_id` is there.
    fn read(
        table: &BTreeMap<String, HeaderValue>,
        message_id: Option<&str>,
        routing_key: &str,
        fallback_id: &dyn Fn() -> String,
    ) -> Envelope {
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
        let id = text(headers::ID)
            .or_else(|| message_id.filter(|m| !m.is_empty()).map(str::to_string))
            .unwrap_or_else(fallback_id);
        Envelope {
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
        }
    }
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
