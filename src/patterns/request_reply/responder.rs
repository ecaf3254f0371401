//! The answering side's handle: [`ResponderOptions`] (a [`ConsumerOptions`] underneath), the
//! configured [`Responder`] and the [`RunningResponder`] with its counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::answering::{Answering, Counters};
use super::reply::ReplyOnChannel;
use crate::connection::Connection;
use crate::consume::{CloseReport, Consumer, ConsumerOptions, RunningConsumer};
use crate::envelope::Message;
use crate::error::{BoxError, Result};
use crate::publish::Publisher;
use crate::stop::StopHandle;

/// Options for a [`Responder`].
#[derive(Clone, Debug, Default)]
pub struct ResponderOptions {
    consumer: ConsumerOptions,
}

impl ResponderOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The options of the consumer that takes the requests: `concurrency` for requests answered
    /// in parallel, `prefetch`, a retry policy for replies that could not be published, the
    /// shutdown timeout, [`ConsumerOptions::inline`] to answer on the consumer's own thread.
    /// Defaults to [`ConsumerOptions::default`] (one worker; the queue's failure topology
    /// declared as for any consumer).
    #[must_use]
    pub fn consumer(mut self, consumer: ConsumerOptions) -> Self {
        self.consumer = consumer;
        self
    }
}

/// A responder configured and checked, not yet taking requests: [`start`](Self::start) gives
/// it its handler.
///
/// How a reply goes out depends on where it goes. To a reply queue that lives only as long as
/// its requester's connection (the family's generated `acemq-reply-<id>`, a server-named
/// `amq.gen-…` queue, direct reply-to) it is published on the request's own channel just before
/// the request is acknowledged, without a publisher confirm: RabbitMQ handles a channel's frames
/// in order, so the broker has routed the reply by the time it takes the acknowledgement, which
/// is all a confirm of a message to such a queue says. To any other queue (a named reply queue,
/// which may be durable), and whenever the connection has publish interceptors (they see each
/// reply and may wait for the broker's answer), it goes through a confirming publisher and the
/// request is acknowledged once the reply is confirmed. Either way a reply the broker cannot
/// route is counted ([`RunningResponder::unroutable`]) and its request acknowledged.
#[derive(Debug)]
pub struct Responder {
    connection: Connection,
    consumer: Consumer,
    counters: Arc<Counters>,
}

impl Responder {
    /// A responder to the requests on `queue`, which must exist, with these options. Its
    /// consumer is made as [`Connection::consumer`] makes one (declaring the queue's failure
    /// topology unless told not to); nothing is consumed yet.
    ///
    /// # Errors
    ///
    /// As [`Connection::consumer`]: [`Error::InvalidArgument`](crate::Error::InvalidArgument) /
    /// [`Error::InvalidName`](crate::Error::InvalidName) for bad options; declaring the retry
    /// topology can fail.
    pub fn new(connection: &Connection, queue: &str, options: ResponderOptions) -> Result<Self> {
        let counters = Arc::new(Counters {
            queue: queue.to_string(),
            answered: AtomicU64::new(0),
            unanswerable: AtomicU64::new(0),
            unroutable: AtomicU64::new(0),
        });
        let hook = Arc::new(ReplyOnChannel {
            hooks: counters.clone(),
        });
        let consumer = connection.consumer(queue, options.consumer.hook(hook))?;
        Ok(Responder {
            connection: connection.clone(),
            consumer,
            counters,
        })
    }

    /// Answers the requests with `handler` on threads of its own; returns once subscribed. The
    /// handler returns the reply (anything that is `Into<Message>`: bytes, text, a [`Message`])
    /// or an error, which goes back as the family's failure reply (body `null`,
    /// `application/json`, the error in `acemq-error` as `Error: {message}`; see the
    /// [module docs](super)), after which the request is dead-lettered to `{queue}.dlq`. A reply
    /// whose header frame would not fit in the connection's frame ([`Connection::frame_max`];
    /// the broker would close the whole connection) is not sent: the failure reply goes instead
    /// (`Error: the reply could not be sent: …`) and the request is dead-lettered with that
    /// reason; if the failure reply cannot fit either (the request's correlation id fills the
    /// frame), the request is dead-lettered unanswered.
    ///
    /// # Errors
    ///
    /// As [`Consumer::start`]: [`Error::NotFound`](crate::Error::NotFound) when the queue does
    /// not exist, and other subscription errors; [`Error::Io`](crate::Error::Io) if the reply
    /// publisher's thread cannot start.
    pub fn start<F, R, E>(self, handler: F) -> Result<RunningResponder>
    where
        F: Fn(&Message) -> std::result::Result<R, E> + Send + Sync + 'static,
        R: Into<Message>,
        E: Into<BoxError>,
    {
        let Responder {
            connection,
            consumer,
            counters,
        } = self;
        // Its channel is opened by the first reply that needs it.
        let publisher = connection.publisher()?;
        let answering = Answering {
            handler,
            publisher: publisher.clone(),
            intercepted: !connection.shared.options.publish_interceptors.is_empty(),
            origin: connection.origin().to_string(),
            frame_max: connection.frame_max(),
            counters: counters.clone(),
        };
        let running = match consumer.start(move |m: &Message| answering.handle(m)) {
            Ok(r) => r,
            Err(e) => {
                let _ = publisher.close();
                return Err(e);
            }
        };
        Ok(RunningResponder {
            stop: running.stop_handle(),
            running: Some(running),
            publisher,
            counters,
        })
    }
}

/// Answers requests arriving on a queue; returned by [`Responder::start`]. `Send + Sync`.
///
/// Close it as a [`RunningConsumer`]: [`close`](Self::close) stops taking requests, lets
/// running handlers finish and joins the threads; dropping it does the same best-effort.
pub struct RunningResponder {
    running: Option<RunningConsumer>,
    stop: StopHandle,
    /// Replies that need the broker's confirm go through it (see [`Responder`]).
    publisher: Publisher,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for RunningResponder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningResponder")
            .field("consumer", &self.running)
            .field("answered", &self.answered())
            .field("unanswerable", &self.unanswerable())
            .finish()
    }
}

impl RunningResponder {
    /// Requests answered with a success reply: counted **before** each reply is published (so a
    /// caller holding its reply finds it counted), and handed back when that publish fails. A
    /// request whose handler failed gets the family's failure reply but is not counted, as the
    /// family counts it (a responder failing every request shows no answers).
    pub fn answered(&self) -> u64 {
        self.counters.answered.load(Ordering::SeqCst)
    }

    /// Requests with no reply address (neither `acemq-reply-to` nor `reply_to`), dead-lettered
    /// to `{queue}.dlq`.
    pub fn unanswerable(&self) -> u64 {
        self.counters.unanswerable.load(Ordering::SeqCst)
    }

    /// Replies the broker could not route (the requester and its reply queue are gone); their
    /// requests were acknowledged all the same.
    pub fn unroutable(&self) -> u64 {
        self.counters.unroutable.load(Ordering::SeqCst)
    }

    /// A handle that stops the responder's consumer from any thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Stops taking requests without closing ([`RunningConsumer::pause`]): running handlers
    /// finish and reply, what was prefetched goes back to the queue.
    ///
    /// # Errors
    ///
    /// [`Error::Closed`](crate::Error::Closed) when it has ended.
    pub fn pause(&self) -> Result<CloseReport> {
        self.consumer()?.pause()
    }

    /// Takes requests again after [`pause`](Self::pause) ([`RunningConsumer::resume`]).
    ///
    /// # Errors
    ///
    /// [`Error::Closed`](crate::Error::Closed) when it has ended.
    pub fn resume(&self) -> Result<()> {
        self.consumer()?.resume()
    }

    /// Runs `concurrency` handlers at once from now on ([`RunningConsumer::scale_to`]).
    ///
    /// # Errors
    ///
    /// As [`RunningConsumer::scale_to`].
    pub fn scale_to(&self, concurrency: usize) -> Result<()> {
        self.consumer()?.scale_to(concurrency)
    }

    /// True once its consumer has ended (stopped, or failed).
    pub fn is_finished(&self) -> bool {
        self.running
            .as_ref()
            .is_none_or(RunningConsumer::is_finished)
    }

    /// Closes as [`close`](Self::close) does, waiting up to `timeout` (not the consumer's
    /// shutdown timeout) for running handlers ([`RunningConsumer::drain`]).
    ///
    /// # Errors
    ///
    /// As [`close`](Self::close).
    pub fn drain(mut self, timeout: std::time::Duration) -> Result<CloseReport> {
        let report = match self.running.take() {
            Some(r) => r.drain(timeout),
            None => Ok(CloseReport::default()),
        };
        let closed = self.publisher.close();
        let report = report?;
        closed.map(|_| report)
    }

    fn consumer(&self) -> Result<&RunningConsumer> {
        self.running
            .as_ref()
            .ok_or(crate::Error::Closed { what: "responder" })
    }

    /// Stops taking requests, lets running handlers finish and publish their replies (up to
    /// the consumer's shutdown timeout), joins the threads and closes the publisher for confirmed
    /// replies.
    ///
    /// # Errors
    ///
    /// The error that ended the consumer, as [`RunningConsumer::close`].
    pub fn close(mut self) -> Result<CloseReport> {
        let report = match self.running.take() {
            Some(r) => r.close(),
            None => Ok(CloseReport::default()),
        };
        let closed = self.publisher.close();
        let report = report?;
        closed.map(|_| report)
    }
}

impl Drop for RunningResponder {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            if let Err(e) = r.close() {
                log::warn!("acemq: responder ended with: {e}");
            }
            let _ = self.publisher.close();
        }
    }
}
