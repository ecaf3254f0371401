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

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use amiquip::{AmqpProperties, AmqpValue, FieldTable};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::Codec;
use crate::error::{Error, Result};

/// The names of the reserved headers of the wire contract, as the AceMQ family writes them.
///
/// The prefix is reserved as a namespace: an application may not set a header that starts with
/// it, and on receipt every header that starts with it is kept away from the application's
/// headers, whether this crate knows the name or not.
pub mod headers {
    /// The prefix reserved for the engine: an application header with it is refused.
    pub const RESERVED_PREFIX: &str = "x-acemq-";
    /// Stable message identity (long string); also the AMQP `message_id`. Always written.
    pub const ID: &str = "x-acemq-id";
    /// Message type, e.g. `order.placed` (long string). Always written: the routing key when
    /// not set (`message` when that is empty too).
    pub const TYPE: &str = "x-acemq-type";
    /// Schema version of the payload, from 1 (32-bit integer). Always written.
    pub const VERSION: &str = "x-acemq-version";
    /// Correlation of one business action (long string). Always written: the id when not set.
    pub const CORRELATION: &str = "x-acemq-correlation";
    /// Id of the message that caused this one (long string). Written only when set.
    pub const CAUSATION: &str = "x-acemq-causation";
    /// 1 on first delivery, +1 per retry (32-bit integer). Always written.
    pub const ATTEMPT: &str = "x-acemq-attempt";
    /// Epoch milliseconds when first published (64-bit integer). Always written.
    pub const FIRST_SEEN: &str = "x-acemq-first-seen";
    /// `service@host` of the publisher (long string). Always written by this crate.
    pub const ORIGIN: &str = "x-acemq-origin";
    /// Why a copy was dead-lettered or parked (long string). Written only when set.
    pub const ERROR: &str = "x-acemq-error";
    /// Where a claim-checked payload is kept (long string). Written only when set.
    pub const CLAIM: &str = "x-acemq-claim";
    /// A declared route: comma-separated step names (long string).
    pub const ROUTE: &str = "x-acemq-route";
    /// 0-based position in the declared route (32-bit integer).
    pub const ROUTE_POSITION: &str = "x-acemq-route-position";
    /// The run id of a declared route (long string).
    pub const ROUTE_ID: &str = "x-acemq-route-id";

    // Headers the family's patterns write *outside* the reserved prefix, so that they reach
    // the application's handlers (an `x-acemq-` name a reader does not know is dropped).

    /// Request/reply: where the reply goes (also the AMQP `reply_to` property).
    pub const REPLY_TO: &str = "acemq-reply-to";
    /// Request/reply: a responder's failure text on an empty reply.
    pub const REPLY_ERROR: &str = "acemq-error";
    /// Routing slip, JSON form.
    pub const ROUTING_SLIP: &str = "acemq-routing-slip";
    /// Replay: the queue a message was replayed from.
    pub const REPLAYED_FROM: &str = "acemq-replayed-from";
    /// Replay: when (an RFC 3339 instant).
    pub const REPLAYED_AT: &str = "acemq-replayed-at";
    /// Replay: how many times (integer).
    pub const REPLAY_COUNT: &str = "acemq-replay-count";
    /// Scheduler: the exchange to deliver to when due.
    pub const SCHEDULE_EXCHANGE: &str = "x-schedule-exchange";
    /// Scheduler: the routing key to deliver with when due.
    pub const SCHEDULE_ROUTING_KEY: &str = "x-schedule-routing-key";
    /// Scheduler: when it is due (epoch milliseconds, integer).
    pub const SCHEDULE_DUE_AT: &str = "x-schedule-due-at";
    /// Scheduler: the content type to deliver with.
    pub const SCHEDULE_CONTENT_TYPE: &str = "x-schedule-content-type";
}

/// The longest AMQP short string: routing keys, ids, header names, property strings.
pub const MAX_SHORT_STRING: usize = 255;

/// A header value.
#[derive(Clone, Debug, PartialEq)]
pub enum HeaderValue {
    /// UTF-8 text (AMQP long string).
    Text(String),
    /// A signed integer (AMQP long-long; any integer type is read into it).
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A floating point number (AMQP double).
    Float(f64),
    /// Bytes (AMQP byte array): use this for anything that may not be UTF-8.
    Bytes(Vec<u8>),
    /// A nested table.
    Table(BTreeMap<String, HeaderValue>),
    /// An array.
    Array(Vec<HeaderValue>),
    /// An AMQP timestamp (seconds since the epoch).
    Timestamp(u64),
    /// No value (AMQP void).
    Void,
}

impl HeaderValue {
    /// Text from bytes, refused with [`Error::InvalidHeader`] unless they are UTF-8.
    ///
    /// # Errors
    ///
    /// When `bytes` is not valid UTF-8; send it as [`HeaderValue::Bytes`] instead.
    pub fn try_text(name: &str, bytes: Vec<u8>) -> Result<HeaderValue> {
        String::from_utf8(bytes)
            .map(HeaderValue::Text)
            .map_err(|e| Error::InvalidHeader {
                name: truncate(name),
                reason: format!(
                    "value is not UTF-8 (invalid at byte {}); send it as HeaderValue::Bytes",
                    e.utf8_error().valid_up_to()
                ),
            })
    }

    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            HeaderValue::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an integer.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            HeaderValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub(crate) fn to_amqp(&self) -> AmqpValue {
        match self {
            HeaderValue::Text(s) => AmqpValue::LongString(s.clone()),
            HeaderValue::Int(i) => AmqpValue::LongLongInt(*i),
            HeaderValue::Bool(b) => AmqpValue::Boolean(*b),
            HeaderValue::Float(f) => AmqpValue::Double(*f),
            HeaderValue::Bytes(b) => AmqpValue::ByteArray(b.clone()),
            HeaderValue::Table(t) => {
                AmqpValue::FieldTable(t.iter().map(|(k, v)| (k.clone(), v.to_amqp())).collect())
            }
            HeaderValue::Array(a) => AmqpValue::FieldArray(a.iter().map(|v| v.to_amqp()).collect()),
            HeaderValue::Timestamp(t) => AmqpValue::Timestamp(*t),
            HeaderValue::Void => AmqpValue::Void,
        }
    }

    pub(crate) fn from_amqp(value: &AmqpValue) -> HeaderValue {
        match value {
            AmqpValue::Boolean(b) => HeaderValue::Bool(*b),
            AmqpValue::ShortShortInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::ShortShortUInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::ShortInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::ShortUInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::LongInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::LongUInt(i) => HeaderValue::Int(i64::from(*i)),
            AmqpValue::LongLongInt(i) => HeaderValue::Int(*i),
            AmqpValue::Float(f) => HeaderValue::Float(f64::from(*f)),
            AmqpValue::Double(f) => HeaderValue::Float(*f),
            AmqpValue::DecimalValue(d) => {
                HeaderValue::Float(f64::from(d.value) / 10f64.powi(i32::from(d.scale)))
            }
            AmqpValue::LongString(s) => HeaderValue::Text(s.clone()),
            AmqpValue::FieldArray(a) => HeaderValue::Array(a.iter().map(Self::from_amqp).collect()),
            AmqpValue::Timestamp(t) => HeaderValue::Timestamp(*t),
            AmqpValue::FieldTable(t) => HeaderValue::Table(
                t.iter()
                    .map(|(k, v)| (k.clone(), Self::from_amqp(v)))
                    .collect(),
            ),
            AmqpValue::ByteArray(b) => HeaderValue::Bytes(b.clone()),
            AmqpValue::Void => HeaderValue::Void,
        }
    }

    fn validate(&self, name: &str) -> Result<()> {
        match self {
            HeaderValue::Table(t) => {
                for (k, v) in t {
                    check_header_name(k)?;
                    v.validate(name)?;
                }
                Ok(())
            }
            HeaderValue::Array(a) => a.iter().try_for_each(|v| v.validate(name)),
            HeaderValue::Float(f) if !f.is_finite() => Err(Error::InvalidHeader {
                name: truncate(name),
                reason: "a float must be finite".into(),
            }),
            _ => Ok(()),
        }
    }
}

impl From<&str> for HeaderValue {
    fn from(s: &str) -> Self {
        HeaderValue::Text(s.to_string())
    }
}
impl From<String> for HeaderValue {
    fn from(s: String) -> Self {
        HeaderValue::Text(s)
    }
}
impl From<i64> for HeaderValue {
    fn from(i: i64) -> Self {
        HeaderValue::Int(i)
    }
}
impl From<i32> for HeaderValue {
    fn from(i: i32) -> Self {
        HeaderValue::Int(i64::from(i))
    }
}
impl From<u32> for HeaderValue {
    fn from(i: u32) -> Self {
        HeaderValue::Int(i64::from(i))
    }
}
impl From<bool> for HeaderValue {
    fn from(b: bool) -> Self {
        HeaderValue::Bool(b)
    }
}
impl From<f64> for HeaderValue {
    fn from(f: f64) -> Self {
        HeaderValue::Float(f)
    }
}
impl From<Vec<u8>> for HeaderValue {
    fn from(b: Vec<u8>) -> Self {
        HeaderValue::Bytes(b)
    }
}

/// The AceMQ envelope: the identity and history of a message, carried in the reserved headers.
///
/// Rust names are Rust's; on the wire each field is the header named in [`headers`]
/// (`correlation_id` travels as `x-acemq-correlation`, `message_type` as `x-acemq-type`, …).
///
/// Reading is forgiving, as in every AceMQ library: a string may arrive as a long string or as a
/// byte array (UTF-8), an integer in any width or as decimal text; an empty string is absent and
/// an unreadable value takes its default. A received message's envelope has every default
/// applied: its type is the routing key it arrived on when it carried none, its correlation id
/// its own id, its version and attempt at least 1, its first-seen time now when missing.
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
        let counter = |name: &str| {
            int(name)
                .filter(|n| *n >= 1)
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
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

/// Where and how a received message arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// The exchange it was published to (empty for the default exchange).
    pub exchange: String,
    /// The routing key it was published with.
    pub routing_key: String,
    /// True when the broker delivered it before.
    pub redelivered: bool,
    /// The delivery tag on the channel that delivered it.
    pub delivery_tag: u64,
}

/// A message: body, envelope, application headers and AMQP properties.
///
/// The same type is published and received, so a received message can be forwarded as it is.
/// Build one with [`Message::new`] (raw bytes) or [`Message::encode`] (a value through a
/// [`Codec`]); every builder call is cheap and nothing is validated until it is published.
#[derive(Clone, Debug)]
pub struct Message {
    /// The envelope (reserved headers).
    pub envelope: Envelope,
    /// Application headers (never with the reserved prefix).
    pub headers: BTreeMap<String, HeaderValue>,
    /// The body.
    pub body: Vec<u8>,
    /// The content type, e.g. `application/json`.
    pub content_type: Option<String>,
    /// AMQP `reply_to`.
    pub reply_to: Option<String>,
    /// AMQP `correlation_id` property (request/reply uses it; the envelope's correlation id is a
    /// header).
    pub amqp_correlation_id: Option<String>,
    /// AMQP `expiration` in milliseconds.
    pub expiration_ms: Option<u64>,
    /// AMQP `priority`.
    pub priority: Option<u8>,
    /// Persistent (delivery mode 2). Defaults to true.
    pub persistent: bool,
    /// Set on a received message: where it came from.
    pub received: Option<Received>,
    /// All AMQP properties of a received message, as amiquip read them.
    pub properties: Option<AmqpProperties>,
    /// Reserved headers that belong to the engine but not to the envelope (`x-acemq-claim`, the
    /// routing slip's `x-acemq-route…`): kept on copies, never settable by the application.
    pub(crate) engine_headers: BTreeMap<String, HeaderValue>,
    /// The codec of the consumer that received it, for [`Message::payload`].
    pub(crate) codec: Option<std::sync::Arc<dyn Codec>>,
    /// The header table as received, so that a copy re-sends each unchanged header with the
    /// AMQP type it arrived with (a 32-bit integer stays 32-bit, a byte-array string stays a
    /// byte array).
    pub(crate) received_headers: Option<std::sync::Arc<FieldTable>>,
}

impl Message {
    /// A message with these bytes as its body and a fresh envelope.
    pub fn new(body: impl Into<Vec<u8>>) -> Message {
        Message {
            envelope: Envelope::new(),
            headers: BTreeMap::new(),
            body: body.into(),
            content_type: None,
            reply_to: None,
            amqp_correlation_id: None,
            expiration_ms: None,
            priority: None,
            persistent: true,
            received: None,
            properties: None,
            engine_headers: BTreeMap::new(),
            codec: None,
            received_headers: None,
        }
    }

    /// A message whose body is `value` encoded by `codec`, with the codec's content type.
    ///
    /// # Errors
    ///
    /// [`Error::Codec`] when the value cannot be encoded.
    pub fn encode<T: Serialize + ?Sized>(codec: &dyn Codec, value: &T) -> Result<Message> {
        let body = crate::codec::encode_with(codec, value)?;
        Ok(Message::new(body).content_type(codec.content_type()))
    }

    /// Decodes the body with `codec` into a `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Codec`] when the body does not decode into a `T`.
    pub fn decode<T: DeserializeOwned>(&self, codec: &dyn Codec) -> Result<T> {
        crate::codec::decode_with(codec, &self.body)
    }

    /// Decodes the body with the codec of the consumer that received it (JSON otherwise).
    ///
    /// # Errors
    ///
    /// [`Error::Codec`] when the body does not decode into a `T`.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T> {
        match &self.codec {
            Some(c) => crate::codec::decode_with(c.as_ref(), &self.body),
            None => crate::codec::decode_with(&crate::codec::JsonCodec, &self.body),
        }
    }

    /// A reserved header the engine keeps beside the envelope (`x-acemq-claim`,
    /// `x-acemq-route`, …).
    pub fn engine_header(&self, name: &str) -> Option<&HeaderValue> {
        self.engine_headers.get(name)
    }

    /// The message id (`x-acemq-id`).
    pub fn id(&self) -> &str {
        &self.envelope.id
    }

    /// Sets the message id. Defaults to a fresh random id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.envelope.id = id.into();
        self
    }

    /// Sets the message type (`x-acemq-type`).
    pub fn message_type(mut self, t: impl Into<String>) -> Self {
        self.envelope.message_type = Some(t.into());
        self
    }

    /// Sets the schema version of the payload (`x-acemq-version`, from 1). Defaults to 1.
    pub fn version(mut self, version: u32) -> Self {
        self.envelope.version = version.max(1);
        self
    }

    /// Sets the origin (`x-acemq-origin`, `service@host`). Defaults to the connection's.
    pub fn origin(mut self, origin: impl Into<String>) -> Self {
        self.envelope.origin = Some(origin.into());
        self
    }

    /// Sets where a claim-checked payload is kept (`x-acemq-claim`). Defaults to none.
    pub fn claim(mut self, key: impl Into<String>) -> Self {
        self.envelope.claim = Some(key.into());
        self
    }

    /// Sets the correlation id. Defaults to the message's own id.
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.envelope.correlation_id = Some(id.into());
        self
    }

    /// Sets the causation id.
    pub fn causation_id(mut self, id: impl Into<String>) -> Self {
        self.envelope.causation_id = Some(id.into());
        self
    }

    /// Sets the content type.
    pub fn content_type(mut self, ct: impl Into<String>) -> Self {
        self.content_type = Some(ct.into());
        self
    }

    /// Adds an application header. It is validated when published.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Sets AMQP `reply_to`.
    pub fn reply_to(mut self, queue: impl Into<String>) -> Self {
        self.reply_to = Some(queue.into());
        self
    }

    /// Sets AMQP `expiration` (per-message TTL).
    pub fn expiration(mut self, ttl: std::time::Duration) -> Self {
        self.expiration_ms = Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Sets AMQP `priority`.
    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sets persistence. Defaults to true (delivery mode 2).
    pub fn persistent(mut self, persistent: bool) -> Self {
        self.persistent = persistent;
        self
    }

    /// A new message caused by this one: fresh id, same correlation id, causation = this id.
    pub fn caused(&self, body: impl Into<Vec<u8>>) -> Message {
        let correlation = self
            .envelope
            .correlation_id
            .clone()
            .unwrap_or_else(|| self.envelope.id.clone());
        Message::new(body)
            .correlation_id(correlation)
            .causation_id(self.envelope.id.clone())
    }

    /// Checks every header and property that goes on the wire.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidHeader`] naming the header: the reserved prefix on an application header,
    /// a short string over 255 bytes, an empty id, a non-finite float.
    pub fn validate(&self) -> Result<()> {
        self.envelope.validate()?;
        for (name, value) in &self.headers {
            check_header_name(name)?;
            if is_reserved(name) {
                return Err(Error::InvalidHeader {
                    name: truncate(name),
                    reason: format!(
                        "the prefix {:?} is reserved for the engine",
                        headers::RESERVED_PREFIX
                    ),
                });
            }
            value.validate(name)?;
        }
        for (name, value) in &self.engine_headers {
            check_header_name(name)?;
            value.validate(name)?;
        }
        for (name, value) in [
            ("content_type", &self.content_type),
            ("reply_to", &self.reply_to),
            ("correlation_id", &self.amqp_correlation_id),
        ] {
            if let Some(v) = value {
                check_short(name, v)?;
            }
        }
        Ok(())
    }

    #[doc(hidden)]
    pub fn from_raw_delivery_for_tests(d: &amiquip::Delivery) -> Message {
        Message::from_delivery(
            d.body.clone(),
            d.properties.clone(),
            Received {
                exchange: d.exchange.clone(),
                routing_key: d.routing_key.clone(),
                redelivered: d.redelivered,
                delivery_tag: d.delivery_tag(),
            },
        )
    }

    #[doc(hidden)]
    pub fn to_properties_for_bench(&self, routing_key: &str, origin: &str) -> AmqpProperties {
        self.to_properties(routing_key, Some(origin))
    }

    /// Removes the application and engine headers that would not pass [`validate`](Self::validate).
    ///
    /// Envelope fields over the short-string limit are dropped too; an over-long id is replaced
    /// by the SHA-256 hex of it, which stays the same for every copy.
    pub(crate) fn drop_invalid_headers(&mut self) {
        let e = &mut self.envelope;
        if e.id.len() > MAX_SHORT_STRING {
            use sha2::Digest;
            e.id = sha2::Sha256::digest(e.id.as_bytes())
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
        }
        self.headers.retain(|name, value| {
            check_header_name(name).is_ok() && !is_reserved(name) && value.validate(name).is_ok()
        });
        self.engine_headers
            .retain(|name, value| check_header_name(name).is_ok() && value.validate(name).is_ok());
    }

    /// The AMQP properties to publish with `routing_key` (call [`validate`](Self::validate)
    /// first); `origin` is written when the envelope has none of its own.
    pub(crate) fn to_properties(&self, routing_key: &str, origin: Option<&str>) -> AmqpProperties {
        let received = self.received_headers.as_deref();
        let mut table = FieldTable::new();
        for (k, v) in self.headers.iter().chain(&self.engine_headers) {
            table.insert(k.clone(), wire_value(received, k, v));
        }
        self.envelope.write(&mut table, routing_key, origin);
        let mut props = AmqpProperties::default()
            .with_message_id(self.envelope.id.clone())
            .with_headers(table)
            .with_delivery_mode(if self.persistent { 2 } else { 1 });
        if let Some(ct) = &self.content_type {
            props = props.with_content_type(ct.clone());
        }
        if let Some(r) = &self.reply_to {
            props = props.with_reply_to(r.clone());
        }
        if let Some(c) = &self.amqp_correlation_id {
            props = props.with_correlation_id(c.clone());
        }
        if let Some(e) = self.expiration_ms {
            props = props.with_expiration(e.to_string());
        }
        if let Some(p) = self.priority {
            props = props.with_priority(p);
        }
        props
    }

    /// Moves the body, properties, exchange and routing key out of an amiquip delivery into a
    /// received message; what is left of `d` (its tag, on its channel) is enough to settle it.
    pub(crate) fn take_delivery(d: &mut amiquip::Delivery) -> Message {
        let received = Received {
            exchange: std::mem::take(&mut d.exchange),
            routing_key: std::mem::take(&mut d.routing_key),
            redelivered: d.redelivered,
            delivery_tag: d.delivery_tag(),
        };
        let body = std::mem::take(&mut d.body);
        let properties = std::mem::take(&mut d.properties);
        Message::from_delivery(body, properties, received)
    }

    /// A message as received: envelope from the reserved headers, the engine's other known
    /// reserved headers (the declared route) beside it, every other header as an application
    /// header. Reserved names this crate does not know are not handed to the application.
    pub(crate) fn from_delivery(
        body: Vec<u8>,
        props: AmqpProperties,
        received: Received,
    ) -> Message {
        let raw = props.headers().clone();
        let all: BTreeMap<String, HeaderValue> = raw
            .as_ref()
            .map(|t| {
                t.iter()
                    .map(|(k, v)| (k.clone(), HeaderValue::from_amqp(v)))
                    .collect()
            })
            .unwrap_or_default();
        if looks_truncated(&all) {
            log::warn!(
                "acemq: a message on {:?} (message_id {:?}) carries reserved headers but no {}: \
                 its header table was probably cut short (amiquip drops a long-string header \
                 that is not UTF-8 and every header after it); its identity falls back to \
                 message_id",
                received.routing_key,
                props.message_id(),
                headers::ID
            );
        }
        let derive = || derived_id(&received, &props, &body);
        let mut m = Message::from_headers(
            body.clone(),
            all,
            props.message_id().as_deref(),
            &received.routing_key,
            &derive,
        );
        m.content_type = props.content_type().clone();
        m.reply_to = props.reply_to().clone();
        m.amqp_correlation_id = props.correlation_id().clone();
        m.expiration_ms = props.expiration().as_ref().and_then(|e| e.parse().ok());
        m.priority = *props.priority();
        m.persistent = props.delivery_mode() == &Some(2);
        m.received = Some(received);
        m.properties = Some(props);
        m.received_headers = raw.map(std::sync::Arc::new);
        m
    }

    /// A message from a header table (as received, or as the outbox stored it): the envelope
    /// read with every default, the engine's other known reserved headers (the declared route)
    /// kept beside it, every other header an application header. Reserved names this crate does
    /// not know are not handed to the application.
    pub(crate) fn from_headers(
        body: Vec<u8>,
        mut all: BTreeMap<String, HeaderValue>,
        message_id: Option<&str>,
        routing_key: &str,
        fallback_id: &dyn Fn() -> String,
    ) -> Message {
        let envelope = Envelope::read(&all, message_id, routing_key, fallback_id);
        // The family strips the namespace case-sensitively on read.
        let reserved: Vec<String> = all.keys().filter(|k| is_reserved(k)).cloned().collect();
        let mut engine_headers = BTreeMap::new();
        for k in reserved {
            if let Some(v) = all.remove(&k) {
                if ENGINE_HEADERS.contains(&k.as_str()) {
                    engine_headers.insert(k, v);
                }
            }
        }
        let mut m = Message::new(body);
        m.envelope = envelope;
        m.headers = all;
        m.engine_headers = engine_headers;
        m
    }
}

/// The id of a delivery that carries neither `x-acemq-id` nor `message_id`: derived from what
/// the broker redelivers unchanged (exchange, routing key, properties, body), so every delivery
/// of the message reads with the same id and an idempotent consumer recognises a redelivery.
/// Two such messages identical in all of these are, by this rule, one message. The form is a
/// UUID (version 8, "custom"), as the family's readers expect an id to look.
fn derived_id(received: &Received, props: &AmqpProperties, body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(received.exchange.as_bytes());
    field(received.routing_key.as_bytes());
    // Every property the broker keeps, in a fixed order; headers in the table's sorted order,
    // without those the broker adds or changes on redelivery or dead-lettering (a quorum queue
    // counts deliveries in `x-delivery-count`).
    let kept: Vec<_> = props
        .headers()
        .iter()
        .flatten()
        .filter(|(k, _)| !is_broker_header(k))
        .collect();
    field(format!("{kept:?}").as_bytes());
    for text in [
        props.content_type(),
        props.content_encoding(),
        props.correlation_id(),
        props.reply_to(),
        props.expiration(),
        props.type_(),
        props.user_id(),
        props.app_id(),
        props.cluster_id(),
    ] {
        field(text.as_deref().unwrap_or("\u{0}").as_bytes());
    }
    field(
        format!(
            "{:?}{:?}{:?}",
            props.delivery_mode(),
            props.priority(),
            props.timestamp()
        )
        .as_bytes(),
    );
    field(body);
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// True when a table carries some reserved headers but not `x-acemq-id`, which every family
/// writer writes: the sign that amiquip cut the table short at a non-UTF-8 long string.
fn looks_truncated(table: &BTreeMap<String, HeaderValue>) -> bool {
    !table.contains_key(headers::ID) && table.keys().any(|k| is_reserved(k))
}

/// Headers RabbitMQ adds or rewrites on a message it redelivers or dead-letters.
fn is_broker_header(name: &str) -> bool {
    name == "x-delivery-count"
        || name.starts_with("x-death")
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

/// The AMQP value to send for header `name`: the value as it was received when it is unchanged
/// (so its type is kept), else the value's own encoding. Reserved integers go as 32-bit
/// integers, as the family writes them.
fn wire_value(received: Option<&FieldTable>, name: &str, value: &HeaderValue) -> AmqpValue {
    if let Some(raw) = received.and_then(|r| r.get(name)) {
        if HeaderValue::from_amqp(raw) == *value {
            return raw.clone();
        }
    }
    match value {
        HeaderValue::Int(i) if is_reserved(name) => match i32::try_from(*i) {
            Ok(i) => AmqpValue::LongInt(i),
            Err(_) => AmqpValue::LongLongInt(*i),
        },
        v => v.to_amqp(),
    }
}

/// Reserved headers the engine keeps beside the envelope, on the message and its copies.
const ENGINE_HEADERS: [&str; 3] = [headers::ROUTE, headers::ROUTE_POSITION, headers::ROUTE_ID];

/// True for a name in the reserved namespace: a case-sensitive prefix match, as in every AceMQ
/// library (`X-AceMQ-Tenant` is an application header there, so it is one here too, and a copy
/// of a message carrying it keeps it).
fn is_reserved(name: &str) -> bool {
    name.starts_with(headers::RESERVED_PREFIX)
}

fn check_header_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidHeader {
            name: String::new(),
            reason: "a header name must not be empty".into(),
        });
    }
    check_short(name, name)
}

fn check_short(name: &str, value: &str) -> Result<()> {
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

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// 64 random bits (from the standard library's randomly keyed hasher and a counter).
pub(crate) fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(n);
    h.write_i64(now_ms());
    h.finish()
}

/// A fresh random identifier in the UUID version 4 text form.
pub fn new_id() -> String {
    let hi = (random_u64() & 0xffff_ffff_ffff_0fff) | 0x4000;
    let lo = (random_u64() & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_with_reserved_headers_but_no_id_looks_truncated() {
        let mut t = BTreeMap::new();
        assert!(
            !looks_truncated(&t),
            "a foreign message with no reserved headers"
        );
        t.insert(headers::ATTEMPT.to_string(), HeaderValue::Int(1));
        assert!(looks_truncated(&t));
        t.insert(headers::ID.to_string(), HeaderValue::from("i"));
        assert!(!looks_truncated(&t));
    }

    #[test]
    fn ids_are_unique_and_uuid_shaped() {
        let a = new_id();
        let b = new_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn the_reserved_prefix_is_refused_and_matched_case_sensitively() {
        let m = Message::new("x").header("x-acemq-id", "forged");
        let e = m.validate().unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        // The family's prefix match is case-sensitive: another spelling is the application's.
        assert!(Message::new("x")
            .header("X-AceMQ-Tenant", "t")
            .validate()
            .is_ok());
    }

    #[test]
    fn oversize_short_strings_are_refused() {
        let long = "k".repeat(256);
        assert!(Message::new("x")
            .header(long.clone(), 1)
            .validate()
            .is_err());
        assert!(Message::new("x").with_id(long.clone()).validate().is_err());
        // Envelope values other than the id are long strings: no short-string limit.
        assert!(Message::new("x").message_type(long).validate().is_ok());
        assert!(Message::new("x")
            .header("k".repeat(255), 1)
            .validate()
            .is_ok());
    }

    #[test]
    fn non_utf8_text_is_refused() {
        let e = HeaderValue::try_text("note", vec![b'a', 0xff, b'b']).unwrap_err();
        assert!(matches!(e, Error::InvalidHeader { .. }), "{e}");
        assert_eq!(
            HeaderValue::try_text("note", b"ok".to_vec()).unwrap(),
            HeaderValue::Text("ok".into())
        );
    }

    /// Whatever another client puts in the headers (reserved names with the wrong types,
    /// nested tables, huge or negative attempts), reading never panics, the attempt is at least
    /// 1, and a copy either validates or is refused with an error.
    #[test]
    fn reading_arbitrary_headers_never_panics() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let names = [
            headers::ID,
            headers::ATTEMPT,
            headers::FIRST_SEEN,
            headers::CORRELATION,
            headers::VERSION,
            headers::ORIGIN,
            headers::ERROR,
            headers::CLAIM,
            "x-acemq-route",
            "x-death",
            "tenant",
            "",
        ];
        for _ in 0..2000 {
            let mut table = FieldTable::new();
            for _ in 0..(next() % 6) {
                let name = names[(next() % names.len() as u64) as usize].to_string();
                let value = match next() % 9 {
                    0 => AmqpValue::LongString("x".repeat((next() % 300) as usize)),
                    1 => AmqpValue::LongLongInt(next() as i64),
                    2 => AmqpValue::LongInt(next() as i32),
                    3 => AmqpValue::Boolean(next() % 2 == 0),
                    4 => AmqpValue::Double(f64::from_bits(next())),
                    5 => AmqpValue::ByteArray(vec![0xff; (next() % 4) as usize]),
                    6 => AmqpValue::FieldArray(vec![AmqpValue::Void, AmqpValue::ShortShortInt(-1)]),
                    7 => AmqpValue::FieldTable(FieldTable::new()),
                    _ => AmqpValue::Timestamp(next()),
                };
                table.insert(name, value);
            }
            let props = AmqpProperties::default().with_headers(table);
            let m = Message::from_delivery(
                vec![1, 2, 3],
                props,
                Received {
                    exchange: String::new(),
                    routing_key: "q".into(),
                    redelivered: false,
                    delivery_tag: 1,
                },
            );
            assert!(m.envelope.attempt >= 1);
            let _ = m.validate();
            assert!(m.envelope.version >= 1);
            assert!(!m.envelope.id.is_empty());
            let _ = m.to_properties("q", None);
            let mut copy = m.clone();
            copy.drop_invalid_headers();
            assert!(
                copy.validate().is_ok(),
                "a sanitised copy can always be sent"
            );
        }
    }

    #[test]
    fn envelope_round_trips_through_properties() {
        let m = Message::new("b")
            .message_type("order.placed")
            .causation_id("c-1")
            .header("tenant", "t-7")
            .header("n", 5);
        let props = m.to_properties("q", Some("svc@h"));
        let back = Message::from_delivery(
            m.body.clone(),
            props,
            Received {
                exchange: String::new(),
                routing_key: "q".into(),
                redelivered: false,
                delivery_tag: 1,
            },
        );
        assert_eq!(back.envelope.id, m.envelope.id);
        assert_eq!(back.envelope.correlation_id.as_deref(), Some(m.id()));
        assert_eq!(back.envelope.message_type.as_deref(), Some("order.placed"));
        assert_eq!(back.envelope.attempt, 1);
        assert_eq!(back.headers.get("tenant"), Some(&HeaderValue::from("t-7")));
        assert_eq!(back.headers.get("n"), Some(&HeaderValue::Int(5)));
        assert!(!back.headers.contains_key(headers::ID));
    }
}
