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
//!   AMQP clients; the family never pairs by it.)
//! * A failing handler (an error or a panic) is answered as the family's responders answer it:
//!   the body JSON `null` with content type `application/json` (a Python or Ruby requester
//!   decodes every reply, and an empty body would not decode: the caller would wait out its
//!   timeout), and the error text in the header `acemq-error` ([`headers::REPLY_ERROR`]) as
//!   `{type}: {message}` — `Error: …`, `FatalError: …` or `panic: …` here (Python writes
//!   `ValueError: …`). The reply is confirmed, and then the request is **dead-lettered** to
//!   `{queue}.dlq` (`x-acemq-error`: `the handler rejected it: Error: …`), as the Python, Go and
//!   Ruby responders reject it after their failure reply: the caller has its answer, a retry
//!   would answer it twice, and the failed request is kept for a person. (Java's responder
//!   sends no failure reply; its failed request is retried.) The asking side returns
//!   [`Error::Responder`] at once, with the header's text, for this reply and for the older
//!   empty one alike.
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
//! ask from as many threads at once as you like; each call gets exactly its own answer.
//!
//! * A call publishes its request itself (on the requester's request channel, under a lock held
//!   only for the hand-over to amiquip) and then **reads the reply queue itself**: every waiting
//!   call listens both on its own one-slot channel and on the reply consumer's receiver. A call
//!   that receives its own reply returns it at once (no thread in between); one that receives
//!   another call's reply hands it to that call's slot (looked up in a map of waiting calls —
//!   the only lock, never held across a network call). So a round trip costs the same thread
//!   hand-offs as a hand-written amiquip client.
//! * `acemq-requester` owns the amiquip channel that consumes the reply queue (amiquip's
//!   consumer cannot leave the thread that made it) and (re)declares it on each connection. It
//!   listens for the broker's returns of unroutable requests (each fails its call at once with
//!   [`Error::Unroutable`]) and for the end of the reply consumer; while no call waits it reads
//!   the replies itself every 100 ms (a late reply is counted and dropped).
//!
//! Requests are published `mandatory` **without** publisher confirms: a call waits for its
//! reply, which can only come after the broker routed the request, so a confirm would add a
//! broker round trip and a thread wake-up to every call and tell it nothing the reply does not.
//! An unroutable request comes back as a return; a request the broker loses (a rare internal
//! failure that a confirm would report as a nack) ends in [`Error::RequestTimeout`]. A request's
//! bytes are reserved in the connection's byte budget
//! ([`ConnectionOptions::max_unconfirmed_bytes`](crate::ConnectionOptions::max_unconfirmed_bytes))
//! like every publish's, waited for within the call's timeout, and given back when the call
//! ends — or, for a call that ends without its reply while the broker blocks publishing (a memory
//! alarm), once the broker unblocks: so requests never fill amiquip's buffer past the point
//! where it would block a thread without a deadline.
//!
//! The reply consumer acknowledges what it takes and has a prefetch of twice
//! [`RequesterOptions::window`] (at most 65,535): a backlog on a named reply queue (replies to a
//! requester that went away) stays in the broker rather than in amiquip's buffer. The
//! acknowledgements are `multiple`, sent by `acemq-requester` when half the prefetch is taken or
//! while idle, so a round trip pays no extra thread hand-off for them.
//!
//! A call blocks only the thread that made it. [`Responder`] is `Send + Sync` too; it is a
//! [`RunningConsumer`](crate::RunningConsumer) underneath (`acemq-consumer`,
//! `acemq-worker-N`, `acemq-retry-timer`). The handler runs on a worker, which builds the reply
//! — or, with [`ConsumerOptions::inline`] in [`serve_with`], on `acemq-consumer` itself, which
//! then reads the request, answers and acknowledges it on one thread as a hand-written
//! responder does (the fastest round trip: see the README's figures; closing then waits for a
//! running handler);
//! a reply to a transient reply queue (`acemq-reply-<id>`, `amq.gen-…`, direct reply-to) is
//! handed with the request's settlement to `acemq-consumer`, which publishes it on the request's
//! channel **just before** acknowledging the request, without a publisher confirm: RabbitMQ
//! handles one channel's frames in order, so the reply is routed by the time the broker takes
//! the acknowledgement, and if the connection drops in between neither took effect and the
//! request is answered again — the guarantee a confirm gave, for a queue that dies with its
//! requester anyway. A reply to any other (possibly durable) queue, and every reply when the
//! connection has publish interceptors, goes through a confirming publisher of the responder's
//! own, and the request is acknowledged once it is confirmed. Either way a reply the broker
//! cannot route is counted and its request acknowledged. (Confirming every reply cost the
//! responder about 11 context switches per request, against about 5 now; without the confirms 8
//! callers ask ~20 % more a second on this machine; see the README's figures.)
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
//! use acemq_amqp::patterns::request_reply::{serve, Requester};
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

use amiquip::{ConsumerMessage, ConsumerOptions as AmqpConsumerOptions, Publish, Return};
use crossbeam_channel::{never, select, Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::connection::{declare_queue_on, Connection, Link, QueueSpec};
use crate::consume::reply::{Reply, ReplyHooks};
use crate::consume::{CloseReport, ConsumerOptions, HandlerResult, Outcome};
use crate::envelope::{check_name, headers, new_id, HeaderValue, Message};
use crate::error::FatalError;
use crate::error::{panic_message, BoxError, Error, Result};
use crate::observe::{Observer, PublishOutcome, RequestEvent, RequestOutcome};
use crate::publish::{
    blocked_or, check_fits, send_unconfirmed, ByteBudget, Publisher, Reservation,
};
use crate::StopHandle;

/// How long [`Requester::ask`] waits for a reply unless told otherwise: 30 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The prefix of a requester's own reply queue: `acemq-reply-<id>`.
pub const REPLY_QUEUE_PREFIX: &str = "acemq-reply-";

/// While no call waits, `acemq-requester` reads the reply queue itself this often.
const IDLE_READ: Duration = Duration::from_millis(100);

/// … and this soon again while it finds replies there (a backlog).
const BACKLOG_READ: Duration = Duration::from_millis(1);

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
    /// requester may consume it at a time (it consumes exclusively). Defaults to none. A name
    /// starting `acemq-reply-` is refused when the requester opens: responders take such a
    /// queue for a generated transient one and send replies to it unconfirmed (see
    /// [`serve_with`]).
    pub fn reply_queue(mut self, name: impl Into<String>) -> Self {
        self.reply_queue = Some(name.into());
        self
    }

    /// The most calls waiting for their replies at once; a call beyond that waits (within its
    /// own timeout) for one of them to finish. Defaults to 1024.
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }
}

/// What a call waits for: its reply, or why none will come.
type ReplySlot = Sender<Result<Message>>;

/// One reply queue on one connection, and what a call needs from it: the channel requests are
/// published on and the receiver the replies arrive on. Each call holds a clone.
#[derive(Clone)]
struct Session {
    /// Counts sessions, so a report about an old one is not taken for the live one.
    number: u64,
    queue: String,
    /// Taken out and closed by `acemq-requester` when the session ends.
    requests: Arc<Mutex<Option<amiquip::Channel>>>,
    replies: Receiver<ConsumerMessage>,
    /// The reply deliveries taken and acknowledged on this session's channel.
    acks: Arc<ReplyAcks>,
}

/// The reply deliveries taken (by the calls, or by `acemq-requester`) and not yet acknowledged;
/// `acemq-requester`, which owns the channel, acknowledges them (`multiple`, the highest tag).
#[derive(Debug)]
struct ReplyAcks {
    taken: Sender<amiquip::Delivery>,
    queue: Receiver<amiquip::Delivery>,
    /// Half the prefetch: this many taken, `acemq-requester` is woken to acknowledge.
    half: usize,
}

impl ReplyAcks {
    /// Room for the prefetch: no more deliveries than that are ever unacknowledged.
    fn new(prefetch: u16) -> ReplyAcks {
        let (taken, queue) = crossbeam_channel::bounded(usize::from(prefetch).max(1));
        ReplyAcks {
            taken,
            queue,
            half: usize::from(prefetch / 2).max(1),
        }
    }

    /// A delivery was taken (its message read out); true when it is time to acknowledge.
    fn took(&self, delivery: amiquip::Delivery) -> bool {
        // Full cannot happen (at most the prefetch is unacknowledged); a delivery not kept is
        // covered by the `multiple` acknowledgement of a later one anyway.
        let _ = self.taken.try_send(delivery);
        self.taken.len() >= self.half
    }

    /// Acknowledges everything taken so far, on the reply channel.
    fn ack(&self, channel: &amiquip::Channel) {
        let mut highest: Option<amiquip::Delivery> = None;
        while let Ok(d) = self.queue.try_recv() {
            if highest
                .as_ref()
                .is_none_or(|h| d.delivery_tag() > h.delivery_tag())
            {
                highest = Some(d);
            }
        }
        if let Some(d) = highest {
            if let Err(e) = d.ack_multiple(channel) {
                // The channel is gone: the consumer's end is noticed on its receiver.
                log::debug!("acemq: acknowledging replies: {e}");
            }
        }
    }
}

/// The live session and the calls waiting on it, under one lock so that a call never registers
/// on a queue that is already gone.
struct State {
    /// `None` while (re)connecting.
    session: Option<Session>,
    pending: HashMap<String, ReplySlot>,
    /// Set when the requester or its connection is closed.
    closed: bool,
}

struct Inner {
    connection: Connection,
    exchange: String,
    routing_key: String,
    options: RequesterOptions,
    observer: Arc<dyn Observer>,
    state: Mutex<State>,
    /// Signalled when a session is installed, a call leaves, or the requester closes.
    ready: Condvar,
    /// A call saw the reply consumer of this session end: `acemq-requester` replaces it.
    ended: Sender<u64>,
    /// Calls took half the prefetch of replies: `acemq-requester` acknowledges them.
    ack_wake: Sender<()>,
    ack_woken: Receiver<()>,
    /// The bytes of requests whose calls ended without their reply while the broker blocked
    /// publishing: they may still be in amiquip's buffer, so they stay reserved until the broker
    /// unblocks (released by `acemq-requester`).
    parked: Mutex<Vec<Reservation>>,
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
            if q.starts_with(REPLY_QUEUE_PREFIX) {
                return Err(Error::invalid(format!(
                    "the reply queue {q:?} starts with {REPLY_QUEUE_PREFIX:?}, which names the \
                     transient reply queues requesters generate (responders send replies to \
                     those unconfirmed); name a durable reply queue otherwise"
                )));
            }
        }
        if options.timeout.is_zero() {
            return Err(Error::invalid("the request timeout must be above zero"));
        }
        if options.window == 0 {
            return Err(Error::invalid("the requester's window must be at least 1"));
        }
        let (ended, ended_rx) = crossbeam_channel::bounded(1);
        let (ack_wake, ack_woken) = crossbeam_channel::bounded(1);
        let inner = Arc::new(Inner {
            connection: connection.clone(),
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            options,
            observer: connection.observer().clone(),
            state: Mutex::new(State {
                session: None,
                pending: HashMap::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            ended,
            ack_wake,
            ack_woken,
            parked: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            timed_out: AtomicU64::new(0),
            unmatched: AtomicU64::new(0),
        });
        let (stop, stop_rx) = crossbeam_channel::bounded(1);
        let (started_tx, started_rx) = crossbeam_channel::bounded(1);
        let thread_inner = inner.clone();
        let thread = std::thread::Builder::new()
            .name("acemq-requester".into())
            .spawn(move || reply_loop(&thread_inner, &stop_rx, &ended_rx, started_tx))
            .map_err(|e| Error::Io {
                context: "spawning the requester thread".into(),
                source: e,
            })?;
        let started = started_rx
            .recv()
            .unwrap_or(Err(Error::Closed { what: "requester" }));
        if let Err(e) = started {
            let _ = thread.join();
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
    /// when no queue takes the request; [`Error::NotFound`] when the exchange does not exist;
    /// [`Error::ConnectionLost`] (retriable) when the connection dropped while waiting, or did
    /// not come back in time; [`Error::Closed`]; validation errors before anything is sent,
    /// among them [`Error::FrameTooLarge`] for a request whose header frame (properties and
    /// headers) would not fit in the connection's frame ([`Connection::frame_max`]).
    pub fn ask_timeout(&self, request: impl Into<Message>, timeout: Duration) -> Result<Message> {
        let start = Instant::now();
        let span = crate::trace::RequestSpan::start(&self.inner.exchange, &self.inner.routing_key);
        let result = self.round_trip(request.into(), start, timeout);
        span.end(match &result {
            Ok(_) | Err(Error::Responder { .. }) => "answered",
            Err(Error::RequestTimeout { .. }) => "timed_out",
            Err(_) => "failed",
        });
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
        // Checked before the call waits for a session (not in `publish::prepare`, after it):
        // bad input fails at once, also while the requester reconnects.
        message.validate()?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let session = inner.register(&correlation, tx, deadline, timeout)?;
        // The request's bytes, from the connection's budget like every publish's (the module
        // docs say when they are given back).
        let budget = inner.connection.budget();
        let Some(bytes) = budget.reserve(ByteBudget::size_of(&message), deadline) else {
            inner.forget(&correlation);
            let e = Error::Timeout {
                what: "room among the connection's unconfirmed bytes for the request (the \
                       broker is not reading them: blocked, or a stalled connection)"
                    .into(),
                after: timeout,
            };
            return Err(blocked_or(&inner.connection.shared.blocked, e));
        };
        let result = self.send_and_wait(message, &correlation, session, rx, deadline, timeout);
        inner.give_back(bytes, &result);
        result
    }

    /// Publishes the registered call's request on `session` and waits for its reply.
    fn send_and_wait(
        &self,
        mut message: Message,
        correlation: &str,
        session: Session,
        rx: Receiver<Result<Message>>,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Message> {
        let inner = &*self.inner;
        message.headers.insert(
            headers::REPLY_TO.to_string(),
            HeaderValue::Text(session.queue.clone()),
        );
        message.reply_to = Some(session.queue.clone());
        // The exchange and routing key were checked when the requester opened; the reply
        // address is the requester's own queue.
        let _ = crate::trace::stamp(&mut message, &inner.exchange, &inner.routing_key);
        let properties = message.to_properties(&inner.routing_key, Some(inner.connection.origin()));
        // A header frame over the limit would make the broker close the whole connection:
        // refused here, before anything is sent, and the call forgotten.
        if let Err(e) = check_fits(&properties, inner.connection.frame_max()) {
            inner.forget(correlation);
            return Err(e);
        }
        let publish = Publish {
            body: &message.body,
            routing_key: inner.routing_key.clone(),
            mandatory: true,
            immediate: false,
            properties,
        };
        // Requests go out one at a time on the request channel; the wait for it has the call's
        // deadline.
        let published = match session.requests.try_lock_until(deadline) {
            Some(requests) => match requests.as_ref() {
                Some(channel) => {
                    send_unconfirmed(channel, &inner.exchange, publish, &*inner.observer)
                        .map_err(|e| Error::amqp("publishing a request", e))
                }
                None => Err(Error::ConnectionLost {
                    context: "publishing a request (the requester is reconnecting)".into(),
                }),
            },
            None => Err(blocked_or(
                &inner.connection.shared.blocked,
                Error::Timeout {
                    what: "the request channel (a request before this one is still being \
                           handed over: the broker is not reading?)"
                        .into(),
                    after: timeout,
                },
            )),
        };
        if let Err(e) = published {
            if inner.forget(correlation) {
                return Err(e);
            }
            // `acemq-requester` already answered the call (the channel closed under it).
        }
        // Wait on our own slot and, meanwhile, read the reply queue: the reply usually comes
        // straight to this thread.
        let mut replies = session.replies;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            select! {
                recv(rx) -> r => {
                    return match r {
                        Ok(Ok(reply)) => answer(reply),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(Error::Closed { what: "requester" }),
                    };
                }
                recv(replies) -> msg => match msg {
                    Ok(ConsumerMessage::Delivery(mut d)) => {
                        let reply = Message::take_delivery(&mut d);
                        if session.acks.took(d) {
                            let _ = inner.ack_wake.try_send(());
                        }
                        // Ours (the usual case): straight back, once taken out of the map.
                        let mine = reply.envelope.correlation_id.as_deref() == Some(correlation);
                        if mine && inner.forget(correlation) {
                            return answer(reply);
                        }
                        inner.deliver(reply);
                    }
                    // The reply consumer ended (connection lost, queue deleted, closing):
                    // `acemq-requester` answers every waiting call; wait for that.
                    _ => {
                        let _ = inner.ended.try_send(session.number);
                        replies = never();
                    }
                },
                default(left) => {
                    if inner.forget(correlation) {
                        inner.timed_out.fetch_add(1, Ordering::Relaxed);
                        return Err(Error::RequestTimeout {
                            routing_key: inner.routing_key.clone(),
                            correlation_id: correlation.to_string(),
                            after: timeout,
                        });
                    }
                    // The reply (or the news of a lost connection) won the race.
                    return match rx.try_recv() {
                        Ok(Ok(reply)) => answer(reply),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(Error::Closed { what: "requester" }),
                    };
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
        self.inner
            .state
            .lock()
            .session
            .as_ref()
            .map(|s| s.queue.clone())
    }

    /// Stops consuming replies (calls still waiting fail with [`Error::Closed`]) and joins the
    /// requester's thread. A transient reply queue is deleted by the broker once its consumer
    /// is gone.
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for closing that can fail.
    pub fn close(mut self) -> Result<()> {
        self.shut();
        Ok(())
    }

    fn shut(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.inner.stopping.store(true, Ordering::SeqCst);
        let _ = self.stop.try_send(());
        if thread.join().is_err() {
            log::error!("acemq: the requester thread panicked");
        }
        self.inner
            .close_state(|| Error::Closed { what: "requester" });
    }
}

impl Drop for Requester {
    fn drop(&mut self) {
        self.shut();
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

/// A text header of a message the broker returned; empty when absent.
fn returned_header(r: &Return, name: &str) -> String {
    r.properties
        .headers()
        .as_ref()
        .and_then(|h| h.get(name))
        .and_then(|v| header_text(&HeaderValue::from_amqp(v)))
        .unwrap_or_default()
}

fn header_text(v: &HeaderValue) -> Option<String> {
    match v {
        HeaderValue::Text(s) => Some(s.clone()),
        HeaderValue::Bytes(b) => String::from_utf8(b.clone()).ok(),
        _ => None,
    }
}

impl Inner {
    /// Registers a call on the live session (waiting for one while recovering, and for room
    /// among the waiting calls) and returns the session.
    fn register(
        &self,
        correlation: &str,
        tx: ReplySlot,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Session> {
        let mut state = self.state.lock();
        loop {
            if state.closed {
                return Err(Error::Closed { what: "requester" });
            }
            let room = state.pending.len() < self.options.window;
            if let (Some(session), true) = (&state.session, room) {
                let session = session.clone();
                state.pending.insert(correlation.to_string(), tx);
                return Ok(session);
            }
            if self.ready.wait_until(&mut state, deadline).timed_out() {
                return Err(if state.session.is_none() {
                    Error::ConnectionLost {
                        context: format!("waiting {timeout:?} for the requester's reply queue"),
                    }
                } else {
                    Error::Timeout {
                        what: format!(
                            "room among the requester's {} waiting calls",
                            self.options.window
                        ),
                        after: timeout,
                    }
                });
            }
        }
    }

    /// A call ends: its request's bytes go back to the budget — unless it ended without its
    /// reply while the broker blocks publishing (the request may still be in amiquip's buffer),
    /// then once the broker unblocks.
    fn give_back(&self, bytes: Reservation, result: &Result<Message>) {
        let unanswered = matches!(result, Err(Error::RequestTimeout { .. }));
        if unanswered && self.connection.is_blocked() {
            self.parked.lock().push(bytes);
        }
    }

    /// Releases the parked reservations once the broker no longer blocks publishing.
    fn release_parked(&self) {
        if !self.connection.is_blocked() {
            let parked = std::mem::take(&mut *self.parked.lock());
            drop(parked);
        }
    }

    /// Forgets a call; true if it was still waiting.
    fn forget(&self, correlation: &str) -> bool {
        let removed = self.state.lock().pending.remove(correlation);
        self.left(removed)
    }

    /// A call left the map: its slot, if it was there; a call waiting for room may go on.
    fn left(&self, slot: Option<ReplySlot>) -> bool {
        if slot.is_some() {
            self.ready.notify_one();
        }
        slot.is_some()
    }

    /// A reply arrived: to its call, or counted and dropped.
    fn deliver(&self, reply: Message) {
        let correlation = reply.envelope.correlation_id.as_deref().unwrap_or_default();
        let slot = self.state.lock().pending.remove(correlation);
        match slot {
            Some(tx) => {
                let _ = tx.try_send(Ok(reply));
                self.left(Some(tx));
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

    /// The broker returned a request as unroutable: its call fails at once.
    fn returned(&self, r: Return) {
        self.observer
            .published(&r.exchange, PublishOutcome::Unroutable);
        let correlation = returned_header(&r, headers::CORRELATION);
        let slot = self.state.lock().pending.remove(&correlation);
        match slot {
            Some(tx) => {
                let _ = tx.try_send(Err(Error::Unroutable {
                    exchange: r.exchange,
                    routing_key: r.routing_key,
                    message_id: r.properties.message_id().clone().unwrap_or_default(),
                    reply_code: r.reply_code,
                    reply_text: r.reply_text,
                }));
                self.left(Some(tx));
            }
            None => log::debug!(
                "acemq: a returned request with correlation {correlation:?} matches no waiting \
                 call; dropped"
            ),
        }
    }

    /// While no call waits, reads what reached the reply queue (late replies), acknowledging
    /// on `channel` (the reply channel) as it goes. `None` when the reply consumer has ended,
    /// else how many it read.
    fn read_idle(
        &self,
        replies: &Receiver<ConsumerMessage>,
        acks: &ReplyAcks,
        channel: &amiquip::Channel,
    ) -> Option<usize> {
        let mut read = 0;
        let alive = loop {
            if !self.state.lock().pending.is_empty() {
                break true; // the calls read it
            }
            match replies.try_recv() {
                Ok(ConsumerMessage::Delivery(mut d)) => {
                    let reply = Message::take_delivery(&mut d);
                    if acks.took(d) {
                        acks.ack(channel);
                    }
                    read += 1;
                    self.deliver(reply)
                }
                Ok(_) | Err(crossbeam_channel::TryRecvError::Disconnected) => break false,
                Err(crossbeam_channel::TryRecvError::Empty) => break true,
            }
        };
        acks.ack(channel);
        alive.then_some(read)
    }

    /// The session is gone: every waiting call fails with `error`.
    fn lose_session(&self, error: impl Fn() -> Error) {
        let pending: Vec<ReplySlot> = {
            let mut state = self.state.lock();
            state.session = None;
            state.pending.drain().map(|(_, tx)| tx).collect()
        };
        for tx in pending {
            let _ = tx.try_send(Err(error()));
        }
        self.ready.notify_all();
    }

    fn close_state(&self, error: impl Fn() -> Error) {
        self.state.lock().closed = true;
        self.lose_session(error);
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

/// How a session ended.
enum Ended {
    /// The requester is closing.
    Stopped,
    /// The reply consumer ended (the connection dropped, the queue was deleted).
    Replies,
    /// The broker closed the request channel (a publish to a missing exchange), with its reason.
    Requests(Option<(u16, String)>),
}

/// The `acemq-requester` thread: (re)declares and consumes the reply queue on each connection,
/// opens the request channel beside it, and fails calls whose requests come back unroutable.
fn reply_loop(
    inner: &Inner,
    stop: &Receiver<()>,
    ended: &Receiver<u64>,
    started: Sender<Result<()>>,
) {
    let mut started = Some(started);
    let fail_start = |started: &mut Option<Sender<Result<()>>>, e: Error| {
        if let Some(tx) = started.take() {
            let _ = tx.send(Err(e));
            true
        } else {
            false
        }
    };
    let mut number = 0u64;
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
        number += 1;
        let how = match run_session(inner, &link, number, stop, ended, &mut started) {
            Ok(how) => how,
            Err(e) => {
                if fail_start(&mut started, e) {
                    return;
                }
                log::warn!("acemq: the requester could not set up its reply queue; retrying");
                if stop.recv_timeout(Duration::from_millis(200)).is_ok() {
                    return;
                }
                continue;
            }
        };
        match how {
            Ended::Stopped => return,
            Ended::Replies => log::warn!(
                "acemq: the requester lost its reply queue (connection lost or queue deleted); \
                 declaring a new one"
            ),
            Ended::Requests(reason) => log::warn!(
                "acemq: the broker closed the requester's request channel ({}); opening a new one",
                reason.map_or_else(|| "no reason given".into(), |(c, t)| format!("{c} {t}"))
            ),
        }
    }
}

/// One session: declare and consume the reply queue, open the request channel, install them
/// for the calls, then watch until the session ends.
fn run_session(
    inner: &Inner,
    link: &Link,
    number: u64,
    stop: &Receiver<()>,
    ended: &Receiver<u64>,
    started: &mut Option<Sender<Result<()>>>,
) -> Result<Ended> {
    let spec = inner.reply_spec();
    let channel = link.open_channel()?;
    declare_queue_on(&channel, &spec)?;
    let requests = link.open_channel()?;
    let returns = requests
        .listen_for_returns()
        .map_err(|e| Error::amqp("listening for returned requests", e))?;
    // Acknowledged, with a prefetch: a backlog stays in the broker (see the module docs).
    let prefetch = u16::try_from(inner.options.window.saturating_mul(2)).unwrap_or(u16::MAX);
    channel
        .qos(0, prefetch, false)
        .map_err(|e| Error::amqp("setting the reply consumer's prefetch", e))?;
    let acks = Arc::new(ReplyAcks::new(prefetch));
    let options = AmqpConsumerOptions {
        no_ack: false,
        exclusive: true,
        ..AmqpConsumerOptions::default()
    };
    let consumer = channel
        .basic_consume(spec.name.clone(), options)
        .map_err(|e| Error::from_amqp_on("queue", &spec.name, "consuming from", e))?;
    let requests = Arc::new(Mutex::new(Some(requests)));
    inner.state.lock().session = Some(Session {
        number,
        queue: spec.name.clone(),
        requests: requests.clone(),
        replies: consumer.receiver().clone(),
        acks: acks.clone(),
    });
    inner.ready.notify_all();
    if let Some(tx) = started.take() {
        let _ = tx.send(Ok(()));
    }
    // While a backlog is being read, the next idle read comes soon.
    let mut idle = IDLE_READ;
    let how = loop {
        select! {
            recv(stop) -> _ => break Ended::Stopped,
            recv(returns) -> r => match r {
                Ok(r) => inner.returned(r),
                Err(_) => break Ended::Requests(closed_reason(&requests)),
            },
            recv(ended) -> n => {
                if n == Ok(number) {
                    break Ended::Replies;
                }
            },
            recv(inner.ack_woken) -> _ => {
                acks.ack(&channel);
                inner.release_parked();
            },
            default(idle) => match inner.read_idle(consumer.receiver(), &acks, &channel) {
                Some(read) => {
                    inner.release_parked();
                    idle = if read > 0 { BACKLOG_READ } else { IDLE_READ };
                }
                None => break Ended::Replies,
            },
        }
    };
    match &how {
        Ended::Stopped => {}
        Ended::Replies => inner.lose_session(|| Error::ConnectionLost {
            context: "waiting for a reply (the reply queue went with the connection)".into(),
        }),
        Ended::Requests(reason) => {
            let exchange = &inner.exchange;
            inner.lose_session(|| match reason {
                Some((404, text)) if text.contains(&format!("exchange '{exchange}'")) => {
                    Error::NotFound {
                        kind: "exchange",
                        name: exchange.clone(),
                        reason: text.clone(),
                    }
                }
                Some((code, text)) => Error::ConnectionLost {
                    context: format!(
                        "waiting for a reply: the broker closed the request channel ({code} {text})"
                    ),
                },
                None => Error::ConnectionLost {
                    context: "waiting for a reply: the request channel closed".into(),
                },
            });
        }
    }
    crate::consume::owner::cancel_and_drain(&spec.name, &consumer, |mut d| {
        let reply = Message::take_delivery(&mut d);
        acks.took(d);
        inner.deliver(reply)
    });
    // What was read is not handed back to the queue (a named one would deliver it again).
    acks.ack(&channel);
    drop(consumer);
    let _ = channel.close();
    if let Some(requests) = requests.lock().take() {
        let _ = requests.close();
    }
    Ok(how)
}

/// The broker's reason for closing the request channel: amiquip reports it on the channel's
/// next call.
fn closed_reason(requests: &Mutex<Option<amiquip::Channel>>) -> Option<(u16, String)> {
    match requests.lock().take()?.close() {
        Err(amiquip::Error::ServerClosedChannel { code, message, .. }) => Some((code, message)),
        _ => None,
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
    /// Replies that need the broker's confirm go through it (see [`serve_with`]).
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

#[derive(Debug)]
struct Counters {
    queue: String,
    answered: AtomicU64,
    unanswerable: AtomicU64,
    unroutable: AtomicU64,
}

impl Counters {
    /// A reply the broker could not route: no longer answered, counted and logged.
    fn unroutable(&self, request_id: &str, address: &str) {
        self.answered.fetch_sub(1, Ordering::SeqCst);
        self.unroutable.fetch_add(1, Ordering::SeqCst);
        log::warn!(
            "acemq: the reply to request {request_id} on {:?} is unroutable (its requester's \
             queue {address:?} is gone); the request is acknowledged",
            self.queue
        );
    }
}

/// What becomes of the replies sent on the request's channel (`consume/reply.rs`).
impl ReplyHooks for Counters {
    fn not_sent(&self) {
        self.answered.fetch_sub(1, Ordering::SeqCst);
    }

    fn returned(&self, r: Return) {
        let request_id = returned_header(&r, headers::CAUSATION);
        self.unroutable(&request_id, &r.routing_key);
    }
}

/// True for a reply queue that lives only as long as its requester's connection: the family's
/// generated `acemq-reply-<id>` (transient, exclusive, auto-delete, by the contract), a
/// server-named `amq.gen-…` queue and RabbitMQ's direct reply-to. A reply to one is sent on the
/// request's channel before the request's acknowledgement, unconfirmed (the module docs say why).
fn transient_reply_queue(address: &str) -> bool {
    address.starts_with(REPLY_QUEUE_PREFIX)
        || address.starts_with("amq.gen-")
        || address.starts_with("amq.rabbitmq.reply-to")
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
    /// the consumer's shutdown timeout), joins the threads and closes the publisher for confirmed
    /// replies.
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
/// which goes back as the family's failure reply (body `null`, `application/json`, the error in
/// `acemq-error` as `Error: {message}`; see the [module docs](self)), after which the request
/// is dead-lettered to `{queue}.dlq`. A reply whose header frame would not fit in the
/// connection's frame ([`Connection::frame_max`]; the broker would close the whole connection)
/// is not sent: the failure reply goes instead (`Error: the reply could not be sent: …`) and
/// the request is dead-lettered with that reason; if the failure reply cannot fit either (the
/// request's correlation id fills the frame), the request is dead-lettered unanswered. The
/// queue must exist.
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
/// How a reply goes out depends on where it goes. To a reply queue that lives only as long as
/// its requester's connection (the family's generated `acemq-reply-<id>`, a server-named
/// `amq.gen-…` queue, direct reply-to) it is published on the request's own channel just before
/// the request is acknowledged, without a publisher confirm: RabbitMQ handles a channel's frames
/// in order, so the broker has routed the reply by the time it takes the acknowledgement, which
/// is all a confirm of a message to such a queue says. To any other queue (a named reply queue,
/// which may be durable), and whenever the connection has publish interceptors (they see each
/// reply and may wait for the broker's answer), it goes through a confirming publisher and the
/// request is acknowledged once the reply is confirmed. Either way a reply the broker cannot
/// route is counted ([`Responder::unroutable`]) and its request acknowledged.
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
    let counters = Arc::new(Counters {
        queue: queue.to_string(),
        answered: AtomicU64::new(0),
        unanswerable: AtomicU64::new(0),
        unroutable: AtomicU64::new(0),
    });
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
    let options = options.replies(counters.clone());
    let running = connection
        .consumer(queue, options)
        .and_then(|c| c.start(move |m: &Message| answering.handle(m)));
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
    /// For replies that need the broker's confirm.
    publisher: Publisher,
    /// The connection has publish interceptors: every reply goes through `publisher`.
    intercepted: bool,
    /// The connection's origin, stamped on replies built here.
    origin: String,
    /// The connection's frame limit, which a reply staged here must fit.
    frame_max: usize,
    counters: Arc<Counters>,
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
        let (reply, mut failed) = match catch_unwind(AssertUnwindSafe(|| (self.handler)(request))) {
            Ok(Ok(reply)) => (reply.into(), None),
            Ok(Err(e)) => {
                let text = failure_text(&*e.into());
                (failure(&text), Some(text))
            }
            Err(panic) => {
                let text = format!("panic: {}", panic_message(panic.as_ref()));
                (failure(&text), Some(text))
            }
        };
        let mut reply = addressed(reply, request);
        self.counters.answered.fetch_add(1, Ordering::SeqCst);
        // A failure reply goes through the confirming publisher whatever the queue: the
        // request is dead-lettered after it (as the family's responders do), and its `.dlq`
        // copy and acknowledgement must not overtake an unconfirmed reply.
        if failed.is_none() && !self.intercepted && transient_reply_queue(&address) {
            let hooks = self.counters.clone();
            let built = Reply::build(
                address.clone(),
                reply,
                &self.origin,
                self.frame_max,
                request.id(),
                hooks,
            );
            match built {
                Ok(reply) => {
                    crate::consume::reply::stage(reply);
                    return Ok(Outcome::Accept);
                }
                // Never sent as is (the broker would close the connection, the request
                // would come back and go round again): the caller gets the family's failure
                // reply instead, and the request is dead-lettered as after any failure.
                Err(e @ Error::FrameTooLarge { .. }) => {
                    let text = reply_too_large(&e);
                    reply = addressed(failure(&text), request);
                    failed = Some(text);
                }
                Err(e) => {
                    self.counters.answered.fetch_sub(1, Ordering::SeqCst);
                    return Err(Box::new(e));
                }
            }
        }
        // Answered (or unroutable): a success is accepted, a failure dead-lettered.
        let settled = |failed: &Option<String>| match failed {
            None => Outcome::Accept,
            Some(text) => Outcome::Reject {
                reason: text.clone(),
            },
        };
        loop {
            match self.publisher.publish("", &address, reply) {
                Ok(()) => return Ok(settled(&failed)),
                Err(e) if e.is_unroutable() => {
                    self.counters.unroutable(request.id(), &address);
                    return Ok(settled(&failed));
                }
                // Refused before sending; handling the request again would make the same
                // reply. A reply that cannot fit is replaced by the family's failure reply;
                // a failure reply that cannot fit (a huge correlation id) by none.
                Err(e @ Error::FrameTooLarge { .. }) => match failed {
                    None => {
                        let text = reply_too_large(&e);
                        reply = addressed(failure(&text), request);
                        failed = Some(text);
                    }
                    Some(text) => {
                        self.counters.answered.fetch_sub(1, Ordering::SeqCst);
                        return Ok(Outcome::Reject {
                            reason: format!("{text}; its failure reply could not be sent: {e}"),
                        });
                    }
                },
                Err(e) => {
                    self.counters.answered.fetch_sub(1, Ordering::SeqCst);
                    return Err(Box::new(e));
                }
            }
        }
    }
}

/// `reply` made the answer to `request`: its correlation id (the request's, else the
/// request's id), its causation (the request), the AMQP correlation id kept from the request
/// unless set; what it carried as received is dropped.
fn addressed(mut reply: Message, request: &Message) -> Message {
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
    reply
}

/// The failure text for a reply refused by the frame limit (`e`, [`Error::FrameTooLarge`]).
fn reply_too_large(e: &Error) -> String {
    format!("Error: the reply could not be sent: {e}")
}

/// The family's failure reply: the body JSON `null` (`application/json`), so that a requester
/// whose reply consumer decodes every reply (Python's, Ruby's) reads it, and the error text in
/// `acemq-error`.
fn failure(text: &str) -> Message {
    Message::new(&b"null"[..])
        .content_type("application/json")
        .header(headers::REPLY_ERROR, text)
}

/// A handler's error as the family writes it in `acemq-error`: `{type}: {message}` (Python's
/// `ValueError: …`, Ruby's `RuntimeError: …`). A Rust error's type is not known behind a
/// [`BoxError`], so it is written as the consumer writes a handler's error in
/// `x-acemq-error`: `FatalError: …` for a [`FatalError`], `Error: …` for any other.
fn failure_text(e: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    match e.downcast_ref::<FatalError>() {
        Some(fatal) => format!("FatalError: {fatal}"),
        None => format!("Error: {e}"),
    }
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
        match answer(failure("Error: no such sku")) {
            Err(Error::Responder { message }) => assert_eq!(message, "Error: no such sku"),
            other => panic!("{other:?}"),
        }
        // The old form (an empty body, no content type) too.
        let old = Message::new(Vec::new()).header(headers::REPLY_ERROR, "no such sku");
        assert!(matches!(answer(old), Err(Error::Responder { .. })));
        assert!(answer(Message::new("ok")).is_ok());
    }

    #[test]
    fn a_failure_is_written_with_its_type() {
        let plain: BoxError = "no such sku".into();
        assert_eq!(failure_text(&*plain), "Error: no such sku");
        let fatal: BoxError = Box::new(FatalError::new("bad sku"));
        assert_eq!(failure_text(&*fatal), "FatalError: bad sku");
        let reply = failure("Error: x");
        assert_eq!(reply.body, b"null");
        assert_eq!(reply.content_type.as_deref(), Some("application/json"));
    }
}
