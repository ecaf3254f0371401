//! [`received`]: a [`Message`] as a consumer would hand it to a handler, without a broker.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::transport::{AmqpProperties, FieldTable};

use crate::codec::{Codec, JsonCodec};
use crate::envelope::{headers, now_ms, HeaderValue, Message, Received};

/// The routing key a [`received`] message arrived with when its type does not say.
pub const DEFAULT_ROUTING_KEY: &str = "test";

/// `message` as a consumer would hand it to its handler: put on the wire and read back exactly
/// as a delivery is read, so that a handler can be unit-tested by calling
/// [`Handler::handle`](crate::Handler::handle) directly, without a broker — the pattern
/// wrappers too ([`idempotent`](fn@crate::patterns::idempotent::idempotent),
/// [`ordered`](crate::patterns::ordering::ordered), [`chain`](fn@crate::patterns::chain::chain), …).
///
/// What the handler sees is what a consumer would give it: the envelope read back with every
/// default (type = routing key when it has none, correlation = its id, attempt and version at
/// least 1), application headers as the reader returns them, the engine's own reserved
/// headers kept aside, [`Message::received`] set, [`Message::payload`] decoding with the
/// consumer's codec. By default it is a first delivery (attempt 1, not redelivered) from the
/// default exchange with routing key [`DEFAULT_ROUTING_KEY`] (or the message's type); the
/// setters on [`Delivered`] change that. `Delivered` dereferences to the [`Message`], so
/// `handler.handle(&received(m))` works as it is.
///
/// ```
/// use acemq_amqp::patterns::idempotent::{idempotent, IdempotentOptions};
/// use acemq_amqp::patterns::idempotency::InMemoryIdempotencyStore;
/// use acemq_amqp::testing::received;
/// use acemq_amqp::{Handler, Message, Outcome};
/// use std::sync::atomic::{AtomicUsize, Ordering};
///
/// let charged = AtomicUsize::new(0);
/// let handler = idempotent(
///     InMemoryIdempotencyStore::default(),
///     |m: &Message| {
///         assert_eq!(m.envelope.attempt, 1);
///         charged.fetch_add(1, Ordering::SeqCst);
///         Ok(Outcome::Accept)
///     },
///     IdempotentOptions::default(),
/// );
/// let message = received(Message::new(r#"{"order":"o-1"}"#).with_id("order-o-1"));
/// assert_eq!(handler.handle(&message).unwrap(), Outcome::Accept);
/// // The broker redelivers it (a lost acknowledgement): the effect is not applied twice.
/// let again = received(Message::new(r#"{"order":"o-1"}"#).with_id("order-o-1")).redelivered(true);
/// assert_eq!(handler.handle(&again).unwrap(), Outcome::Accept);
/// assert_eq!(charged.load(Ordering::SeqCst), 1);
/// ```
///
/// # Panics
///
/// When `message` would be refused by [`Message::validate`] (no publisher could send it, so no
/// consumer could receive it); to test what another library may send, set raw wire headers
/// with [`Delivered::header`] instead.
pub fn received(message: impl Into<Message>) -> Delivered {
    let source = message.into();
    if let Err(e) = source.validate() {
        panic!("received(): no consumer could receive this message: {e}");
    }
    let routing_key = source
        .envelope
        .message_type
        .clone()
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| DEFAULT_ROUTING_KEY.to_string());
    let mut d = Delivered {
        built: Message::new(Vec::new()),
        source,
        exchange: String::new(),
        routing_key,
        redelivered: false,
        delivery_tag: 1,
        wire_headers: Vec::new(),
        without_envelope: false,
        codec: Arc::new(JsonCodec),
    };
    d.build();
    d
}

/// A message as a consumer received it, made by [`received`]; dereferences to the
/// [`Message`] the handler gets. Each setter returns it changed.
#[derive(Clone)]
pub struct Delivered {
    source: Message,
    exchange: String,
    routing_key: String,
    redelivered: bool,
    delivery_tag: u64,
    wire_headers: Vec<(String, HeaderValue)>,
    without_envelope: bool,
    codec: Arc<dyn Codec>,
    built: Message,
}

impl std::fmt::Debug for Delivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Delivered").field(&self.built).finish()
    }
}

impl Delivered {
    /// Sets the delivery's `x-acemq-attempt`: 1 is the first delivery, 3 the second retry.
    /// Defaults to the message's (1 for a new one). 0 reads as 1, as on the wire.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.source.envelope.attempt = attempt;
        self.rebuilt()
    }

    /// Sets `x-acemq-first-seen`, in epoch milliseconds. Defaults to the message's (when it
    /// was made).
    pub fn first_seen_ms(mut self, epoch_ms: i64) -> Self {
        self.source.envelope.first_seen_ms = epoch_ms;
        self.rebuilt()
    }

    /// Sets `x-acemq-first-seen` to `age` before now: a message that has been retried for
    /// that long (for a handler, or a retry policy's age limit, that looks at it).
    pub fn first_seen_ago(self, age: Duration) -> Self {
        let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        let at = now_ms().saturating_sub(age);
        self.first_seen_ms(at)
    }

    /// Sets the broker's redelivered flag ([`Received::redelivered`]): the broker delivered
    /// it before (a consumer died or a connection dropped before the acknowledgement).
    /// Defaults to false.
    pub fn redelivered(mut self, redelivered: bool) -> Self {
        self.redelivered = redelivered;
        self.rebuilt()
    }

    /// Sets the exchange it was published to. Defaults to the default exchange (empty).
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self.rebuilt()
    }

    /// Sets the routing key it arrived with (also its type when it has none). Defaults to
    /// the message's type, else [`DEFAULT_ROUTING_KEY`].
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = routing_key.into();
        self.rebuilt()
    }

    /// Sets the delivery tag. Defaults to 1.
    pub fn delivery_tag(mut self, tag: u64) -> Self {
        self.delivery_tag = tag;
        self.rebuilt()
    }

    /// Puts a header on the wire as another client might have written it, after the
    /// envelope (so it may replace a reserved one): `header("x-acemq-attempt", "3")` is an
    /// attempt written as text, which the reader accepts; `header("x-death", …)` is the
    /// broker's. It is read back as a consumer reads it: a reserved name this crate does not
    /// know is not handed to the application.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.wire_headers.push((name.into(), value.into()));
        self.rebuilt()
    }

    /// Sends it as a client outside the family would: without any `x-acemq-` header and
    /// without AMQP `message_id`. The consumer then reads the defaults, and an id derived from
    /// the delivery (the same on every redelivery).
    pub fn without_envelope(mut self) -> Self {
        self.without_envelope = true;
        self.rebuilt()
    }

    /// Sets the consumer's codec, which [`Message::payload`] decodes with. Defaults to
    /// [`JsonCodec`], a consumer's default.
    pub fn codec(mut self, codec: impl Codec + 'static) -> Self {
        self.codec = Arc::new(codec);
        self.rebuilt()
    }

    /// The message the handler gets.
    pub fn message(&self) -> &Message {
        &self.built
    }

    /// The message the handler gets, by value.
    pub fn into_message(self) -> Message {
        self.built
    }

    fn rebuilt(mut self) -> Self {
        self.build();
        self
    }

    fn build(&mut self) {
        let m = &self.source;
        let sent = m.to_properties(&self.routing_key, None);
        let mut table = sent.headers().clone().unwrap_or_default();
        if self.without_envelope {
            table.retain(|name, _| !name.starts_with(headers::RESERVED_PREFIX));
        }
        for (name, value) in &self.wire_headers {
            table.insert(name.clone(), value.to_amqp());
        }
        let props = properties(m, table, !self.without_envelope);
        let mut built = Message::from_delivery(
            m.body.clone(),
            props,
            Received {
                exchange: self.exchange.clone(),
                routing_key: self.routing_key.clone(),
                redelivered: self.redelivered,
                delivery_tag: self.delivery_tag,
            },
        );
        built.codec = Some(self.codec.clone());
        self.built = built;
    }
}

/// The AMQP properties `m` is published with, with this header table and, when `with_id`, its
/// `message_id`.
fn properties(m: &Message, table: FieldTable, with_id: bool) -> AmqpProperties {
    let mut p = AmqpProperties::default()
        .with_headers(table)
        .with_delivery_mode(if m.persistent { 2 } else { 1 });
    if with_id {
        p = p.with_message_id(m.envelope.id.clone());
    }
    if let Some(ct) = &m.content_type {
        p = p.with_content_type(ct.clone());
    }
    if let Some(r) = &m.reply_to {
        p = p.with_reply_to(r.clone());
    }
    if let Some(c) = &m.amqp_correlation_id {
        p = p.with_correlation_id(c.clone());
    }
    if let Some(e) = m.expiration_ms {
        p = p.with_expiration(e.to_string());
    }
    if let Some(pr) = m.priority {
        p = p.with_priority(pr);
    }
    p
}

impl Deref for Delivered {
    type Target = Message;

    fn deref(&self) -> &Message {
        &self.built
    }
}

impl AsRef<Message> for Delivered {
    fn as_ref(&self) -> &Message {
        &self.built
    }
}

impl From<Delivered> for Message {
    fn from(d: Delivered) -> Message {
        d.built
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_back_as_a_consumer_does() {
        let m = received(
            Message::new("{}")
                .with_id("m-1")
                .with_header("tenant", "acme")
                .with_content_type("application/json"),
        );
        assert_eq!(m.id(), "m-1");
        assert_eq!(m.envelope.attempt, 1);
        assert_eq!(
            m.envelope.message_type.as_deref(),
            Some(DEFAULT_ROUTING_KEY)
        );
        assert_eq!(m.envelope.correlation_id.as_deref(), Some("m-1"));
        assert_eq!(m.headers.get("tenant"), Some(&HeaderValue::from("acme")));
        let r = m.received.as_ref().unwrap();
        assert!(!r.redelivered);
        assert_eq!(r.routing_key, DEFAULT_ROUTING_KEY);
        assert!(m.properties.is_some());
        let v: serde_json::Value = m.payload().unwrap();
        assert_eq!(v, serde_json::json!({}));
    }

    #[test]
    fn setters_change_what_the_handler_sees() {
        let m = received(Message::new("x").with_type("order.placed"))
            .attempt(3)
            .first_seen_ms(1_000)
            .redelivered(true)
            .exchange("orders")
            .routing_key("eu.order.placed")
            .header("x-acemq-version", "2")
            .header("x-acemq-made-up", "dropped")
            .header("x-death", HeaderValue::Array(vec![]));
        assert_eq!(m.envelope.attempt, 3);
        assert_eq!(m.envelope.first_seen_ms, 1_000);
        assert_eq!(m.envelope.version, 2, "text read forgivingly");
        assert_eq!(m.envelope.message_type.as_deref(), Some("order.placed"));
        assert!(!m.headers.contains_key("x-acemq-made-up"));
        assert!(m.headers.contains_key("x-death"));
        let r = m.received.clone().unwrap();
        assert!(r.redelivered);
        assert_eq!(
            (r.exchange.as_str(), r.routing_key.as_str()),
            ("orders", "eu.order.placed")
        );
        let old = received(Message::new("x")).first_seen_ago(Duration::from_secs(60));
        assert!(now_ms() - old.envelope.first_seen_ms >= 60_000);
    }

    #[test]
    fn without_envelope_gets_a_derived_id_stable_across_redeliveries() {
        let a = received(Message::new("same")).without_envelope();
        let b = received(Message::new("same"))
            .without_envelope()
            .redelivered(true);
        assert_eq!(a.id(), b.id());
        assert_eq!(a.envelope.attempt, 1);
        assert_eq!(
            a.envelope.message_type.as_deref(),
            Some(DEFAULT_ROUTING_KEY)
        );
        let c = received(Message::new("other")).without_envelope();
        assert_ne!(a.id(), c.id());
    }

    #[test]
    #[should_panic(expected = "no consumer could receive this message")]
    fn an_unsendable_message_is_refused() {
        let _ = received(Message::new("x").with_header("x-acemq-attempt", 2));
    }
}
