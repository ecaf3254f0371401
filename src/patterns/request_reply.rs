//! Request/reply over RabbitMQ, as the AceMQ family does it: a [`Requester`] asks and blocks for
//! the answer; [`serve`] answers the requests arriving on a queue.
//!
//! # The wire (the family's contract)
//!
//! * Every request carries a fresh correlation id in `x-acemq-correlation` (the envelope's
//!   [`correlation_id`](crate::Envelope::correlation_id)) and its reply address twice: in the
//!   application header `acemq-reply-to` ([`headers::REPLY_TO`]) and in the AMQP `reply_to`
//!   property.
//! * A responder reads the address from the header first (text or bytes), then from the
//!   property. A request with neither cannot be answered: it is dead-lettered to `{queue}.dlq`
//!   as fatal (never retried) and counted ([`Responder::unanswerable`]).
//! * The reply goes to the default exchange with the address as routing key,
//!   `x-acemq-correlation` = the request's correlation and `x-acemq-causation` = the request's
//!   id. (The AMQP `correlation_id` property of the request, if any, is echoed too, for plain
//!   AMQP clients; the family never pairs by it.) A failing handler sends an empty reply with
//!   the error text in the header `acemq-error` ([`headers::REPLY_ERROR`]); the asking side
//!   returns [`Error::Responder`] at once.
//! * The requester pairs a reply with its call by the reply envelope's correlation id only. A
//!   reply no call waits for (it came after its call timed out, or was never asked) is counted
//!   ([`Requester::unmatched`]) and dropped with a debug log line.
//! * The default reply queue is `acemq-reply-<id>`: classic, transient, exclusive, auto-delete,
//!   owned by one requester. [`RequesterOptions::reply_queue`] names a durable (quorum) one
//!   instead.
//!
//! # Threads
//!
//! [`Requester`] is `Send + Sync`: share it by reference (scoped threads) or in an `Arc`, and
//! ask from as many threads at once as you like; each call gets exactly its own answer. Behind
//! it run two threads:
//!
//! * `acemq-requester` owns the amiquip channel that consumes the reply queue (amiquip's
//!   consumer cannot leave the thread that made it). It consumes without acknowledgements (a
//!   reply is tiny and only ever comes for a request this requester sent, so what amiquip
//!   buffers is bounded by the calls made) and hands each reply to its call through a one-slot
//!   channel looked up in a map of waiting calls — the only lock, never held across a network
//!   call.
//! * the `acemq-confirms` thread of its [`Publisher`]. Requests are published mandatory with
//!   confirms, but a call does not wait for the confirm: it waits for its reply, and the confirm
//!   thread wakes it only if the broker refuses the request, so an unroutable request (no
//!   responder's queue) fails at once with [`Error::Unroutable`] while a routed one costs one
//!   round trip and one wake-up.
//!
//! A call blocks only the thread that made it. [`Responder`] is `Send + Sync` too; it is a
//! [`RunningConsumer`](crate::RunningConsumer) underneath (`acemq-consumer`,
//! `acemq-worker-N`, `acemq-retry-timer`) with a publisher of its own for the replies.
//!
//! # Recovery
//!
//! When the connection drops, every call waiting for a reply fails at once with a retriable
//! [`Error::ConnectionLost`] (its reply queue is gone with the connection); calls made while
//! the connection recovers wait (within their own timeout) for the new reply queue, which
//! `acemq-requester` declares on the new connection under a new name. A responder resumes as
//! any consumer does; a reply whose requester went away is unroutable: it is logged and counted
//! ([`Responder::unroutable`]) and the request is acknowledged all the same.
//!
//! ```no_run
//! use acemq_amqp::patterns::{serve, Requester};
//! use acemq_amqp::{BoxError, Connection, Message, QueueSpec};
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! connection.declare_queue(&QueueSpec::new("prices"))?;
//! let responder = serve(&connection, "prices", |request: &Message| {
//!     let sku = std::str::from_utf8(&request.body)?;
//!     Ok::<_, BoxError>(format!("{sku}: 12.50"))
//! })?;
//! let requester = Requester::open(&connection, "", "prices")?;
//! let reply = requester.ask("sku-1")?;
//! assert_eq!(reply.body, b"sku-1: 12.50");
//! requester.close()?;
//! responder.close()?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use amiquip::{ConsumerMessage, ConsumerOptions as AmqpConsumerOptions};
use crossbeam_channel::{select, Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::connection::{declare_queue_on, Connection, QueueSpec};
use crate::consume::{CloseReport, ConsumerOptions, FatalError, HandlerResult, Outcome};
use crate::envelope::{check_name, headers, new_id, HeaderValue, Message};
use crate::error::{panic_message, BoxError, Error, Result};
use crate::observe::{Observer, RequestEvent, RequestOutcome};
use crate::publish::{Publisher, PublisherOptions};
use crate::StopHandle;

/// How long [`Requester::ask`] waits for a reply unless told otherwise: 30 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The prefix of a requester's own reply queue: `acemq-reply-<id>`.
pub const REPLY_QUEUE_PREFIX: &str = "acemq-reply-";

/// Options for a [`Requester`].
#[derive(Clone, Debug)]
pub struct RequesterOptions {
    timeout: Duration,
    reply_queue: Option<String>,
    window: usize,
}

impl Default for RequesterOptions {
    fn default() -> Self {
        RequesterOptions {
            timeout: DEFAULT_REQUEST_TIMEOUT,
            reply_queue: None,
            window: 1024,
        }
    }
}

impl RequesterOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long [`Requester::ask`] waits for its reply. Defaults to 30 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Replies go to this durable (quorum) queue, declared if missing and kept after the
    /// requester closes, rather than to a transient `acemq-reply-<id>` of its own. Only one
    /// requester may consume it at a time (it consumes exclusively). Defaults to none.
    pub fn reply_queue(mut self, name: impl Into<String>) -> Self {
        self.reply_queue = Some(name.into());
        self
    }

    /// The most requests whose publish confirm is outstanding at once (the requester's
    /// publisher window). Defaults to 1024.
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }
}

/// What a call waits for: its reply, or why none will come.
type ReplySlot = Sender<Result<Message>>;

/// The reply queue and the calls waiting on it, under one lock so that a call never registers
/// on a queue that is already gone.
struct State {
    /// The live reply queue, `None` while (re)connecting.
    queue: Option<String>,
    pending: HashMap<String, ReplySlot>,
    /// Set when the requester or its connection is closed.
    closed: bool,
}

struct Inner {
    connection: Connection,
    publisher: Publisher,
    exchange: String,
    routing_key: String,
    options: RequesterOptions,
    observer: Arc<dyn Observer>,
    state: Mutex<State>,
    ready: Condvar,
    stopping: AtomicBool,
    timed_out: AtomicU64,
    unmatched: AtomicU64,
}

/// Sends requests to `exchange` / `routing_key` and waits for their replies. `Send + Sync`:
/// many threads ask through one requester at once (see the [module docs](self)).
///
/// Dropping it closes it as [`close`](Self::close) does, logging what fails.
pub struct Requester {
    inner: Arc<Inner>,
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Requester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Requester")
            .field("exchange", &self.inner.exchange)
            .field("routing_key", &self.inner.routing_key)
            .field("reply_queue", &self.reply_queue())
            .finish()
    }
}

impl Requester {
    /// A requester to `exchange` / `routing_key` with default options: its own transient reply
    /// queue, 30 s timeout. Returns once the reply queue is consumed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; declaring or consuming the reply queue can fail
    /// ([`Error::ConnectionLost`], [`Error::Closed`], [`Error::TopologyConflict`]).
    pub fn open(connection: &Connection, exchange: &str, routing_key: &str) -> Result<Requester> {
        Self::open_with(
            connection,
            exchange,
            routing_key,
            RequesterOptions::default(),
        )
    }

    /// A requester with these options.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open); [`Error::InvalidArgument`] for a zero timeout or window.
    pub fn open_with(
        connection: &Connection,
        exchange: &str,
        routing_key: &str,
        options: RequesterOptions,
    ) -> Result<Requester> {
        check_name("exchange", exchange, true)?;
        check_name("routing key", routing_key, true)?;
        if let Some(q) = &options.reply_queue {
            check_name("queue", q, false)?;
        }
        if options.timeout.is_zero() {
            return Err(Error::invalid("the request timeout must be above zero"));
        }
        if options.window == 0 {
            return Err(Error::invalid("the requester's window must be at least 1"));
        }
        let publisher = connection.publisher_with(
            PublisherOptions::new()
                .window(options.window)
                .mandatory(true),
        )?;
        let inner = Arc::new(Inner {
            connection: connection.clone(),
            publisher,
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            options,
            observer: connection.observer().clone(),
            state: Mutex::new(State {
                queue: None,
                pending: HashMap::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            stopping: AtomicBool::new(false),
            timed_out: AtomicU64::new(0),
            unmatched: AtomicU64::new(0),
        });
        let (stop, stop_rx) = crossbeam_channel::bounded(1);
        let (started_tx, started_rx) = crossbeam_channel::bounded(1);
        let thread_inner = inner.clone();
        let thread = std::thread::Builder::new()
            .name("acemq-requester".into())
            .spawn(move || reply_loop(&thread_inner, &stop_rx, started_tx))
            .map_err(|e| Error::Io {
                context: "spawning the requester thread".into(),
                source: e,
            })?;
        let started = started_rx
            .recv()
            .unwrap_or(Err(Error::Closed { what: "requester" }));
        if let Err(e) = started {
            let _ = thread.join();
            let _ = inner.publisher.close();
            return Err(e);
        }
        Ok(Requester {
            inner,
            stop,
            thread: Some(thread),
        })
    }

    /// Sends `request` and waits for its reply, up to the requester's timeout (30 s unless set
    /// in [`RequesterOptions::timeout`]).
    ///
    /// # Errors
    ///
    /// As [`ask_timeout`](Self::ask_timeout).
    pub fn ask(&self, request: impl Into<Message>) -> Result<Message> {
        self.ask_timeout(request, self.inner.options.timeout)
    }

    /// Sends `request` (its correlation id replaced by a fresh one, its reply address set) and
    /// waits up to `timeout` for the reply, which it returns as received.
    ///
    /// # Errors
    ///
    /// [`Error::Responder`] when the responder answered with a failure;
    /// [`Error::RequestTimeout`] when no reply came in time (it is counted in
    /// [`timed_out`](Self::timed_out); a late reply is dropped); [`Error::Unroutable`] at once
    /// when no queue takes the request; [`Error::ConnectionLost`] (retriable) when the
    /// connection dropped while waiting, or did not come back in time; [`Error::Closed`];
    /// validation errors before anything is sent.
    pub fn ask_timeout(&self, request: impl Into<Message>, timeout: Duration) -> Result<Message> {
        let start = Instant::now();
        let result = self.round_trip(request.into(), start, timeout);
        let outcome = match &result {
            Ok(_) => RequestOutcome::Replied,
            Err(Error::Responder { .. }) => RequestOutcome::ResponderFailed,
            Err(Error::RequestTimeout { .. }) => RequestOutcome::TimedOut,
            Err(_) => RequestOutcome::Failed,
        };
        self.inner.observer.request(&RequestEvent {
            exchange: &self.inner.exchange,
            routing_key: &self.inner.routing_key,
            duration: start.elapsed(),
            outcome,
        });
        result
    }

    fn round_trip(
        &self,
        mut message: Message,
        start: Instant,
        timeout: Duration,
    ) -> Result<Message> {
        let inner = &*self.inner;
        let deadline = start + timeout;
        let correlation = new_id();
        message.envelope.correlation_id = Some(correlation.clone());
        message.validate()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let queue = inner.register(&correlation, tx, deadline, timeout)?;
        message.headers.insert(
            headers::REPLY_TO.to_string(),
            HeaderValue::Text(queue.clone()),
        );
        message.reply_to = Some(queue);
        // The confirm thread answers on `refused` only when the broker refuses the request
        // (unroutable, nacked, connection lost): a confirmed request wakes nobody, and the
        // sender kept here means the channel never reports itself disconnected.
        let (refuse, refused) = crossbeam_channel::bounded(1);
        if let Err(e) = inner.publisher.publish_failures_to(
            &inner.exchange,
            &inner.routing_key,
            &message,
            refuse.clone(),
        ) {
            inner.forget(&correlation);
            return Err(e);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let reply = select! {
            recv(rx) -> r => Some(r),
            recv(refused) -> refusal => {
                let e = match refusal {
                    Ok(Err(e)) => e,
                    _ => Error::Closed { what: "requester" },
                };
                // A reply may have raced the refusal (a lost connection after it was routed).
                if !inner.forget(&correlation) {
                    if let Ok(Ok(reply)) = rx.try_recv() {
                        return answer(reply);
                    }
                }
                return Err(e);
            },
            default(left) => None,
        };
        drop(refuse);
        match reply {
            Some(Ok(Ok(reply))) => answer(reply),
            Some(Ok(Err(e))) => Err(e),
            Some(Err(_)) => Err(Error::Closed { what: "requester" }),
            None => {
                if inner.forget(&correlation) {
                    inner.timed_out.fetch_add(1, Ordering::Relaxed);
                    Err(Error::RequestTimeout {
                        routing_key: inner.routing_key.clone(),
                        correlation_id: correlation,
                        after: timeout,
                    })
                } else {
                    // The reply (or the news of a lost connection) won the race.
                    match rx.try_recv() {
                        Ok(Ok(reply)) => answer(reply),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(Error::Closed { what: "requester" }),
                    }
                }
            }
        }
    }

    /// Calls that got no reply in time.
    pub fn timed_out(&self) -> u64 {
        self.inner.timed_out.load(Ordering::Relaxed)
    }

    /// Replies that matched no waiting call (late, or never asked for), dropped.
    pub fn unmatched(&self) -> u64 {
        self.inner.unmatched.load(Ordering::Relaxed)
    }

    /// The reply queue in use now; `None` while the connection recovers.
    pub fn reply_queue(&self) -> Option<String> {
        self.inner.state.lock().queue.clone()
    }

    /// Stops consuming replies (calls still waiting fail with [`Error::Closed`]), joins the
    /// requester's thread and closes its publisher. A transient reply queue is deleted by the
    /// broker once its consumer is gone.
    ///
    /// # Errors
    ///
    /// Closing the publisher can fail.
    pub fn close(mut self) -> Result<()> {
        self.shut()
    }

    fn shut(&mut self) -> Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        self.inner.stopping.store(true, Ordering::SeqCst);
        let _ = self.stop.try_send(());
        if thread.join().is_err() {
            log::error!("acemq: the requester thread panicked");
        }
        self.inner
            .close_state(|| Error::Closed { what: "requester" });
        self.inner.publisher.close()
    }
}

impl Drop for Requester {
    fn drop(&mut self) {
        if let Err(e) = self.shut() {
            log::warn!("acemq: closing a requester: {e}");
        }
    }
}

/// A reply as the caller sees it: the responder's failure as [`Error::Responder`].
fn answer(reply: Message) -> Result<Message> {
    match reply.headers.get(headers::REPLY_ERROR) {
        Some(v) => Err(Error::Responder {
            message: header_text(v).unwrap_or_else(|| "(unreadable error)".into()),
        }),
        None => Ok(reply),
    }
}

fn header_text(v: &HeaderValue) -> Option<String> {
    match v {
        HeaderValue::Text(s) => Some(s.clone()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

impl Inner {
    /// Registers a call on the live reply queue (waiting for one while recovering) and returns
    /// the queue.
    fn register(
        &self,
        correlation: &str,
        tx: ReplySlot,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<String> {
        let mut state = self.state.lock();
        loop {
            if state.closed {
                return Err(Error::Closed { what: "requester" });
            }
            if let Some(q) = &state.queue {
                let q = q.clone();
                state.pending.insert(correlation.to_string(), tx);
                return Ok(q);
            }
            if self.ready.wait_until(&mut state, deadline).timed_out() {
                return Err(Error::ConnectionLost {
                    context: format!("waiting {timeout:?} for the requester's reply queue"),
                });
            }
        }
    }

    /// Forgets a call; true if it was still waiting.
    fn forget(&self, correlation: &str) -> bool {
        self.state.lock().pending.remove(correlation).is_some()
    }

    /// A reply arrived: to its call, or counted and dropped.
    fn deliver(&self, reply: Message) {
        let correlation = reply.envelope.correlation_id.as_deref().unwrap_or_default();
        let slot = self.state.lock().pending.remove(correlation);
        match slot {
            Some(tx) => {
                let _ = tx.try_send(Ok(reply));
            }
            None => {
                self.unmatched.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "acemq: reply {} with correlation {correlation:?} matches no waiting request \
                     (late or unknown); dropped",
                    reply.id()
                );
            }
        }
    }

    /// The reply queue is gone: every waiting call fails with `error`.
    fn lose_queue(&self, error: impl Fn() -> Error) {
        let pending: Vec<ReplySlot> = {
            let mut state = self.state.lock();
            state.queue = None;
            state.pending.drain().map(|(_, tx)| tx).collect()
        };
        for tx in pending {
            let _ = tx.try_send(Err(error()));
        }
    }

    fn close_state(&self, error: impl Fn() -> Error) {
        self.state.lock().closed = true;
        self.lose_queue(error);
        self.ready.notify_all();
    }

    fn reply_spec(&self) -> QueueSpec {
        match &self.options.reply_queue {
            Some(name) => QueueSpec::new(name.clone()),
            None => QueueSpec::new(format!("{REPLY_QUEUE_PREFIX}{}", new_id()))
                .durable(false)
                .exclusive(true)
                .auto_delete(true)
                .classic(),
        }
    }
}

/// The `acemq-requester` thread: (re)declares and consumes the reply queue on each connection
/// and hands replies to their calls.
fn reply_loop(inner: &Inner, stop: &Receiver<()>, started: Sender<Result<()>>) {
    let mut started = Some(started);
    let fail_start = |started: &mut Option<Sender<Result<()>>>, e: Error| {
        if let Some(tx) = started.take() {
            let _ = tx.send(Err(e));
            true
        } else {
            false
        }
    };
    loop {
        if inner.stopping.load(Ordering::SeqCst) {
            return;
        }
        let link = match inner.connection.link(Duration::from_millis(250)) {
            Ok(link) => link,
            Err(e @ Error::Closed { .. }) => {
                if !fail_start(&mut started, e) {
                    inner.close_state(|| Error::Closed { what: "connection" });
                }
                return;
            }
            Err(e) => {
                if fail_start(&mut started, e) {
                    return;
                }
                continue;
            }
        };
        let spec = inner.reply_spec();
        let session = link.open_channel().and_then(|channel| {
            declare_queue_on(&channel, &spec)?;
            Ok(channel)
        });
        let channel = match session {
            Ok(c) => c,
            Err(e) => {
                if fail_start(&mut started, e) {
                    return;
                }
                log::warn!("acemq: the requester could not declare its reply queue; retrying");
                if stop.recv_timeout(Duration::from_millis(200)).is_ok() {
                    return;
                }
                continue;
            }
        };
        let options = AmqpConsumerOptions {
            no_ack: true,
            exclusive: true,
            ..AmqpConsumerOptions::default()
        };
        let consumer = match channel.basic_consume(spec.name.clone(), options) {
            Ok(c) => c,
            Err(e) => {
                let e = Error::from_amqp_on("queue", &spec.name, "consuming from", e);
                if fail_start(&mut started, e) {
                    return;
                }
                // The channel closes when dropped at the end of this turn.
                if stop.recv_timeout(Duration::from_millis(200)).is_ok() {
                    return;
                }
                continue;
            }
        };
        inner.state.lock().queue = Some(spec.name.clone());
        inner.ready.notify_all();
        if let Some(tx) = started.take() {
            let _ = tx.send(Ok(()));
        }
        let stopped = loop {
            select! {
                recv(consumer.receiver()) -> msg => match msg {
                    Ok(ConsumerMessage::Delivery(mut d)) => inner.deliver(Message::take_delivery(&mut d)),
                    Ok(other) => {
                        log::warn!("acemq: the requester's reply queue {:?} ended: {other:?}", spec.name);
                        break false;
                    }
                    Err(_) => break false,
                },
                recv(stop) -> _ => break true,
            }
        };
        if !stopped {
            inner.lose_queue(|| Error::ConnectionLost {
                context: "waiting for a reply (the reply queue went with the connection)".into(),
            });
        }
        crate::consume::owner::cancel_and_drain(&spec.name, &consumer, |mut d| {
            inner.deliver(Message::take_delivery(&mut d))
        });
        drop(consumer);
        let _ = channel.close();
        if stopped {
            return;
        }
        log::warn!(
            "acemq: the requester lost its reply queue {:?}; declaring a new one",
            spec.name
        );
    }
}

/// Answers requests arriving on a queue; returned by [`serve`]. `Send + Sync`.
///
/// Close it as a [`RunningConsumer`](crate::RunningConsumer): [`close`](Self::close) stops
/// taking requests, lets running handlers finish and joins the threads; dropping it does the
/// same best-effort.
pub struct Responder {
    running: Option<crate::RunningConsumer>,
    stop: StopHandle,
    publisher: Publisher,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("consumer", &self.running)
            .field("answered", &self.answered())
            .field("unanswerable", &self.unanswerable())
            .finish()
    }
}

#[derive(Default)]
struct Counters {
    answered: AtomicU64,
    unanswerable: AtomicU64,
    unroutable: AtomicU64,
}

impl Responder {
    /// Requests answered: counted **before** each reply is published (so a caller holding its
    /// reply finds it counted), and handed back when that publish fails.
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

    /// Stops taking requests, lets running handlers finish and publish their replies (up to
    /// the consumer's shutdown timeout), joins the threads and closes the reply publisher.
    ///
    /// # Errors
    ///
    /// The error that ended the consumer, as [`RunningConsumer::close`](crate::RunningConsumer::close).
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

impl Drop for Responder {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            if let Err(e) = r.close() {
                log::warn!("acemq: responder ended with: {e}");
            }
            let _ = self.publisher.close();
        }
    }
}

/// Answers the requests on `queue` with `handler` on threads of its own, with default consumer
/// options (one worker; the queue's failure topology declared as for any consumer). The handler
/// returns the reply (anything that is `Into<Message>`: bytes, text, a [`Message`]) or an error,
/// which goes back as the reply's `acemq-error`. The queue must exist.
///
/// # Errors
///
/// As [`Connection::consumer`] and [`Consumer::start`](crate::Consumer::start).
pub fn serve<F, R, E>(connection: &Connection, queue: &str, handler: F) -> Result<Responder>
where
    F: Fn(&Message) -> std::result::Result<R, E> + Send + Sync + 'static,
    R: Into<Message>,
    E: Into<BoxError>,
{
    serve_with(connection, queue, ConsumerOptions::default(), handler)
}

/// [`serve`] with consumer options: `concurrency` for requests answered in parallel,
/// `prefetch`, a retry policy for replies that could not be published.
///
/// # Errors
///
/// As [`serve`].
pub fn serve_with<F, R, E>(
    connection: &Connection,
    queue: &str,
    options: ConsumerOptions,
    handler: F,
) -> Result<Responder>
where
    F: Fn(&Message) -> std::result::Result<R, E> + Send + Sync + 'static,
    R: Into<Message>,
    E: Into<BoxError>,
{
    let counters = Arc::new(Counters::default());
    let publisher = connection.publisher()?;
    let answering = Answering {
        handler,
        publisher: publisher.clone(),
        counters: counters.clone(),
        queue: queue.to_string(),
    };
    let running = connection
        .consumer(queue, options)?
        .start(move |m: &Message| answering.handle(m));
    let running = match running {
        Ok(r) => r,
        Err(e) => {
            let _ = publisher.close();
            return Err(e);
        }
    };
    Ok(Responder {
        stop: running.stop_handle(),
        running: Some(running),
        publisher,
        counters,
    })
}

struct Answering<F> {
    handler: F,
    publisher: Publisher,
    counters: Arc<Counters>,
    queue: String,
}

impl<F, R, E> Answering<F>
where
    F: Fn(&Message) -> std::result::Result<R, E>,
    R: Into<Message>,
    E: Into<BoxError>,
{
    fn handle(&self, request: &Message) -> HandlerResult {
        let Some(address) = reply_address(request) else {
            self.counters.unanswerable.fetch_add(1, Ordering::SeqCst);
            return Err(Box::new(FatalError::new(format!(
                "request {} carries no reply address (neither the {} header nor reply_to)",
                request.id(),
                headers::REPLY_TO
            ))));
        };
        let mut reply = match catch_unwind(AssertUnwindSafe(|| (self.handler)(request))) {
            Ok(Ok(reply)) => reply.into(),
            Ok(Err(e)) => failure(e.into().to_string()),
            Err(panic) => failure(format!("panic: {}", panic_message(panic.as_ref()))),
        };
        let correlation = request
            .envelope
            .correlation_id
            .clone()
            .unwrap_or_else(|| request.id().to_string());
        reply.envelope.correlation_id = Some(correlation);
        reply.envelope.causation_id = Some(request.id().to_string());
        if reply.amqp_correlation_id.is_none() {
            reply.amqp_correlation_id = request.amqp_correlation_id.clone();
        }
        reply.received = None;
        reply.properties = None;
        self.counters.answered.fetch_add(1, Ordering::SeqCst);
        match self.publisher.publish("", &address, reply) {
            Ok(()) => Ok(Outcome::Accept),
            Err(e) => {
                self.counters.answered.fetch_sub(1, Ordering::SeqCst);
                if e.is_unroutable() {
                    self.counters.unroutable.fetch_add(1, Ordering::SeqCst);
                    log::warn!(
                        "acemq: the reply to request {} on {:?} is unroutable (its requester's \
                         queue {address:?} is gone); the request is acknowledged",
                        request.id(),
                        self.queue
                    );
                    Ok(Outcome::Accept)
                } else {
                    Err(Box::new(e))
                }
            }
        }
    }
}

/// An empty reply carrying the responder's failure.
fn failure(text: String) -> Message {
    Message::new(Vec::new()).header(headers::REPLY_ERROR, text)
}

/// Where a request's reply goes: the `acemq-reply-to` header (text or UTF-8 bytes) first, then
/// the AMQP `reply_to` property; empty is absent.
fn reply_address(request: &Message) -> Option<String> {
    request
        .headers
        .get(headers::REPLY_TO)
        .and_then(header_text)
        .filter(|s| !s.is_empty())
        .or_else(|| request.reply_to.clone().filter(|s| !s.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_comes_before_the_property() {
        let m = Message::new("x")
            .header(
                headers::REPLY_TO,
                HeaderValue::Bytes(b"from-header".to_vec()),
            )
            .reply_to("from-property");
        assert_eq!(reply_address(&m).as_deref(), Some("from-header"));
        let m = Message::new("x").reply_to("from-property");
        assert_eq!(reply_address(&m).as_deref(), Some("from-property"));
        let m = Message::new("x").header(headers::REPLY_TO, "").reply_to("");
        assert_eq!(reply_address(&m), None);
    }

    #[test]
    fn a_failure_reply_reads_as_a_responder_error() {
        match answer(failure("no such sku".into())) {
            Err(Error::Responder { message }) => assert_eq!(message, "no such sku"),
            other => panic!("{other:?}"),
        }
        assert!(answer(Message::new("ok")).is_ok());
    }
}
