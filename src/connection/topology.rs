//! Exchanges, queues and bindings: declared at once, remembered, and re-declared after every
//! recovery in the order exchanges, queues, bindings.
//!
//! Each operation runs on a short-lived channel of its own, so a refused declaration (the broker
//! closes the channel with 406 or 404) never disturbs publishers or consumers, and the
//! connection keeps working.

use std::collections::BTreeMap;
use std::time::Duration;

use amiquip::{
    Channel, ExchangeDeclareOptions, ExchangeType, FieldTable, QueueDeclareOptions,
    QueueDeleteOptions,
};

use super::{Connection, Link, Shared};
use crate::envelope::{check_name, HeaderValue};
use crate::error::{Error, Result};
use crate::observe::ConnectionEvent;

/// The type of a queue. A [`QueueSpec`] that names none gets the family's default: quorum for a
/// durable, non-exclusive, non-auto-delete queue, classic otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueueKind {
    /// A classic queue (no `x-queue-type` argument is sent).
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

    /// Makes it a classic queue (no `x-queue-type` argument is sent).
    pub fn classic(mut self) -> Self {
        self.kind = Some(QueueKind::Classic);
        self
    }

    /// A stream named `name` (durable, `x-queue-type: stream`) with this retention. **A
    /// default [`StreamRetention`](crate::patterns::StreamRetention) keeps every message for
    /// ever.** See [`patterns::streams`](crate::patterns::streams).
    pub fn stream(
        name: impl Into<String>,
        retention: crate::patterns::streams::StreamRetention,
    ) -> Self {
        let mut spec = QueueSpec::new(name);
        spec.kind = Some(QueueKind::Stream);
        retention.apply(spec)
    }

    /// Dead-letters what the broker rejects or expires to `{name}.dlq` through `acemq.dlx`
    /// (`x-dead-letter-exchange: acemq.dlx`, `x-dead-letter-routing-key: {name}.dlq`), as the
    /// family's `dead_letter` topology option does.
    pub fn with_dead_letter(self) -> Self {
        let dlq = crate::consume::dead_letter_queue(&self.name);
        self.dead_letter_exchange(crate::consume::DEAD_LETTER_EXCHANGE)
            .dead_letter_routing_key(dlq)
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

    fn validate(&self) -> Result<()> {
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

    fn options(&self) -> QueueDeclareOptions {
        let mut arguments = to_table(&self.arguments);
        match self.kind() {
            QueueKind::Classic => {}
            QueueKind::Quorum => {
                arguments.insert(
                    "x-queue-type".into(),
                    amiquip::AmqpValue::LongString("quorum".into()),
                );
            }
            QueueKind::Stream => {
                arguments.insert(
                    "x-queue-type".into(),
                    amiquip::AmqpValue::LongString("stream".into()),
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

/// A binding of a queue to an exchange.
#[derive(Clone, Debug, PartialEq)]
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
    /// Binds `queue` to `exchange` with `routing_key`.
    pub fn new(
        queue: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
    ) -> Self {
        Binding {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            arguments: BTreeMap::new(),
        }
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

/// What has been declared on a connection, in declaration order.
#[derive(Default)]
pub(crate) struct Topology {
    exchanges: Vec<ExchangeSpec>,
    queues: Vec<QueueSpec>,
    bindings: Vec<Binding>,
}

pub(crate) fn to_table(args: &BTreeMap<String, HeaderValue>) -> FieldTable {
    args.iter().map(|(k, v)| (k.clone(), v.to_amqp())).collect()
}

fn map_err(kind: &'static str, name: &str, doing: &str, e: amiquip::Error) -> Error {
    Error::from_amqp_on(kind, name, doing, e)
}

fn declare_exchange_on(channel: &Channel, spec: &ExchangeSpec) -> Result<()> {
    let kind = match &spec.kind {
        ExchangeKind::Direct => ExchangeType::Direct,
        ExchangeKind::Fanout => ExchangeType::Fanout,
        ExchangeKind::Topic => ExchangeType::Topic,
        ExchangeKind::Headers => ExchangeType::Headers,
        ExchangeKind::Custom(s) => ExchangeType::Custom(s.clone()),
    };
    let options = ExchangeDeclareOptions {
        durable: spec.durable,
        auto_delete: spec.auto_delete,
        internal: spec.internal,
        arguments: to_table(&spec.arguments),
    };
    channel
        .exchange_declare(kind, spec.name.clone(), options)
        .map(|_| ())
        .map_err(|e| map_err("exchange", &spec.name, "declaring", e))
}

pub(crate) fn declare_queue_on(channel: &Channel, spec: &QueueSpec) -> Result<QueueInfo> {
    let q = channel
        .queue_declare(spec.name.clone(), spec.options())
        .map_err(|e| map_err("queue", &spec.name, "declaring", e))?;
    Ok(QueueInfo {
        name: q.name().to_string(),
        message_count: q.declared_message_count().unwrap_or(0),
        consumer_count: q.declared_consumer_count().unwrap_or(0),
    })
}

fn bind_on(channel: &Channel, b: &Binding) -> Result<()> {
    channel
        .queue_bind(
            b.queue.clone(),
            b.exchange.clone(),
            b.routing_key.clone(),
            to_table(&b.arguments),
        )
        .map_err(|e| map_err("queue", &b.queue, "binding", e))
}

fn upsert<T>(list: &mut Vec<T>, item: T, same: impl Fn(&T) -> bool) {
    match list.iter_mut().find(|x| same(x)) {
        Some(slot) => *slot = item,
        None => list.push(item),
    }
}

/// Re-declares everything remembered on a fresh link (the supervisor calls this after a
/// reconnect). A failure is reported to the observer and the rest goes on.
pub(crate) fn redeclare(shared: &Shared, link: &Link) {
    let (exchanges, queues, bindings) = {
        let t = shared.topology.lock();
        (t.exchanges.clone(), t.queues.clone(), t.bindings.clone())
    };
    let mut channel: Option<Channel> = None;
    let mut run = |what: String, f: &dyn Fn(&Channel) -> Result<()>| {
        if channel.is_none() {
            match link.open_channel() {
                Ok(c) => channel = Some(c),
                Err(e) => {
                    let reason = e.to_string();
                    shared
                        .options
                        .observer
                        .connection(&ConnectionEvent::RedeclareFailed {
                            what: &what,
                            reason: &reason,
                        });
                    return;
                }
            }
        }
        if let Some(c) = &channel {
            if let Err(e) = f(c) {
                let reason = e.to_string();
                shared
                    .options
                    .observer
                    .connection(&ConnectionEvent::RedeclareFailed {
                        what: &what,
                        reason: &reason,
                    });
                // A refused declaration closes the channel: use a new one for the rest.
                channel = None;
            }
        }
    };
    for e in &exchanges {
        run(format!("exchange {:?}", e.name), &|c| {
            declare_exchange_on(c, e)
        });
    }
    for q in &queues {
        run(format!("queue {:?}", q.name), &|c| {
            declare_queue_on(c, q).map(|_| ())
        });
    }
    for b in &bindings {
        run(
            format!(
                "binding {:?} -> {:?} ({:?})",
                b.exchange, b.queue, b.routing_key
            ),
            &|c| bind_on(c, b),
        );
    }
    if let Some(c) = channel {
        let _ = c.close();
    }
}

impl Connection {
    /// Runs `f` on a short-lived channel of its own.
    fn with_channel<T>(&self, f: impl FnOnce(&Channel) -> Result<T>) -> Result<T> {
        let (channel, _link) = self.open_channel()?;
        let result = f(&channel);
        if result.is_ok() {
            // A channel the broker closed reports that again here: ignore it.
            let _ = channel.close();
        }
        result
    }

    /// Declares an exchange and remembers it for re-declaration after recovery.
    ///
    /// # Errors
    ///
    /// [`Error::TopologyConflict`] when it exists with other settings (the broker's reason
    /// names the argument; the connection keeps working); [`Error::ConnectionLost`] when the
    /// connection does not recover within the operation timeout.
    pub fn declare_exchange(&self, spec: &ExchangeSpec) -> Result<()> {
        check_name("exchange", &spec.name, false)?;
        self.with_channel(|c| declare_exchange_on(c, spec))?;
        let mut t = self.shared.topology.lock();
        upsert(&mut t.exchanges, spec.clone(), |x| x.name == spec.name);
        Ok(())
    }

    /// Declares a queue and remembers it for re-declaration after recovery (not a server-named
    /// one).
    ///
    /// # Errors
    ///
    /// [`Error::TopologyConflict`] naming the queue and, in the broker's reason, the argument,
    /// when it exists with other settings; the connection keeps working.
    pub fn declare_queue(&self, spec: &QueueSpec) -> Result<QueueInfo> {
        spec.validate()?;
        let info = self.with_channel(|c| declare_queue_on(c, spec))?;
        if !spec.name.is_empty() {
            let mut t = self.shared.topology.lock();
            upsert(&mut t.queues, spec.clone(), |x| x.name == spec.name);
        }
        Ok(info)
    }

    /// Binds a queue to an exchange and remembers the binding.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the queue or exchange does not exist.
    pub fn bind(&self, binding: &Binding) -> Result<()> {
        check_name("queue", &binding.queue, false)?;
        check_name("exchange", &binding.exchange, false)?;
        check_name("routing key", &binding.routing_key, true)?;
        self.with_channel(|c| bind_on(c, binding))?;
        let mut t = self.shared.topology.lock();
        upsert(&mut t.bindings, binding.clone(), |x| x == binding);
        Ok(())
    }

    /// Shorthand for [`bind`](Self::bind) without arguments.
    ///
    /// # Errors
    ///
    /// As [`bind`](Self::bind).
    pub fn bind_queue(&self, queue: &str, exchange: &str, routing_key: &str) -> Result<()> {
        self.bind(&Binding::new(queue, exchange, routing_key))
    }

    /// Removes a binding (and forgets it).
    ///
    /// # Errors
    ///
    /// An AMQP error from the broker.
    pub fn unbind(&self, binding: &Binding) -> Result<()> {
        self.with_channel(|c| {
            c.queue_unbind(
                binding.queue.clone(),
                binding.exchange.clone(),
                binding.routing_key.clone(),
                to_table(&binding.arguments),
            )
            .map_err(|e| map_err("queue", &binding.queue, "unbinding", e))
        })?;
        self.shared
            .topology
            .lock()
            .bindings
            .retain(|x| x != binding);
        Ok(())
    }

    /// Passive check of a queue: its counts, or [`Error::NotFound`].
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when there is no such queue.
    pub fn queue_info(&self, name: &str) -> Result<QueueInfo> {
        check_name("queue", name, false)?;
        self.with_channel(|c| {
            let q = c
                .queue_declare_passive(name)
                .map_err(|e| map_err("queue", name, "checking", e))?;
            Ok(QueueInfo {
                name: q.name().to_string(),
                message_count: q.declared_message_count().unwrap_or(0),
                consumer_count: q.declared_consumer_count().unwrap_or(0),
            })
        })
    }

    /// Passive check of an exchange.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when there is no such exchange.
    pub fn check_exchange(&self, name: &str) -> Result<()> {
        check_name("exchange", name, false)?;
        self.with_channel(|c| {
            c.exchange_declare_passive(name)
                .map(|_| ())
                .map_err(|e| map_err("exchange", name, "checking", e))
        })
    }

    /// Deletes a queue (and forgets it and its bindings); returns how many messages it held.
    ///
    /// # Errors
    ///
    /// An AMQP error from the broker.
    pub fn delete_queue(&self, name: &str) -> Result<u32> {
        check_name("queue", name, false)?;
        let n = self.with_channel(|c| {
            c.queue_delete(name, QueueDeleteOptions::default())
                .map_err(|e| map_err("queue", name, "deleting", e))
        })?;
        let mut t = self.shared.topology.lock();
        t.queues.retain(|q| q.name != name);
        t.bindings.retain(|b| b.queue != name);
        Ok(n)
    }

    /// Deletes an exchange (and forgets it and its bindings).
    ///
    /// # Errors
    ///
    /// An AMQP error from the broker.
    pub fn delete_exchange(&self, name: &str) -> Result<()> {
        check_name("exchange", name, false)?;
        self.with_channel(|c| {
            c.exchange_delete(name, false)
                .map_err(|e| map_err("exchange", name, "deleting", e))
        })?;
        let mut t = self.shared.topology.lock();
        t.exchanges.retain(|x| x.name != name);
        t.bindings.retain(|b| b.exchange != name);
        Ok(())
    }

    /// Purges a queue; returns how many messages were removed.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when there is no such queue.
    pub fn purge_queue(&self, name: &str) -> Result<u32> {
        check_name("queue", name, false)?;
        self.with_channel(|c| {
            c.queue_purge(name)
                .map_err(|e| map_err("queue", name, "purging", e))
        })
    }
}
