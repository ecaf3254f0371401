//! What can be declared: queues (and streams with their retention), exchanges, bindings; and
//! what a declaration reports.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::transport::{FieldTable, QueueDeclareOptions};

use crate::envelope::{check_name, HeaderValue};
use crate::error::{Error, Result};

/// The type of a queue. A [`QueueSpec`] that names none gets the family's default: quorum for a
/// durable, non-exclusive, non-auto-delete queue, classic otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueKind {
    /// A classic queue (`x-queue-type: classic`, which RabbitMQ takes as equal to no argument,
    /// so that a vhost whose default type is quorum does not make it one).
    Classic,
    /// A quorum queue (`x-queue-type: quorum`; durable, not exclusive).
    Quorum,
    /// A stream (`x-queue-type: stream`; durable, not exclusive).
    Stream,
}

/// A queue to declare.
///
/// ```
/// use acemq_amqp::QueueSpec;
/// use std::time::Duration;
/// let retry = QueueSpec::new("orders.retry.1s")
///     .message_ttl(Duration::from_secs(1))
///     .dead_letter_exchange("")
///     .dead_letter_routing_key("orders");
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct QueueSpec {
    pub(crate) name: String,
    pub(crate) kind: Option<QueueKind>,
    pub(crate) durable: bool,
    pub(crate) exclusive: bool,
    pub(crate) auto_delete: bool,
    pub(crate) arguments: BTreeMap<String, HeaderValue>,
}

impl QueueSpec {
    /// A durable queue named `name`: a quorum queue unless it is made exclusive, auto-delete or
    /// transient, or [`classic`](Self::classic) is asked for, as every AceMQ library declares
    /// it.
    pub fn new(name: impl Into<String>) -> Self {
        QueueSpec {
            name: name.into(),
            kind: None,
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments: BTreeMap::new(),
        }
    }

    /// A queue the broker names: exclusive, auto-delete, not durable. It lives as long as this
    /// AMQP connection and is **not** re-declared after recovery (it would get another name).
    pub fn server_named() -> Self {
        QueueSpec {
            name: String::new(),
            kind: Some(QueueKind::Classic),
            durable: false,
            exclusive: true,
            auto_delete: true,
            arguments: BTreeMap::new(),
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Makes it a quorum queue. Defaults to quorum for a durable, non-exclusive,
    /// non-auto-delete queue.
    pub fn quorum(mut self) -> Self {
        self.kind = Some(QueueKind::Quorum);
        self
    }

    /// Makes it a classic queue (`x-queue-type: classic` is sent: see [`QueueKind::Classic`]).
    pub fn classic(mut self) -> Self {
        self.kind = Some(QueueKind::Classic);
        self
    }

    /// A stream named `name` (durable, `x-queue-type: stream`) with this retention. **A
    /// default [`StreamRetention`] keeps every message for ever.** See
    /// [`patterns::streams`](crate::patterns::streams).
    pub fn stream(name: impl Into<String>, retention: StreamRetention) -> Self {
        let mut spec = QueueSpec::new(name);
        spec.kind = Some(QueueKind::Stream);
        retention.apply(spec)
    }

    /// Dead-letters what the broker rejects or expires to `{name}.dlq` through `acemq.dlx`
    /// (`x-dead-letter-exchange: acemq.dlx`, `x-dead-letter-routing-key: {name}.dlq`), as the
    /// family's `dead_letter` topology option does.
    ///
    /// **Recommended for durable (quorum) queues on RabbitMQ 4.x**, whose quorum queues drop a
    /// message returned more often than their delivery limit (20 by default) when they have no
    /// dead-letter target: with this form such a message lands in `.dlq`, and
    /// [`Message::failure_reason`](crate::Message::failure_reason) says why. Not the default:
    /// the family's default declaration has no dead-letter target, and a queue two services
    /// declare must be declared alike (docs/reliability.md).
    pub fn with_dead_letter(self) -> Self {
        let dlq = crate::names::dead_letter_queue(&self.name);
        self.dead_letter_exchange(crate::names::DEAD_LETTER_EXCHANGE)
            .dead_letter_routing_key(dlq)
    }

    /// The arguments this spec declares, besides `x-queue-type` (which [`kind`](Self::kind)
    /// decides).
    pub fn arguments(&self) -> &BTreeMap<String, HeaderValue> {
        &self.arguments
    }

    /// Whether it is declared durable, exclusive and auto-delete, in that order.
    pub fn flags(&self) -> (bool, bool, bool) {
        (self.durable, self.exclusive, self.auto_delete)
    }

    /// The type this spec declares: the one asked for, else the family's default.
    pub fn kind(&self) -> QueueKind {
        match &self.kind {
            Some(k) => k.clone(),
            None if self.durable
                && !self.exclusive
                && !self.auto_delete
                && !self.arguments.contains_key("x-queue-type") =>
            {
                QueueKind::Quorum
            }
            None => QueueKind::Classic,
        }
    }

    /// Durable (survives a broker restart). Defaults to true.
    ///
    /// A transient queue that is not [`exclusive`](Self::exclusive) is deprecated by RabbitMQ:
    /// 4.0 logs `transient_nonexcl_queues` for it, and 4.3 refuses it by default;
    /// [`Connection::declare_queue`](crate::Connection::declare_queue) logs a warning (once
    /// per queue name). Make a transient queue exclusive, or durable.
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Exclusive to this connection. Defaults to false.
    pub fn exclusive(mut self, exclusive: bool) -> Self {
        self.exclusive = exclusive;
        self
    }

    /// Deleted when its last consumer goes. Defaults to false.
    pub fn auto_delete(mut self, auto_delete: bool) -> Self {
        self.auto_delete = auto_delete;
        self
    }

    /// `x-message-ttl`: messages older than this are dead-lettered or dropped. Defaults to none.
    pub fn message_ttl(self, ttl: Duration) -> Self {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.argument("x-message-ttl", ms)
    }

    /// `x-dead-letter-exchange` (`""` is the default exchange). Defaults to none.
    pub fn dead_letter_exchange(self, exchange: impl Into<String>) -> Self {
        self.argument("x-dead-letter-exchange", exchange.into())
    }

    /// `x-dead-letter-routing-key`. Defaults to none.
    pub fn dead_letter_routing_key(self, key: impl Into<String>) -> Self {
        self.argument("x-dead-letter-routing-key", key.into())
    }

    /// `x-max-length`. Defaults to none.
    pub fn max_length(self, max: i64) -> Self {
        self.argument("x-max-length", max)
    }

    /// Any other argument.
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.arguments.insert(name.into(), value.into());
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        check_name("queue", &self.name, true)?;
        if self.kind.as_ref().is_some_and(|k| *k != QueueKind::Classic)
            && (!self.durable || self.exclusive)
        {
            return Err(Error::invalid(format!(
                "queue {:?}: quorum queues and streams must be durable and not exclusive",
                self.name
            )));
        }
        for k in self.arguments.keys() {
            check_name("argument", k, false)?;
        }
        Ok(())
    }

    pub(super) fn options(&self) -> QueueDeclareOptions {
        let mut arguments = to_table(&self.arguments);
        match self.kind() {
            // Said, not left to the vhost: on one whose default queue type is quorum (RabbitMQ
            // 3.9+, `--default-queue-type`) a declaration without it makes a quorum queue.
            // RabbitMQ 3.x and 4.x take it as equal to a declaration without the argument, so a
            // family library declaring the same queue without it agrees (tests/default_quorum.rs).
            QueueKind::Classic if !arguments.contains_key("x-queue-type") => {
                arguments.insert(
                    "x-queue-type".into(),
                    crate::transport::AmqpValue::LongString("classic".into()),
                );
            }
            QueueKind::Classic => {}
            QueueKind::Quorum => {
                arguments.insert(
                    "x-queue-type".into(),
                    crate::transport::AmqpValue::LongString("quorum".into()),
                );
            }
            QueueKind::Stream => {
                arguments.insert(
                    "x-queue-type".into(),
                    crate::transport::AmqpValue::LongString("stream".into()),
                );
            }
        }
        QueueDeclareOptions {
            durable: self.durable,
            exclusive: self.exclusive,
            auto_delete: self.auto_delete,
            arguments,
        }
    }
}

/// The type of an exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Routes by exact routing key.
    Direct,
    /// Routes to every bound queue.
    Fanout,
    /// Routes by routing-key pattern.
    Topic,
    /// Routes by headers.
    Headers,
    /// A plugin's type, e.g. `x-consistent-hash`.
    Custom(String),
}

/// An exchange to declare.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeSpec {
    pub(crate) name: String,
    pub(crate) kind: ExchangeKind,
    pub(crate) durable: bool,
    pub(crate) auto_delete: bool,
    pub(crate) internal: bool,
    pub(crate) arguments: BTreeMap<String, HeaderValue>,
}

impl ExchangeSpec {
    /// A durable direct exchange.
    pub fn direct(name: impl Into<String>) -> Self {
        ExchangeSpec::new(name, ExchangeKind::Direct)
    }

    /// A durable exchange.
    pub fn new(name: impl Into<String>, kind: ExchangeKind) -> Self {
        ExchangeSpec {
            name: name.into(),
            kind,
            durable: true,
            auto_delete: false,
            internal: false,
            arguments: BTreeMap::new(),
        }
    }

    /// The exchange's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its type.
    pub fn kind(&self) -> &ExchangeKind {
        &self.kind
    }

    /// Its arguments.
    pub fn arguments(&self) -> &BTreeMap<String, HeaderValue> {
        &self.arguments
    }

    /// Durable. Defaults to true.
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Deleted when its last binding goes. Defaults to false.
    pub fn auto_delete(mut self, auto_delete: bool) -> Self {
        self.auto_delete = auto_delete;
        self
    }

    /// Internal (only exchange-to-exchange bindings may publish to it). Defaults to false.
    pub fn internal(mut self, internal: bool) -> Self {
        self.internal = internal;
        self
    }

    /// An argument, e.g. `alternate-exchange`.
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.arguments.insert(name.into(), value.into());
        self
    }
}

/// A binding of a queue to an exchange, built by name so that the queue, the exchange and the
/// routing key cannot be swapped:
///
/// ```
/// use acemq_amqp::Binding;
/// let binding = Binding::new()
///     .queue("orders")
///     .exchange("events")
///     .routing_key("order.*");
/// assert_eq!(binding.queue, "orders");
/// ```
///
/// The queue and the exchange must be set: [`Connection::bind`](crate::Connection::bind)
/// refuses an empty one with [`Error::InvalidName`](crate::Error::InvalidName).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Binding {
    /// The queue.
    pub queue: String,
    /// The exchange.
    pub exchange: String,
    /// The routing key (or pattern).
    pub routing_key: String,
    /// Arguments (headers exchanges match on these).
    pub arguments: BTreeMap<String, HeaderValue>,
}

impl Binding {
    /// A binding with nothing set yet: set [`queue`](Self::queue) and
    /// [`exchange`](Self::exchange).
    pub fn new() -> Self {
        Self::default()
    }

    /// The queue bound. Must be set (defaults to none, refused when bound).
    #[must_use]
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// The exchange it is bound to. Must be set (defaults to none, refused when bound).
    #[must_use]
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// The routing key (or pattern, on a topic exchange). Defaults to `""`.
    #[must_use]
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = routing_key.into();
        self
    }

    /// An argument (headers exchanges match on these). Defaults to none.
    #[must_use]
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.arguments.insert(name.into(), value.into());
        self
    }
}

/// What a queue declaration or passive check reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueInfo {
    /// The queue's name (the broker's for a server-named queue).
    pub name: String,
    /// Messages ready in it.
    pub message_count: u32,
    /// Consumers on it.
    pub consumer_count: u32,
}

/// How much of a stream to keep. **All `None` (the default) keeps everything for ever.**
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamRetention {
    /// Messages older than this are discarded (`x-max-age`, written in whole seconds rounded
    /// up, with the largest unit that divides it: `7D`, `2h`, `10m`, `90s`). Defaults to none.
    pub max_age: Option<Duration>,
    /// The oldest messages are discarded once the stream holds more bytes than this
    /// (`x-max-length-bytes`). Defaults to none.
    pub max_bytes: Option<u64>,
    /// How large each segment file grows (`x-stream-max-segment-size-bytes`); retention
    /// discards whole segments, so a large segment makes retention coarse. Defaults to the
    /// broker's (500 MB).
    pub segment_bytes: Option<u64>,
}

impl StreamRetention {
    /// Keeps everything: the default, spelled out.
    pub fn unbounded() -> Self {
        StreamRetention::default()
    }

    /// Sets [`max_age`](Self::max_age).
    pub fn max_age(mut self, age: Duration) -> Self {
        self.max_age = Some(age);
        self
    }

    /// Sets [`max_bytes`](Self::max_bytes).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = Some(bytes);
        self
    }

    /// Sets [`segment_bytes`](Self::segment_bytes).
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = Some(bytes);
        self
    }

    /// The queue arguments this retention declares.
    fn apply(&self, mut spec: QueueSpec) -> QueueSpec {
        if let Some(age) = self.max_age {
            spec = spec.argument("x-max-age", max_age_arg(age));
        }
        if let Some(bytes) = self.max_bytes {
            spec = spec.argument(
                "x-max-length-bytes",
                i64::try_from(bytes).unwrap_or(i64::MAX),
            );
        }
        if let Some(bytes) = self.segment_bytes {
            spec = spec.argument(
                "x-stream-max-segment-size-bytes",
                i64::try_from(bytes).unwrap_or(i64::MAX),
            );
        }
        spec
    }
}

/// RabbitMQ's `x-max-age` text: whole seconds (rounded up, at least 1) in the largest unit
/// that divides them.
fn max_age_arg(age: Duration) -> String {
    let mut secs = age.as_secs();
    if age.subsec_nanos() > 0 || secs == 0 {
        secs += 1;
    }
    match secs {
        s if s.is_multiple_of(86_400) => format!("{}D", s / 86_400),
        s if s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        s if s.is_multiple_of(60) => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

pub(crate) fn to_table(args: &BTreeMap<String, HeaderValue>) -> FieldTable {
    args.iter().map(|(k, v)| (k.clone(), v.to_amqp())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_is_written_in_the_largest_whole_unit() {
        assert_eq!(max_age_arg(Duration::from_secs(7 * 86_400)), "7D");
        assert_eq!(max_age_arg(Duration::from_secs(7_200)), "2h");
        assert_eq!(max_age_arg(Duration::from_secs(600)), "10m");
        assert_eq!(max_age_arg(Duration::from_secs(90)), "90s");
        assert_eq!(max_age_arg(Duration::from_millis(1_500)), "2s");
        assert_eq!(max_age_arg(Duration::ZERO), "1s");
    }
}
