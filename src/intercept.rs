//! Interceptors: the seam around every publish and every handler on a connection.
//!
//! (In the base layer: the traits name only a [`Message`], a [`Ticket`] and a
//! [`HandlerResult`], so [`ConnectionOptions`](crate::ConnectionOptions) holds them typed; `publish/` and `consume/` run them.)
//!
//! The family's shape (Python `interceptors.py`: one function handed the message and the rest
//! of the work), in Rust's idiom: a trait whose method receives a `next` to call. Register them
//! on [`ConnectionOptions`](crate::ConnectionOptions) with
//! [`intercept_publish`](crate::ConnectionOptions::intercept_publish) and
//! [`intercept_consume`](crate::ConnectionOptions::intercept_consume); every
//! [`Publisher`](crate::Publisher) and consumer of that connection runs them.
//!
//! # Order
//!
//! **The first registered is the outermost**: it sees the message first on the way in and the
//! result last on the way out (as in Python, Java and Go). An interceptor that does not call
//! `next` **short-circuits**: the rest of the chain and the publish (or the handler) never run,
//! and what it returns is the answer.
//!
//! # Publishing
//!
//! [`PublishInterceptor::publish`] runs inside [`Publisher::publish_deferred`](crate::Publisher::publish_deferred)
//! (so also [`publish`](crate::Publisher::publish) and everything built on it: replies,
//! pipeline steps, slips, the relay, the scheduler), before the message is validated and
//! handed over. It may change the exchange, the routing key and the message (add headers, …),
//! refuse it by returning an error without calling `next` (the caller gets that error and
//! nothing is sent), and observe the result of handing over (the [`Ticket`], or the error).
//! The broker's answer comes later: [`PublishContext::when_answered`] tells it (confirmed and
//! routed, unroutable, nacked, lost) to the interceptor, as the family's interceptors see it;
//! the [`Observer`](crate::observe::Observer) hears of it too. A retry, dead-letter or parked **copy** a
//! consumer publishes is not intercepted: it is the original message moving, not a new
//! publish. The trace context is written after the chain (an interceptor may set its own
//! `traceparent`, which is then kept).
//!
//! # Consuming
//!
//! [`ConsumeInterceptor::consume`] runs around the handler (and around its
//! [`chain`](fn@crate::patterns::chain::chain) layers, which are part of the handler), on the worker
//! thread, with the message's trace context current, inside the consumer's panic guard. What it
//! returns is the handler's result: an error or a panic is treated as the handler's (retried,
//! then dead-lettered), `Ok(outcome)` decides. It may hand `next` a different message (a
//! changed clone) and read the handler's answer. What the consumer then does with the delivery
//! (an answer of retry with no attempts left is dead-lettered) is told to
//! [`ConsumeContext::when_settled`] listeners, after the copy is published and before the
//! delivery is settled — the family's `when_settled`.
//!
//! The observer keeps working as before, beside the interceptors.

use std::fmt;
use std::sync::Arc;

use crate::envelope::Message;
use crate::error::Result;
use crate::outcome::HandlerResult;
use crate::ticket::Ticket;

/// A message on its way out.
pub struct PublishContext {
    /// Where it goes. Changing it redirects the message.
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The message, before validation and the trace context.
    pub message: Message,
    /// Told the broker's answer (see [`when_answered`](Self::when_answered)).
    pub(crate) answered: Vec<AnswerListener>,
}

/// A listener for a publish's answer: `Ok(())` confirmed (and routed), or the error the ticket
/// gives (`Unroutable`, `Nacked`, `ConnectionLost`).
pub(crate) type AnswerListener = Box<dyn FnOnce(&Result<()>) + Send>;

impl PublishContext {
    pub(crate) fn new(exchange: &str, routing_key: &str, message: Message) -> PublishContext {
        PublishContext {
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            message,
            answered: Vec::new(),
        }
    }

    /// Tells `listener` how the publish ended once the broker has answered: `Ok(())` when it
    /// was confirmed (and, mandatory, routed), else the error its [`Ticket`] gives —
    /// [`Error::Unroutable`](crate::Error::Unroutable), [`Error::Nacked`](crate::Error::Nacked),
    /// [`Error::ConnectionLost`](crate::Error::ConnectionLost). The family's publish
    /// interceptor sees `confirmed` and `routed` the same way. Called once, on the publisher's
    /// confirm thread, whether or not anybody waits on the ticket: keep it short (count, log,
    /// end a span); a panic in it is caught and logged. Not called when the publish never
    /// reaches the broker (the hand-over returns an error, which the interceptor sees from
    /// `next.run`). It may run while the publisher's lock is held (a lost channel fails every
    /// publish at once), so, like an [`Observer`](crate::observe::Observer), it must not publish through
    /// the same publisher.
    pub fn when_answered(&mut self, listener: impl FnOnce(&Result<()>) + Send + 'static) {
        self.answered.push(Box::new(listener));
    }
}

impl fmt::Debug for PublishContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishContext")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("message", &self.message)
            .field("answer_listeners", &self.answered.len())
            .finish()
    }
}

/// Tells each listener `answer`, each inside its own panic guard.
pub(crate) fn tell_answered(listeners: Vec<AnswerListener>, answer: &Result<()>) {
    for listener in listeners {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| listener(answer))).is_err() {
            log::error!("acemq: a publish interceptor's answer listener panicked; ignored");
        }
    }
}

/// The rest of a publish: the next interceptor, or the hand-over itself.
pub struct PublishNext<'a> {
    rest: &'a [Arc<dyn PublishInterceptor>],
    send: &'a dyn Fn(PublishContext) -> Result<Ticket>,
}

impl PublishNext<'_> {
    /// Runs the rest of the chain and the publish with `context`.
    ///
    /// # Errors
    ///
    /// What a later interceptor or the publish returns.
    pub fn run(self, context: PublishContext) -> Result<Ticket> {
        match self.rest.split_first() {
            Some((first, rest)) => first.publish(
                context,
                PublishNext {
                    rest,
                    send: self.send,
                },
            ),
            None => (self.send)(context),
        }
    }
}

/// Runs around every publish on a connection (see the [module docs](self)).
pub trait PublishInterceptor: Send + Sync + 'static {
    /// Carries on with `next.run(context)`, or returns without calling it to refuse.
    ///
    /// # Errors
    ///
    /// What it decides, or what `next` returned.
    fn publish(&self, context: PublishContext, next: PublishNext<'_>) -> Result<Ticket>;
}

impl<F> PublishInterceptor for F
where
    F: Fn(PublishContext, PublishNext<'_>) -> Result<Ticket> + Send + Sync + 'static,
{
    fn publish(&self, context: PublishContext, next: PublishNext<'_>) -> Result<Ticket> {
        self(context, next)
    }
}

/// Runs `interceptors` (outermost first) around `send`.
pub(crate) fn run_publish(
    interceptors: &[Arc<dyn PublishInterceptor>],
    context: PublishContext,
    send: &dyn Fn(PublishContext) -> Result<Ticket>,
) -> Result<Ticket> {
    PublishNext {
        rest: interceptors,
        send,
    }
    .run(context)
}

/// What the consumer finally did with a delivery, told to
/// [`when_settled`](ConsumeContext::when_settled) listeners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The observer's outcome label: `accept`, `retry`, `reject` (dead-lettered), `park`,
    /// `in_progress`, `copy_failed`, `lost`.
    pub outcome: &'static str,
    /// The error text that went with it, if any.
    pub error: Option<String>,
}

type Listener = Box<dyn FnOnce(&Settled) + Send>;

/// A delivery about to be handled.
pub struct ConsumeContext<'a> {
    /// The queue it was consumed from.
    pub queue: &'a str,
    listeners: Vec<Listener>,
}

impl fmt::Debug for ConsumeContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumeContext")
            .field("queue", &self.queue)
            .field("listeners", &self.listeners.len())
            .finish()
    }
}

impl<'a> ConsumeContext<'a> {
    pub(crate) fn new(queue: &'a str) -> ConsumeContext<'a> {
        ConsumeContext {
            queue,
            listeners: Vec::new(),
        }
    }

    /// Asks to be told how the consumer settled this delivery (once, on the worker thread,
    /// after its copy is out and before the acknowledgement). A panicking listener is caught
    /// and logged: the delivery is settled regardless.
    pub fn when_settled(&mut self, listener: impl FnOnce(&Settled) + Send + 'static) {
        self.listeners.push(Box::new(listener));
    }

    pub(crate) fn settled(self, settled: &Settled) {
        for listener in self.listeners {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| listener(settled)));
            if ran.is_err() {
                log::error!(
                    "acemq: a settlement listener panicked for a delivery from {:?}",
                    self.queue
                );
            }
        }
    }
}

/// The rest of a delivery: the next interceptor, or the handler.
pub struct ConsumeNext<'a> {
    rest: &'a [Arc<dyn ConsumeInterceptor>],
    handler: &'a dyn Fn(&Message) -> HandlerResult,
}

impl ConsumeNext<'_> {
    /// Runs the rest of the chain and the handler on `message` (the delivered one, or a
    /// changed clone of it).
    pub fn run(self, context: &mut ConsumeContext<'_>, message: &Message) -> HandlerResult {
        match self.rest.split_first() {
            Some((first, rest)) => first.consume(
                context,
                message,
                ConsumeNext {
                    rest,
                    handler: self.handler,
                },
            ),
            None => (self.handler)(message),
        }
    }
}

/// Runs around every handler on a connection (see the [module docs](self)).
pub trait ConsumeInterceptor: Send + Sync + 'static {
    /// Carries on with `next.run(context, message)`, or returns an outcome (or an error)
    /// without calling it.
    ///
    /// # Errors
    ///
    /// An error is the handler's: the delivery is retried, then dead-lettered.
    fn consume(
        &self,
        context: &mut ConsumeContext<'_>,
        message: &Message,
        next: ConsumeNext<'_>,
    ) -> HandlerResult;
}

impl<F> ConsumeInterceptor for F
where
    F: Fn(&mut ConsumeContext<'_>, &Message, ConsumeNext<'_>) -> HandlerResult
        + Send
        + Sync
        + 'static,
{
    fn consume(
        &self,
        context: &mut ConsumeContext<'_>,
        message: &Message,
        next: ConsumeNext<'_>,
    ) -> HandlerResult {
        self(context, message, next)
    }
}

/// Runs `interceptors` (outermost first) around `handler`.
pub(crate) fn run_consume(
    interceptors: &[Arc<dyn ConsumeInterceptor>],
    context: &mut ConsumeContext<'_>,
    message: &Message,
    handler: &dyn Fn(&Message) -> HandlerResult,
) -> HandlerResult {
    ConsumeNext {
        rest: interceptors,
        handler,
    }
    .run(context, message)
}
