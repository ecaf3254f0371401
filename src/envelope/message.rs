//! [`Message`]: body, envelope, application headers and AMQP properties; how a message goes on
//! the wire and how a delivery is read back.

use std::collections::BTreeMap;

use crate::wire::{AmqpProperties, AmqpValue, FieldTable};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::validate::{check_header_name, check_short, is_reserved, truncate};
use super::{headers, Envelope, HeaderValue, MAX_SHORT_STRING};
use crate::codec::Codec;
use crate::error::{Error, Result};

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
///
/// One naming rule: every builder is `with_*` — `with_id`, `with_type`, `with_header`,
/// `with_content_type`, `with_correlation_id`, … — as amiquip's `AmqpProperties::with_*` are;
/// what a message carries is read from its public fields (`m.envelope.message_type`,
/// `m.headers`, `m.content_type`) and [`id`](Self::id). (The names without `with_` still build,
/// deprecated, for one release.)
///
/// ```
/// use acemq_amqp::Message;
/// let m = Message::new(r#"{"sku":"A-1"}"#)
///     .with_type("order.placed")
///     .with_content_type("application/json")
///     .with_header("tenant", "acme");
/// assert_eq!(m.envelope.message_type.as_deref(), Some("order.placed"));
/// ```
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
    /// The header table as received, kept by a copy that no longer carries the received
    /// `properties` (see [`Message::received_table`]).
    pub(crate) received_headers: Option<std::sync::Arc<FieldTable>>,
    /// On a message as read: why the `x-acemq-id` it arrived with was not used as it came
    /// (see `envelope::read_id`), for the reader's log line and observer.
    pub(crate) replaced_id: Option<&'static str>,
}

impl From<Vec<u8>> for Message {
    /// [`Message::new`] with these bytes.
    fn from(body: Vec<u8>) -> Message {
        Message::new(body)
    }
}

impl From<&[u8]> for Message {
    /// [`Message::new`] with a copy of these bytes.
    fn from(body: &[u8]) -> Message {
        Message::new(body)
    }
}

impl From<&str> for Message {
    /// [`Message::new`] with these UTF-8 bytes.
    fn from(body: &str) -> Message {
        Message::new(body)
    }
}

impl From<String> for Message {
    /// [`Message::new`] with these UTF-8 bytes.
    fn from(body: String) -> Message {
        Message::new(body)
    }
}

impl Message {
    /// A message with these bytes as its body and a fresh envelope.
    pub fn new(body: impl Into<Vec<u8>>) -> Message {
        Message::with_envelope(body.into(), Envelope::new())
    }

    /// A message with this body and envelope, and nothing else set.
    fn with_envelope(body: Vec<u8>, envelope: Envelope) -> Message {
        Message {
            envelope,
            headers: BTreeMap::new(),
            body,
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
            replaced_id: None,
        }
    }

    /// A message whose body is `value` encoded by `codec`, with the codec's content type.
    ///
    /// # Errors
    ///
    /// [`Error::Codec`] when the value cannot be encoded.
    pub fn encode<T: Serialize + ?Sized>(codec: &dyn Codec, value: &T) -> Result<Message> {
        let body = crate::codec::encode_with(codec, value)?;
        Ok(Message::new(body).with_content_type(codec.content_type()))
    }

    /// Decodes the body with `codec` into a `T`.
    ///
    /// # Errors
    ///
    /// [`Error::Codec`] when the body does not decode into a `T`.
    pub fn decode<T: DeserializeOwned>(&self, codec: &dyn Codec) -> Result<T> {
        crate::codec::decode_typed_with(codec, &self.body, self.content_type.as_deref())
    }

    /// Decodes the body with the codec of the consumer that received it (JSON otherwise).
    ///
    /// # Errors
    ///
    /// [`Error::Codec`] when the body does not decode into a `T`.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T> {
        match &self.codec {
            Some(c) => crate::codec::decode_typed_with(
                c.as_ref(),
                &self.body,
                self.content_type.as_deref(),
            ),
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
    pub fn with_type(mut self, t: impl Into<String>) -> Self {
        self.envelope.message_type = Some(t.into());
        self
    }

    /// Sets the schema version of the payload (`x-acemq-version`, from 1). Defaults to 1.
    pub fn with_version(mut self, version: u32) -> Self {
        self.envelope.version = version.max(1);
        self
    }

    /// Sets the origin (`x-acemq-origin`, `service@host`). Defaults to the connection's.
    pub fn with_origin(mut self, origin: impl Into<String>) -> Self {
        self.envelope.origin = Some(origin.into());
        self
    }

    /// Sets where a claim-checked payload is kept (`x-acemq-claim`). Defaults to none.
    pub fn with_claim(mut self, key: impl Into<String>) -> Self {
        self.envelope.claim = Some(key.into());
        self
    }

    /// Sets the correlation id. Defaults to the message's own id.
    pub fn with_correlation_id(mut self, id: impl Into<String>) -> Self {
        self.envelope.correlation_id = Some(id.into());
        self
    }

    /// Sets the causation id.
    pub fn with_causation_id(mut self, id: impl Into<String>) -> Self {
        self.envelope.causation_id = Some(id.into());
        self
    }

    /// Sets the content type.
    pub fn with_content_type(mut self, ct: impl Into<String>) -> Self {
        self.content_type = Some(ct.into());
        self
    }

    /// Adds an application header. It is validated when published.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Sets AMQP `reply_to`.
    pub fn with_reply_to(mut self, queue: impl Into<String>) -> Self {
        self.reply_to = Some(queue.into());
        self
    }

    /// Sets AMQP `expiration` (per-message TTL).
    pub fn with_expiration(mut self, ttl: std::time::Duration) -> Self {
        self.expiration_ms = Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Sets AMQP `priority`.
    pub fn with_priority(mut self, priority: u8) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sets persistence. Defaults to true (delivery mode 2).
    pub fn with_persistent(mut self, persistent: bool) -> Self {
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
            .with_correlation_id(correlation)
            .with_causation_id(self.envelope.id.clone())
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

    /// Not for applications (feature `internals`): the properties a publish would carry, for
    /// this crate's benchmarks to give raw amiquip the same headers.
    #[cfg(feature = "internals")]
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
            // (A received message's id is already short: `envelope::read_id` hashes it so.)
            e.id = super::hash_id(e.id.as_bytes());
        }
        self.headers.retain(|name, value| {
            check_header_name(name).is_ok() && !is_reserved(name) && value.validate(name).is_ok()
        });
        self.engine_headers
            .retain(|name, value| check_header_name(name).is_ok() && value.validate(name).is_ok());
    }

    /// The header table as received (in the received `properties`, or kept by a copy), so that
    /// re-sending an unchanged header keeps the AMQP type it arrived with (a 32-bit integer stays
    /// 32-bit, a byte-array string stays a byte array). Nothing is copied per delivery for this.
    fn received_table(&self) -> Option<&FieldTable> {
        self.received_headers
            .as_deref()
            .or_else(|| self.properties.as_ref().and_then(|p| p.headers().as_ref()))
    }

    /// The AMQP properties to publish with `routing_key` (call [`validate`](Self::validate)
    /// first); `origin` is written when the envelope has none of its own.
    pub(crate) fn to_properties(&self, routing_key: &str, origin: Option<&str>) -> AmqpProperties {
        let received = self.received_table();
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

    /// A message as received: envelope from the reserved headers, the engine's other known
    /// reserved headers (the declared route) beside it, every other header as an application
    /// header. Reserved names this crate does not know are not handed to the application.
    pub(crate) fn from_delivery(
        body: Vec<u8>,
        props: AmqpProperties,
        received: Received,
    ) -> Message {
        let all: BTreeMap<String, HeaderValue> = props
            .headers()
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
        // The body is moved in after reading the envelope: only an id-less message (derived
        // id) needs to look at it, and nothing is copied per delivery.
        let derive = || derived_id(&received, &props, &body);
        let mut m = Message::from_headers(
            Vec::new(),
            all,
            props.message_id().as_deref(),
            &received.routing_key,
            &derive,
        );
        if let Some(why) = m.replaced_id {
            log::warn!(
                "acemq: a message on {:?} arrived with an {} it cannot carry as it came ({why}); \
                 it is handled, and copied, as message {}",
                received.routing_key,
                headers::ID,
                m.envelope.id
            );
        }
        m.body = body;
        m.content_type = props.content_type().clone();
        m.reply_to = props.reply_to().clone();
        m.amqp_correlation_id = props.correlation_id().clone();
        m.expiration_ms = props.expiration().as_ref().and_then(|e| e.parse().ok());
        m.priority = *props.priority();
        m.persistent = props.delivery_mode() == &Some(2);
        m.received = Some(received);
        m.properties = Some(props);
        m
    }

    /// A message from a header table (as received, or as the outbox stored it): the envelope
    /// read with every default, the engine's other known reserved headers (the declared route)
    /// kept beside it, every other header an application header. Reserved names this crate does
    /// not know are not handed to the application.
    pub(crate) fn from_headers(
        body: Vec<u8>,
        all: BTreeMap<String, HeaderValue>,
        message_id: Option<&str>,
        routing_key: &str,
        fallback_id: &dyn Fn() -> String,
    ) -> Message {
        let (envelope, replaced_id) = Envelope::read(&all, message_id, routing_key, fallback_id);
        // The family strips the namespace case-sensitively on read. (One pass, in key order:
        // each map is rebuilt from sorted entries.)
        let (mut application, mut engine) = (Vec::with_capacity(all.len()), Vec::new());
        for (k, v) in all {
            if !is_reserved(&k) {
                application.push((k, v));
            } else if ENGINE_HEADERS.contains(&k.as_str()) {
                engine.push((k, v));
            }
        }
        // Not `Message::new`: its fresh envelope (a random id, the clock) would be thrown away.
        let mut m = Message::with_envelope(body, envelope);
        m.replaced_id = replaced_id;
        m.headers = application.into_iter().collect();
        m.engine_headers = engine.into_iter().collect();
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
    super::uuid_v8(&d)
}

/// True when a table carries some reserved headers but not `x-acemq-id`, which every family
/// writer writes: the sign that amiquip cut the table short at a non-UTF-8 long string.
pub(super) fn looks_truncated(table: &BTreeMap<String, HeaderValue>) -> bool {
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
        // The family writes its own integers 32-bit (Go, Java; the envelope fixture's type), so
        // Go's readers, which take `int`, `int32` and `int64`, read them.
        HeaderValue::Int(i) if is_reserved(name) || name == headers::REPLAY_COUNT => {
            match i32::try_from(*i) {
                Ok(i) => AmqpValue::LongInt(i),
                Err(_) => AmqpValue::LongLongInt(*i),
            }
        }
        v => v.to_amqp(),
    }
}

/// Reserved headers the engine keeps beside the envelope, on the message and its copies.
const ENGINE_HEADERS: [&str; 3] = [headers::ROUTE, headers::ROUTE_POSITION, headers::ROUTE_ID];
