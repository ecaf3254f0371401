//! [`ConsumerOptions`]: what a consumer is configured with, and its validation.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::hook::DeliveryHook;
use super::ladder::policy::RetryPolicy;
use super::outcome::OrderBy;
use crate::codec::Codec;
use crate::envelope::{check_name, HeaderValue};
use crate::error::{Error, Result};

/// Options for a consumer.
#[derive(Clone, Debug)]
pub struct ConsumerOptions {
    pub(super) prefetch: u16,
    pub(super) concurrency: usize,
    pub(super) codec: Option<Arc<dyn Codec>>,
    pub(super) retry: RetryPolicy,
    pub(super) declare: bool,
    pub(super) exclusive: bool,
    pub(super) arguments: BTreeMap<String, HeaderValue>,
    pub(super) shutdown_timeout: Duration,
    pub(super) at_most_once: bool,
    pub(super) inline: bool,
    /// Set by a pattern that takes part in each delivery's life (`hook.rs`): a consumer
    /// group's member, a stream reader, a responder.
    pub(super) hook: Option<Arc<dyn DeliveryHook>>,
    /// Per-key ordering ([`ordering`](Self::ordering)).
    pub(super) order: Option<Arc<OrderBy>>,
    /// At most once: how long a worker waits for the owner's word that the ack went out before
    /// it gives the delivery up (`None`: the shutdown timeout, at least 30 s).
    pub(super) ack_first_wait: Option<Duration>,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            prefetch: 32,
            concurrency: 1,
            codec: None,
            retry: RetryPolicy::default(),
            declare: true,
            exclusive: false,
            arguments: BTreeMap::new(),
            shutdown_timeout: Duration::from_secs(30),
            at_most_once: false,
            inline: false,
            hook: None,
            order: None,
            ack_first_wait: None,
        }
    }
}

impl ConsumerOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most unsettled deliveries at once (AMQP `basic.qos`); memory stays bounded by it
    /// whatever the backlog. 1 to 65535. Defaults to 32.
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Worker threads running the handler. Defaults to 1 (messages are handled in order).
    pub fn concurrency(mut self, workers: usize) -> Self {
        self.concurrency = workers;
        self
    }

    /// The codec [`Message::payload`](crate::Message::payload) decodes with. Defaults to the
    /// connection's.
    pub fn codec(mut self, codec: impl Codec + 'static) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }

    /// The retry policy. Defaults to [`RetryPolicy::none`], as in the family: the first failure
    /// goes to `{queue}.dlq`.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Declare where the queue's failures go when the consumer is made, as the family's consumers
    /// do: `acemq.dlx` with `{queue}.dlq` and `{queue}.parked` bound to it, and, when the policy
    /// has broker rungs, `acemq.retry`, the rungs and the queue's binding to `acemq.retry`. The
    /// queue itself is never declared here. Defaults to true.
    pub fn declare(mut self, declare: bool) -> Self {
        self.declare = declare;
        self
    }

    /// Ask to be the queue's only consumer. Defaults to false. RabbitMQ 3.10 honours it on
    /// classic queues only: on a quorum queue it is accepted and ignored.
    pub fn exclusive(mut self, exclusive: bool) -> Self {
        self.exclusive = exclusive;
        self
    }

    /// A consumer argument, e.g. `x-stream-offset` or `x-priority`.
    pub fn argument(mut self, name: impl Into<String>, value: impl Into<HeaderValue>) -> Self {
        self.arguments.insert(name.into(), value.into());
        self
    }

    /// How long closing waits for running handlers. Defaults to 30 s.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// At-most-once delivery, chosen on purpose: each delivery is acknowledged when a worker
    /// takes it, **before** the handler runs. A handler that fails (an `Err`, a panic, or any
    /// outcome but accept) then loses the message: no retry copy, no dead letter; it is counted
    /// ([`RunningConsumer::lost`](crate::RunningConsumer::lost)) and reported to the observer as
    /// outcome `lost` (the default observer logs it at debug). A consumer killed while the handler runs does not get the
    /// message again, and neither does one whose handler is still running when closing gives up
    /// waiting (counted `abandoned`). Deliveries not yet taken by a worker are unacknowledged
    /// and go back to the queue on close, as usual. Each delivery costs one round trip between
    /// the worker and the owner thread before its handler starts (the worker waits for the
    /// broker to have taken the ack). A worker that hears nothing for 30 s (or the shutdown
    /// timeout, if longer) gives the delivery up without running the handler; if the broker
    /// then confirms the ack after all, the message is counted and reported `lost` as well.
    /// Defaults to off: at least once.
    ///
    /// | when the ack goes | guarantee | a failure or crash in the handler |
    /// |---|---|---|
    /// | before the work (this) | at most once | loses the message |
    /// | after the work (default) | at least once | redelivers it (a duplicate is possible) |
    ///
    /// Exactly once is not on offer end to end: no broker acknowledgement can be atomic with
    /// an effect elsewhere. At least once with an idempotent handler
    /// ([`idempotent`](fn@crate::patterns::idempotent::idempotent)) makes duplicates harmless, which is what
    /// most services want; at most once is for data cheaper to lose than to handle twice (a
    /// metrics sample).
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// Runs the handler on the consumer's own thread (`acemq-consumer`, the one that holds the
    /// channel and acknowledges; the calling thread with [`Consumer::run`](crate::Consumer::run))
    /// instead of on a worker thread: each delivery is read, handled,
    /// published from (retry copies, a responder's reply) and acknowledged on one thread, with
    /// no hand-off between threads. For quick handlers where latency counts — a
    /// [`Responder`](crate::patterns::request_reply::Responder) answers ~10 % more requests a second with it
    /// on this crate's benchmark machine (README). Defaults to off.
    ///
    /// The price: while a handler runs, nothing else on this consumer moves (a retry held in
    /// the consumer that comes due waits, a stop is seen when the handler returns), and
    /// **closing waits for a running handler to return, however long** — the
    /// [`shutdown_timeout`](Self::shutdown_timeout) does not cut it short and nothing is counted
    /// `abandoned`. A handler that may block for long belongs on a worker (the default).
    ///
    /// Requires concurrency 1 and at-least-once delivery ([`Error::InvalidArgument`] when the
    /// consumer is made otherwise); a handler with ordering ([`ordered`](crate::patterns::ordering::ordered))
    /// or batches (the batched [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx)) is refused when
    /// the consumer starts.
    pub fn inline(mut self, inline: bool) -> Self {
        self.inline = inline;
        self
    }

    /// Handles messages with the same key one at a time, in delivery order, and different keys
    /// in parallel (up to the concurrency): what
    /// [`patterns::ordering`](crate::patterns::ordering) promises, kept by the consumer itself,
    /// so that no wrapper around the handler can lose it. Defaults to none.
    ///
    /// ```no_run
    /// use acemq_amqp::patterns::ordering::by_header;
    /// use acemq_amqp::{Connection, ConsumerOptions, Message, OrderBy, Outcome};
    /// # fn main() -> acemq_amqp::Result<()> {
    /// let connection = Connection::open("amqp://127.0.0.1")?;
    /// let options = ConsumerOptions::new()
    ///     .concurrency(8)
    ///     .prefetch(256)
    ///     .ordering(OrderBy::new(by_header("order-id")).hold_on_retry(true));
    /// let running = connection
    ///     .consumer("orders", options)?
    ///     .start(|m: &Message| Ok(Outcome::Accept))?;
    /// # running.close()?; Ok(()) }
    /// ```
    ///
    /// It takes the place of a handler's own [`Handler::ordering`](crate::Handler::ordering)
    /// (the [`ordered`](crate::patterns::ordering::ordered) wrapper's), which is still honoured
    /// when this is not set. Refused with [`inline`](Self::inline) when the consumer starts.
    pub fn ordering(mut self, order: OrderBy) -> Self {
        self.order = Some(Arc::new(order));
        self
    }

    /// Not for applications (feature `internals`): how long an at-most-once worker waits for the
    /// word that its delivery's ack went out (by default the shutdown timeout, at least 30 s),
    /// so that this crate's tests can make that wait run out without taking 30 s.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn ack_first_wait_for_tests(mut self, wait: Duration) -> Self {
        self.ack_first_wait = Some(wait);
        self
    }

    /// Has `hook` take part in each delivery's life (see `hook.rs`): set by the patterns that
    /// need it, one per consumer (a later one replaces it).
    pub(crate) fn hook(mut self, hook: Arc<dyn DeliveryHook>) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Whether the failure topology is declared when the consumer is made.
    pub(crate) fn declares(&self) -> bool {
        self.declare
    }

    pub(crate) fn validate(&self, queue: &str) -> Result<()> {
        check_name("queue", queue, false)?;
        if self.prefetch == 0 {
            return Err(Error::invalid(
                "prefetch must be at least 1: an unlimited prefetch lets amiquip buffer without bound",
            ));
        }
        if self.concurrency == 0 {
            return Err(Error::invalid("concurrency must be at least 1"));
        }
        if self.inline && self.concurrency != 1 {
            return Err(Error::invalid(format!(
                "inline handling runs one handler at a time on the consumer's thread: \
                 concurrency must be 1, not {}",
                self.concurrency
            )));
        }
        if self.inline && self.at_most_once {
            return Err(Error::invalid(
                "inline handling cannot be at most once: the ack that goes ahead of the handler \
                 is sent by the thread that would be running it",
            ));
        }
        self.retry.validate()
    }
}
