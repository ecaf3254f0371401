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

use super::shared::Shared;
use super::{Connection, Link};
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
    /// default [`StreamRetention`](crate::patterns::streams::StreamRetention) keeps every message for
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

/// One way the broker's queue or exchange differs from a spec (see
/// [`Connection::compare_queue`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopologyDifference {
    /// `"queue"` or `"exchange"`.
    pub kind: &'static str,
    /// The queue or exchange.
    pub name: String,
    /// The argument or property that differs (`x-message-ttl`, `durable`, `type`, …), or
    /// `"existence"` when the broker has no such queue or exchange.
    pub what: String,
    /// The spec's value (`none` when the spec does not set it), as the broker prints it.
    pub expected: String,
    /// The broker's value (`none` when it has none, `missing` when the queue or exchange is
    /// not there), as the broker prints it.
    pub actual: String,
}

impl std::fmt::Display for TopologyDifference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.what == "existence" {
            write!(f, "{} {:?} is missing", self.kind, self.name)
        } else {
            write!(
                f,
                "{} {:?}: {} is {} on the broker, expected {}",
                self.kind, self.name, self.what, self.actual, self.expected
            )
        }
    }
}

/// One inequivalence read from a 406 text: `(what, expected, actual, broker's value to adopt)`.
/// RabbitMQ writes `inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the
/// value '2000' of type 'signedint' but current is the value '1000' of type 'long'` (either
/// side may be `none`), and for the flags `received 'false' but current is 'true'`.
fn parse_inequivalence(reason: &str) -> Option<(String, String, String, Adopt)> {
    let rest = &reason[reason.find("inequivalent arg '")? + "inequivalent arg '".len()..];
    let what = &rest[..rest.find('\'')?];
    let rest = &rest[rest.find(": received ")? + ": received ".len()..];
    let split = rest.find(" but current is ")?;
    let (received, current) = (&rest[..split], &rest[split + " but current is ".len()..]);
    let value = |text: &str| -> Option<(String, Option<(String, String)>)> {
        let text = text.trim();
        if text == "none" {
            return Some(("none".into(), None));
        }
        if let Some(v) = text.strip_prefix("the value '") {
            let end = v.find("' of type '")?;
            let value = &v[..end];
            let ty = v[end + "' of type '".len()..].trim_end_matches('\'');
            return Some((value.to_string(), Some((value.to_string(), ty.to_string()))));
        }
        let v = text.trim_matches('\'');
        Some((v.to_string(), Some((v.to_string(), "bare".into()))))
    };
    let (expected, _) = value(received)?;
    let (actual, typed) = value(current)?;
    let adopt = match typed {
        None => Adopt::Remove,
        Some((v, ty)) => Adopt::Set(v, ty),
    };
    Some((what.to_string(), expected, actual, adopt))
}

/// What to declare next time to get past one inequivalence.
enum Adopt {
    Remove,
    Set(String, String),
}

fn adopt_value(value: &str, ty: &str) -> HeaderValue {
    match ty {
        "signedint" | "long" | "short" | "byte" | "unsignedbyte" | "unsignedshort"
        | "unsignedint" => value
            .parse::<i64>()
            .map(HeaderValue::Int)
            .unwrap_or_else(|_| HeaderValue::Text(value.to_string())),
        "bool" => HeaderValue::Bool(value == "true"),
        "double" | "float" => value
            .parse::<f64>()
            .map(HeaderValue::Float)
            .unwrap_or_else(|_| HeaderValue::Text(value.to_string())),
        // The broker prints numeric arguments it checks by value (`x-message-ttl`,
        // `x-max-length`, …) bare: `received '40000' but current is '30000'`.
        "bare" => match value.parse::<i64>() {
            Ok(i) => HeaderValue::Int(i),
            Err(_) => HeaderValue::Text(value.to_string()),
        },
        _ => HeaderValue::Text(value.to_string()),
    }
}

/// At most this many inequivalences are read from one queue or exchange.
const MAX_DIFFERENCES: usize = 32;

impl Connection {
    /// Compares the broker's queue with `spec`, argument by argument, **without changing it**:
    /// every difference in `x-queue-type`, each argument, `durable`, `exclusive` and
    /// `auto_delete`, or one `existence` difference when the queue is not there. An empty list
    /// means the broker's queue is what `spec` declares. Nothing is remembered for recovery.
    ///
    /// AMQP cannot read a queue's arguments, so this asks the broker to declare the queue as
    /// `spec` says (after a passive check that it exists, so that a missing queue is reported
    /// and not created): an equivalent declaration changes nothing, an inequivalent one is
    /// refused (406) with the broker's account of the first difference, which is recorded, then
    /// adopted into the next declaration to find the next one, on a fresh channel each time.
    /// (A queue deleted by someone else between the passive check and the declaration would be
    /// created; nothing else can be.)
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name; [`Error::ConnectionLost`] / [`Error::Amqp`] when
    /// the broker cannot be asked; [`Error::TopologyConflict`] when the broker's refusal cannot
    /// be read.
    pub fn compare_queue(&self, spec: &QueueSpec) -> Result<Vec<TopologyDifference>> {
        spec.validate()?;
        check_name("queue", &spec.name, false)?;
        let present = self.queue_info(&spec.name).map(|_| ());
        let mut options = spec.options();
        self.walk_differences("queue", &spec.name, present, |adopted| {
            if let Some((what, actual, adopt)) = adopted {
                match (what, adopt) {
                    ("durable", _) => options.durable = actual == "true",
                    ("exclusive", _) => options.exclusive = actual == "true",
                    ("auto_delete", _) => options.auto_delete = actual == "true",
                    (name, Adopt::Remove) => {
                        options.arguments.remove(name);
                    }
                    (name, Adopt::Set(value, ty)) => {
                        options
                            .arguments
                            .insert(name.to_string(), adopt_value(value, ty).to_amqp());
                    }
                }
            }
            let attempt = options.clone();
            self.with_channel(|c| {
                c.queue_declare(spec.name.clone(), attempt)
                    .map(|_| ())
                    .map_err(|e| map_err("queue", &spec.name, "comparing", e))
            })
        })
    }

    /// Compares the broker's exchange with `spec` (type, `durable`, `auto_delete`, `internal`,
    /// arguments) without changing it, as [`compare_queue`](Self::compare_queue) does for a
    /// queue.
    ///
    /// # Errors
    ///
    /// As [`compare_queue`](Self::compare_queue).
    pub fn compare_exchange(&self, spec: &ExchangeSpec) -> Result<Vec<TopologyDifference>> {
        check_name("exchange", &spec.name, false)?;
        let present = self.check_exchange(&spec.name);
        let mut current = spec.clone();
        self.walk_differences("exchange", &spec.name, present, |adopted| {
            if let Some((what, actual, adopt)) = adopted {
                match (what, adopt) {
                    ("type", _) => {
                        current.kind = match actual {
                            "direct" => ExchangeKind::Direct,
                            "fanout" => ExchangeKind::Fanout,
                            "topic" => ExchangeKind::Topic,
                            "headers" => ExchangeKind::Headers,
                            other => ExchangeKind::Custom(other.to_string()),
                        }
                    }
                    ("durable", _) => current.durable = actual == "true",
                    ("auto_delete", _) => current.auto_delete = actual == "true",
                    ("internal", _) => current.internal = actual == "true",
                    (name, Adopt::Remove) => {
                        current.arguments.remove(name);
                    }
                    (name, Adopt::Set(value, ty)) => {
                        current
                            .arguments
                            .insert(name.to_string(), adopt_value(value, ty));
                    }
                }
            }
            self.with_channel(|c| declare_exchange_on(c, &current))
        })
    }

    /// The walk both comparisons share: `present` is the passive check (a missing object is one
    /// difference, nothing declared); then `declare` is asked — first as the spec says, then
    /// with each difference the broker names adopted (`Some((what, actual, adopt))`) — until the
    /// broker accepts. A refusal that cannot be read, or one that adopting did not cure, is
    /// returned as the broker's `TopologyConflict`.
    fn walk_differences(
        &self,
        kind: &'static str,
        name: &str,
        present: Result<()>,
        mut declare: impl FnMut(Option<(&str, &str, &Adopt)>) -> Result<()>,
    ) -> Result<Vec<TopologyDifference>> {
        let difference = |what: &str, expected: &str, actual: &str| TopologyDifference {
            kind,
            name: name.to_string(),
            what: what.into(),
            expected: expected.into(),
            actual: actual.into(),
        };
        match present {
            Ok(()) => {}
            Err(Error::NotFound { .. }) => {
                return Ok(vec![difference("existence", "present", "missing")])
            }
            Err(e) => return Err(e),
        }
        let conflict = |reason: String| Error::TopologyConflict {
            kind,
            name: name.to_string(),
            reason,
        };
        let mut found: Vec<TopologyDifference> = Vec::new();
        let mut adopted: Option<(String, String, Adopt)> = None;
        while found.len() < MAX_DIFFERENCES {
            let asked = declare(
                adopted
                    .as_ref()
                    .map(|(w, a, ad)| (w.as_str(), a.as_str(), ad)),
            );
            let reason = match asked {
                Ok(()) => return Ok(found),
                Err(Error::TopologyConflict { reason, .. }) => reason,
                Err(e) => return Err(e),
            };
            let Some((what, expected, actual, adopt)) = parse_inequivalence(&reason) else {
                return Err(conflict(reason));
            };
            if found.iter().any(|d| d.what == what && d.actual == actual) {
                // Adopting the broker's value did not satisfy it: report what it said.
                return Err(conflict(reason));
            }
            found.push(difference(&what, &expected, &actual));
            adopted = Some((what, actual, adopt));
        }
        Ok(found)
    }
}

#[cfg(test)]
mod compare_tests {
    use super::*;

    #[test]
    fn reads_the_brokers_inequivalence_texts() {
        let (what, expected, actual, adopt) = parse_inequivalence(
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': \
             received the value '2000' of type 'long' but current is the value '1000' of type \
             'signedint'",
        )
        .unwrap();
        assert_eq!(
            (what.as_str(), expected.as_str()),
            ("x-message-ttl", "2000")
        );
        assert_eq!(actual, "1000");
        assert!(matches!(adopt, Adopt::Set(v, t) if v == "1000" && t == "signedint"));
        // As RabbitMQ 3.10 words it for x-message-ttl.
        let (what, expected, actual, adopt) = parse_inequivalence(
            "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': \
             received '40000' but current is '30000'",
        )
        .unwrap();
        assert_eq!(
            (what.as_str(), expected.as_str(), actual.as_str()),
            ("x-message-ttl", "40000", "30000")
        );
        let Adopt::Set(v, t) = adopt else { panic!() };
        assert_eq!(adopt_value(&v, &t), HeaderValue::Int(30000));
        let (what, _, actual, adopt) = parse_inequivalence(
            "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': \
             received the value '5' of type 'long' but current is none",
        )
        .unwrap();
        assert_eq!((what.as_str(), actual.as_str()), ("x-max-length", "none"));
        assert!(matches!(adopt, Adopt::Remove));
        let (what, expected, actual, _) = parse_inequivalence(
            "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': \
             received 'false' but current is 'true'",
        )
        .unwrap();
        assert_eq!(
            (what.as_str(), expected.as_str(), actual.as_str()),
            ("durable", "false", "true")
        );
        assert!(parse_inequivalence("something else").is_none());
    }
}
