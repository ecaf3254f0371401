//! The confirmed publisher.
//!
//! # Threads
//!
//! A [`Publisher`] is `Clone + Send + Sync`. A publish runs on the **caller's thread**: under the
//! channel's lock (waited for with the caller's deadline) it numbers the message (confirm
//! delivery tags start at 1 per channel) and records it as pending under the publisher's state
//! lock, then, with the state lock released, hands the frames to amiquip's I/O thread — it never
//! waits for the network there, and the confirm thread never waits for it. One **confirm thread** per publisher (`acemq-confirms`) receives the broker's
//! `basic.ack`/`basic.nack` and `basic.return`, matches them to pending publishes and answers
//! each caller through its [`Ticket`]. A return arrives before the ack of the same message, so on
//! each confirm the thread first drains the returns; returns carry no delivery tag and are
//! matched by `message_id`.
//!
//! Every publish is answered: confirmed, nacked ([`Error::Nacked`]), returned as unroutable
//! ([`Error::Unroutable`]), or failed because the channel or connection went away
//! ([`Error::ConnectionLost`], retriable). A publish that could not even be handed over while
//! the connection is down waits for recovery (up to the timeout) and then goes out on the new
//! channel; one already handed over is never re-sent silently (that would be a duplicate the
//! caller did not choose).
//!
//! The number of unconfirmed publishes is bounded by [`PublisherOptions::window`]: a caller
//! beyond it waits for room. The bytes unconfirmed on one connection, all its publishers
//! together, are bounded too ([`ConnectionOptions::max_unconfirmed_bytes`], 8 MiB by default),
//! below the point where amiquip's I/O thread stops taking frames (it blocks the publishing
//! thread, without a timeout, once it buffers 16 MiB for a broker that stopped reading — a
//! memory alarm, a stalled socket). So a publish never blocks inside amiquip: when the broker
//! stops reading, callers wait for room with their deadline and get [`Error::Timeout`] on time,
//! and confirms, [`Publisher::close`] and [`Publisher::in_flight`] stay responsive.
//!
//! [`ConnectionOptions::max_unconfirmed_bytes`]: crate::ConnectionOptions::max_unconfirmed_bytes

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use amiquip::{Confirm, Publish, Return};
use crossbeam_channel::{never, select, Receiver, Sender};
use parking_lot::{Condvar, Mutex, MutexGuard};
use serde::Serialize;

mod frame;

pub(crate) use frame::check_fits;
use frame::check_message_fits;
#[cfg(feature = "internals")]
pub(crate) use frame::header_frame_size;

use crate::codec::Codec;
use crate::connection::Connection;
use crate::envelope::{check_name, Message};
use crate::error::{Error, Result};
use crate::observe::{Observer, PublishOutcome};

/// Options for a [`Publisher`].
#[derive(Clone, Debug)]
pub struct PublisherOptions {
    window: usize,
    timeout: Duration,
    mandatory: bool,
    codec: Option<Arc<dyn Codec>>,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        PublisherOptions {
            window: 1024,
            timeout: Duration::from_secs(30),
            mandatory: true,
            codec: None,
        }
    }
}

impl PublisherOptions {
    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most publishes awaiting a confirm at once; further callers wait for room. Defaults
    /// to 1024.
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }

    /// How long [`Publisher::publish`] and [`Ticket::wait`] wait for room, for recovery and for
    /// the confirm. Defaults to 30 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Publish with the mandatory flag, so an unroutable message is returned rather than
    /// dropped. Defaults to true.
    pub fn mandatory(mut self, mandatory: bool) -> Self {
        self.mandatory = mandatory;
        self
    }

    /// The codec for [`Publisher::publish_value`]. Defaults to the connection's.
    pub fn codec(mut self, codec: impl Codec + 'static) -> Self {
        self.codec = Some(Arc::new(codec));
        self
    }
}

/// Publishes with confirms. `Clone + Send + Sync`: clones share one channel and confirm thread.
///
/// ```no_run
/// use acemq_amqp::{Connection, Message};
/// # fn main() -> acemq_amqp::Result<()> {
/// let connection = Connection::open("amqp://127.0.0.1")?;
/// let publisher = connection.publisher()?;
/// publisher.publish("", "orders", Message::new(&b"hello"[..]))?; // waits for the confirm
/// let tickets = (0..100)
///     .map(|i| publisher.publish_deferred("", "orders", Message::new(format!("{i}"))))
///     .collect::<Result<Vec<_>, _>>()?;
/// for t in tickets {
///     t.wait()?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Publisher {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.inner.shared.state.lock();
        f.debug_struct("Publisher")
            .field("pending", &s.pending.len())
            .field("window", &self.inner.options.window)
            .finish()
    }
}

struct Inner {
    connection: Connection,
    options: PublisherOptions,
    codec: Arc<dyn Codec>,
    shared: Arc<Shared>,
    control: Sender<Control>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.control.send(Control::Stop);
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }
}

/// What the confirm thread and callers share.
struct Shared {
    state: Mutex<State>,
    room: Condvar,
    observer: Arc<dyn Observer>,
}

struct State {
    current: Option<Current>,
    /// Bumped per channel; confirms from an older channel are ignored.
    epoch: u64,
    pending: BTreeMap<u64, Pending>,
    closed: bool,
}

struct Current {
    /// The channel, under a lock of its own: a publish is numbered under the state lock and
    /// handed to amiquip under this one alone (taken with the caller's deadline), so that
    /// `basic_publish` — which blocks, without a deadline, once amiquip's buffer is full —
    /// never holds up the confirm thread, [`Publisher::in_flight`] or [`Publisher::close`].
    channel: Arc<Mutex<Option<amiquip::Channel>>>,
    next_tag: u64,
}

struct Pending {
    /// Released (dropped) when the publish is answered or failed.
    _bytes: Option<Reservation>,
    message_id: String,
    exchange: String,
    routing_key: String,
    returned: Option<(u16, String)>,
    reply: oneshot::Sender<Result<()>>,
    /// Publish interceptors' listeners for the answer.
    answered: Vec<crate::intercept::AnswerListener>,
}

enum Control {
    Channel {
        epoch: u64,
        confirms: Receiver<Confirm>,
        returns: Receiver<Return>,
    },
    Stop,
}

/// The unconfirmed bytes of one connection, shared by its publishers.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used: Mutex<usize>,
    freed: Condvar,
    max: usize,
}

impl ByteBudget {
    pub(crate) fn new(max: usize) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            used: Mutex::new(0),
            freed: Condvar::new(),
            max,
        })
    }

    /// What `message` takes of the budget: its body and a generous allowance for the frame
    /// and header overhead.
    pub(crate) fn size_of(message: &Message) -> usize {
        message.body.len().saturating_add(4096)
    }

    /// Takes `bytes` (a message larger than the whole budget goes alone), waiting for room up
    /// to `deadline`.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        bytes: usize,
        deadline: Instant,
    ) -> Option<Reservation> {
        let mut used = self.used.lock();
        while *used > 0 && used.saturating_add(bytes) > self.max {
            if self.freed.wait_until(&mut used, deadline).timed_out() {
                return None;
            }
        }
        *used += bytes;
        Some(Reservation {
            budget: self.clone(),
            bytes,
        })
    }
}

/// Bytes taken from a [`ByteBudget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<ByteBudget>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut used = self.budget.used.lock();
        *used = used.saturating_sub(self.bytes);
        self.budget.freed.notify_all();
    }
}

/// The answer to one publish, to wait for later.
#[must_use = "a ticket must be waited on to know whether the broker took the message"]
#[derive(Debug)]
pub struct Ticket {
    reply: oneshot::Receiver<Result<()>>,
    message_id: String,
    deadline: Instant,
    timeout: Duration,
    /// The publish's span (feature `opentelemetry`), ended with the answer.
    span: crate::trace::PublishSpan,
    /// The connection's blocked state, to report a timeout while blocked as such.
    blocked: Arc<parking_lot::Mutex<Option<String>>>,
}

impl Ticket {
    /// The published message's id.
    pub fn message_id(&self) -> &str {
        &self.message_id
    }

    /// Waits for the broker's answer, up to the publisher's timeout counted from the publish.
    ///
    /// # Errors
    ///
    /// [`Error::Nacked`], [`Error::Unroutable`], [`Error::ConnectionLost`] (retriable),
    /// [`Error::Timeout`] ([`Error::Blocked`] when the broker is blocking publishing then).
    pub fn wait(self) -> Result<()> {
        let deadline = self.deadline;
        self.wait_deadline(deadline)
    }

    /// Waits up to `timeout` from now.
    ///
    /// # Errors
    ///
    /// As [`wait`](Self::wait).
    pub fn wait_timeout(self, timeout: Duration) -> Result<()> {
        self.wait_deadline(Instant::now() + timeout)
    }

    /// The answer if it has come, without waiting.
    pub fn try_wait(&self) -> Option<Result<()>> {
        self.reply.try_recv().ok()
    }

    fn wait_deadline(mut self, deadline: Instant) -> Result<()> {
        let result = self
            .answer(deadline)
            .map_err(|e| blocked_or(&self.blocked, e));
        self.span.end(result.as_ref().map(|_| ()));
        result
    }

    /// Waits up to `deadline`; when no answer came by then, hands the ticket back (to go on
    /// waiting, as the outbox relay does once it has renewed its lease) instead of a timeout.
    pub(crate) fn wait_or_keep(
        mut self,
        deadline: Instant,
    ) -> std::result::Result<Result<()>, Ticket> {
        match self.reply.recv_deadline(deadline) {
            Err(oneshot::RecvTimeoutError::Timeout) => Err(self),
            Ok(r) => {
                let r = r.map_err(|e| blocked_or(&self.blocked, e));
                self.span.end(r.as_ref().map(|_| ()));
                Ok(r)
            }
            Err(oneshot::RecvTimeoutError::Disconnected) => {
                let r = Err(Error::Closed { what: "publisher" });
                self.span.end(r.as_ref().map(|_| ()));
                Ok(r)
            }
        }
    }

    fn answer(&self, deadline: Instant) -> Result<()> {
        match self.reply.recv_deadline(deadline) {
            Ok(r) => r,
            Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout {
                what: format!("the confirm of message {:?}", self.message_id),
                after: self.timeout,
            }),
            Err(oneshot::RecvTimeoutError::Disconnected) => {
                Err(Error::Closed { what: "publisher" })
            }
        }
    }
}

impl Connection {
    /// A publisher with default options.
    ///
    /// # Errors
    ///
    /// As [`publisher_with`](Self::publisher_with).
    pub fn publisher(&self) -> Result<Publisher> {
        self.publisher_with(PublisherOptions::default())
    }

    /// A publisher. Its channel is opened on the first publish.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero window; [`Error::Io`] if its thread cannot start.
    pub fn publisher_with(&self, options: PublisherOptions) -> Result<Publisher> {
        if options.window == 0 {
            return Err(Error::invalid("the publisher window must be at least 1"));
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                current: None,
                epoch: 0,
                pending: BTreeMap::new(),
                closed: false,
            }),
            room: Condvar::new(),
            observer: self.observer().clone(),
        });
        let (control, control_rx) = crossbeam_channel::unbounded();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("acemq-confirms".into())
            .spawn(move || confirm_loop(&thread_shared, &control_rx))
            .map_err(|e| Error::Io {
                context: "spawning the publisher's confirm thread".into(),
                source: e,
            })?;
        let codec = options.codec.clone().unwrap_or_else(|| self.codec());
        Ok(Publisher {
            inner: Arc::new(Inner {
                connection: self.clone(),
                options,
                codec,
                shared,
                control,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }
}

impl Publisher {
    /// Publishes and waits for the broker's answer.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidHeader`] / [`Error::InvalidName`] / [`Error::FrameTooLarge`] (its
    /// properties and headers cannot fit in one frame) before anything is sent;
    /// [`Error::Unroutable`] (mandatory and no queue bound); [`Error::Nacked`];
    /// [`Error::NotFound`] when the exchange does not exist; [`Error::ConnectionLost`]
    /// (retriable); [`Error::Timeout`].
    pub fn publish(&self, exchange: &str, routing_key: &str, message: Message) -> Result<()> {
        self.publish_deferred(exchange, routing_key, message)?
            .wait()
    }

    /// Encodes `value` with the publisher's codec, then [`publish`](Self::publish)es it.
    ///
    /// # Errors
    ///
    /// [`Error::Codec`], and as [`publish`](Self::publish).
    pub fn publish_value<T: Serialize + ?Sized>(
        &self,
        exchange: &str,
        routing_key: &str,
        value: &T,
    ) -> Result<()> {
        let message = Message::encode(self.inner.codec.as_ref(), value)?;
        self.publish(exchange, routing_key, message)
    }

    /// The publisher's codec.
    pub fn codec(&self) -> &Arc<dyn Codec> {
        &self.inner.codec
    }

    /// Hands the message over and returns a [`Ticket`] for the answer, so a caller can publish a
    /// batch and wait once. Waits only for room in the window and, while the connection
    /// recovers, for a channel.
    ///
    /// # Errors
    ///
    /// Validation errors ([`Error::FrameTooLarge`] among them), [`Error::Timeout`] waiting for
    /// room or recovery ([`Error::Blocked`]
    /// when the broker is blocking publishing then), [`Error::ConnectionLost`],
    /// [`Error::NotFound`] for a missing exchange, [`Error::Closed`].
    pub fn publish_deferred(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<Ticket> {
        let mandatory = self.inner.options.mandatory;
        self.publish_intercepted(exchange, routing_key, message, mandatory)
    }

    /// [`publish`](Self::publish), mandatory whatever this publisher's options say: a pattern's
    /// next hop (a pipeline step, a routing slip's next stop), which must reach a queue or come
    /// back as [`Error::Unroutable`], never vanish.
    pub(crate) fn publish_routed(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<()> {
        self.publish_intercepted(exchange, routing_key, message, true)?
            .wait()
    }

    fn publish_intercepted(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
        mandatory: bool,
    ) -> Result<Ticket> {
        let interceptors = &self.inner.connection.shared.options.publish_interceptors;
        if interceptors.is_empty() {
            return self.publish_unintercepted(
                exchange,
                routing_key,
                message,
                mandatory,
                Vec::new(),
            );
        }
        let context = crate::intercept::PublishContext::new(exchange, routing_key, message);
        crate::intercept::run_publish(interceptors, context, &|c| {
            self.publish_unintercepted(
                &c.exchange,
                &c.routing_key,
                c.message,
                mandatory,
                c.answered,
            )
        })
    }

    /// [`publish`](Self::publish) without the connection's publish interceptors: a consumer's
    /// retry, dead-letter and parked copies.
    pub(crate) fn publish_copy(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
    ) -> Result<()> {
        // A copy must reach its queue or come back: mandatory whatever the options say.
        self.publish_unintercepted(exchange, routing_key, message, true, Vec::new())?
            .wait()
    }

    /// Refuses a copy for `routing_key` that is held now and published later (a retry waiting
    /// in the consumer) when its header frame may not fit the connection's frame limit then:
    /// [`Error::FrameTooLarge`], as its publish would be.
    pub(crate) fn check_held_copy(&self, routing_key: &str, copy: &Message) -> Result<()> {
        let connection = &self.inner.connection;
        frame::check_held_copy_fits(
            copy,
            routing_key,
            connection.origin(),
            connection.frame_max(),
        )
    }

    /// The hand-over itself (after the interceptors, if any); `answered`: the interceptors'
    /// listeners for the broker's answer.
    fn publish_unintercepted(
        &self,
        exchange: &str,
        routing_key: &str,
        message: Message,
        mandatory: bool,
        answered: Vec<crate::intercept::AnswerListener>,
    ) -> Result<Ticket> {
        self.publish_deferred_inner(exchange, routing_key, message, mandatory, answered)
            .map_err(|e| blocked_or(&self.inner.connection.shared.blocked, e))
    }

    /// True while the broker blocks publishing on this publisher's connection (see
    /// [`Connection::is_blocked`](crate::Connection::is_blocked)).
    pub fn is_blocked(&self) -> bool {
        self.inner.connection.is_blocked()
    }

    fn publish_deferred_inner(
        &self,
        exchange: &str,
        routing_key: &str,
        mut message: Message,
        mandatory: bool,
        answered: Vec<crate::intercept::AnswerListener>,
    ) -> Result<Ticket> {
        let mut span = prepare(exchange, routing_key, &mut message)?;
        let connection = &self.inner.connection;
        let fits = check_message_fits(
            &message,
            routing_key,
            connection.origin(),
            connection.frame_max(),
        );
        if let Err(e) = fits {
            span.end(Err(&e));
            return Err(e);
        }
        let timeout = self.inner.options.timeout;
        let deadline = Instant::now() + timeout;
        let bytes = self.reserve_bytes(&message, deadline)?;
        let (tx, rx) = oneshot::channel();
        let pending = Pending {
            _bytes: Some(bytes),
            message_id: message.envelope.id.clone(),
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            returned: None,
            reply: tx,
            answered,
        };
        if let Err(e) = self.hand_over(
            exchange,
            routing_key,
            &message,
            pending,
            mandatory,
            deadline,
        ) {
            span.end(Err(&e));
            return Err(e);
        }
        Ok(Ticket {
            reply: rx,
            message_id: message.envelope.id,
            deadline,
            timeout,
            span,
            blocked: self.inner.connection.shared.blocked.clone(),
        })
    }

    /// Reserves the message's bytes among the connection's unconfirmed bytes, waiting for room
    /// up to `deadline`.
    fn reserve_bytes(&self, message: &Message, deadline: Instant) -> Result<Reservation> {
        // The body and a generous allowance for the frame and header overhead.
        let size = message.body.len().saturating_add(4096);
        self.inner
            .connection
            .budget()
            .reserve(size, deadline)
            .ok_or_else(|| Error::Timeout {
                what: "room among the connection's unconfirmed bytes (the broker is not \
                       taking them: blocked, or a stalled connection)"
                    .into(),
                after: self.inner.options.timeout,
            })
    }

    /// Waits (up to `deadline`) for room in the window and for a channel, opening one when
    /// there is none; returns the locked state with a current channel.
    fn room_and_channel(&self, deadline: Instant) -> Result<MutexGuard<'_, State>> {
        let shared = &self.inner.shared;
        let mut state = shared.state.lock();
        loop {
            if state.closed {
                return Err(Error::Closed { what: "publisher" });
            }
            if state.pending.len() >= self.inner.options.window {
                if shared.room.wait_until(&mut state, deadline).timed_out() {
                    return Err(Error::Timeout {
                        what: "room in the publisher's window".into(),
                        after: self.inner.options.timeout,
                    });
                }
                continue;
            }
            if state.current.is_none() {
                drop(state);
                self.open_channel(deadline)?;
                state = shared.state.lock();
                continue;
            }
            return Ok(state);
        }
    }

    /// Numbers the message, hands its frames to amiquip and records it as pending. When the
    /// channel turns out to be gone (nothing was handed over), fails what was in flight on it
    /// and either reports (the broker closed the channel over this publish: a missing exchange)
    /// or tries again on a new channel until `deadline`.
    fn hand_over(
        &self,
        exchange: &str,
        routing_key: &str,
        message: &Message,
        pending: Pending,
        mandatory: bool,
        deadline: Instant,
    ) -> Result<()> {
        let shared = &self.inner.shared;
        let origin = Some(self.inner.connection.origin());
        let mut properties = Some(message.to_properties(routing_key, origin));
        let mut pending = Some(pending);
        loop {
            let (sender, epoch) = {
                let state = self.room_and_channel(deadline)?;
                match state.current.as_ref() {
                    Some(current) => (current.channel.clone(), state.epoch),
                    None => continue,
                }
            };
            // Publishes on one channel go out one at a time, in the order they are numbered.
            let Some(mut channel) = sender.try_lock_until(deadline) else {
                return Err(Error::Timeout {
                    what: "the publisher's channel (a publish before this one is still being \
                           handed over: the broker is not reading?)"
                        .into(),
                    after: self.inner.options.timeout,
                });
            };
            let tag = {
                let mut state = shared.state.lock();
                if state.closed {
                    return Err(Error::Closed { what: "publisher" });
                }
                let full = state.pending.len() >= self.inner.options.window;
                let same = state.epoch == epoch && channel.is_some();
                match state.current.as_mut() {
                    Some(current) if same && !full => {
                        let tag = current.next_tag;
                        current.next_tag += 1;
                        if let Some(p) = pending.take() {
                            state.pending.insert(tag, p);
                        }
                        tag
                    }
                    // Replaced, broken or full meanwhile: again from the top.
                    _ => continue,
                }
            };
            let publish = Publish {
                body: &message.body,
                routing_key: routing_key.to_string(),
                mandatory,
                immediate: false,
                properties: properties
                    .take()
                    .unwrap_or_else(|| message.to_properties(routing_key, origin)),
            };
            let sent = match channel.as_ref() {
                Some(c) => c.basic_publish(exchange, publish),
                None => Err(amiquip::Error::EventLoopDropped),
            };
            let Err(e) = sent else {
                return Ok(());
            };
            // Nothing was handed over: the channel is gone. Learn why (outside the state lock:
            // amiquip reports the broker's reason on the channel's close), fail what was in
            // flight on it, and take this publish back to try again on a new channel.
            let broken = channel.take();
            drop(channel);
            let failure = channel_failure(broken, e);
            let mut state = shared.state.lock();
            pending = state.pending.remove(&tag);
            if state.epoch == epoch {
                state.current = None;
                fail_all(&mut state, &shared.observer, |p| {
                    failure.error_for(&p.exchange)
                });
                shared.room.notify_all();
            }
            drop(state);
            if let err @ Error::NotFound { .. } = failure.error_for(exchange) {
                shared.observer.published(exchange, PublishOutcome::Failed);
                return Err(err);
            }
            if pending.is_none() || Instant::now() >= deadline {
                // (Without `pending`, it was failed already, by the confirm thread.)
                return Err(Error::ConnectionLost {
                    context: format!("publishing message {:?}", message.envelope.id),
                });
            }
        }
    }

    /// Opens a confirm-mode channel on the current link and installs it, unless another caller
    /// got there first.
    fn open_channel(&self, deadline: Instant) -> Result<()> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let link = self.inner.connection.link(wait)?;
        let wait = deadline.saturating_duration_since(Instant::now());
        let channel = link.open_channel_within(wait)?;
        let setup = || -> std::result::Result<_, amiquip::Error> {
            let returns = channel.listen_for_returns()?;
            let confirms = channel.listen_for_publisher_confirms()?;
            channel.enable_publisher_confirms()?;
            Ok((confirms, returns))
        };
        let (confirms, returns) =
            setup().map_err(|e| Error::amqp("opening the publisher's channel", e))?;
        let shared = &self.inner.shared;
        let mut state = shared.state.lock();
        if state.closed {
            return Err(Error::Closed { what: "publisher" });
        }
        if state.current.is_some() {
            return Ok(()); // another caller installed one; ours is closed on drop
        }
        fail_all(&mut state, &shared.observer, |_| Error::ConnectionLost {
            context: "waiting for a publish confirm".into(),
        });
        state.epoch += 1;
        state.current = Some(Current {
            channel: Arc::new(Mutex::new(Some(channel))),
            next_tag: 1,
        });
        let _ = self.inner.control.send(Control::Channel {
            epoch: state.epoch,
            confirms,
            returns,
        });
        Ok(())
    }

    /// Publishes awaiting a confirm.
    pub fn in_flight(&self) -> usize {
        self.inner.shared.state.lock().pending.len()
    }

    /// Waits for every pending publish to be answered (up to the publisher's timeout), then
    /// closes the channel and stops the confirm thread. Other clones fail with
    /// [`Error::Closed`] afterwards.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when publishes were still unanswered (they are failed with
    /// [`Error::Closed`]); the channel's close error.
    pub fn close(&self) -> Result<()> {
        let shared = &self.inner.shared;
        let deadline = Instant::now() + self.inner.options.timeout;
        let mut state = shared.state.lock();
        state.closed = true;
        while !state.pending.is_empty() {
            if shared.room.wait_until(&mut state, deadline).timed_out() {
                break;
            }
        }
        let unanswered = state.pending.len();
        fail_all(&mut state, &shared.observer, |_| Error::Closed {
            what: "publisher",
        });
        let current = state.current.take();
        drop(state);
        let _ = self.inner.control.send(Control::Stop);
        if let Some(h) = self.inner.thread.lock().take() {
            let _ = h.join();
        }
        if unanswered > 0 {
            return Err(Error::Timeout {
                what: format!("{unanswered} publish confirms before closing"),
                after: self.inner.options.timeout,
            });
        }
        // A publish stuck in amiquip (the broker not reading) holds the channel: it is then
        // closed with the connection.
        let channel = current.and_then(|c| {
            c.channel
                .try_lock_for(self.inner.options.timeout)
                .and_then(|mut c| c.take())
        });
        match channel {
            Some(c) => c
                .close()
                .map_err(|e| Error::amqp("closing the publisher's channel", e)),
            None => Ok(()),
        }
    }
}

/// Why a channel went away: the broker's close code and reason, when the broker closed it.
struct ChannelFailure {
    server: Option<(u16, String)>,
}

impl ChannelFailure {
    /// The error for a publish on a channel that went away. A publish to an exchange the broker
    /// said does not exist gets [`Error::NotFound`]; every other one was lost with the channel
    /// and may be tried again ([`Error::ConnectionLost`]).
    fn error_for(&self, exchange: &str) -> Error {
        match &self.server {
            Some((404, reason)) if reason.contains(&format!("exchange '{exchange}'")) => {
                Error::NotFound {
                    kind: "exchange",
                    name: exchange.to_string(),
                    reason: reason.clone(),
                }
            }
            Some((code, reason)) => Error::ConnectionLost {
                context: format!(
                    "waiting for a publish confirm: the broker closed the channel ({code} {reason})"
                ),
            },
            None => Error::ConnectionLost {
                context: "waiting for a publish confirm".into(),
            },
        }
    }
}

/// Publishes on `channel` without a publisher confirm — a request (its reply is its
/// confirmation), a reply to a transient reply queue — and reports it to `observer` as
/// [`PublishOutcome::Unconfirmed`] (or [`Failed`](PublishOutcome::Failed)), as the
/// [`Publisher`] reports its own publishes; a return of it is reported where it is read.
pub(crate) fn send_unconfirmed(
    channel: &amiquip::Channel,
    exchange: &str,
    publish: Publish<'_>,
    observer: &dyn Observer,
) -> std::result::Result<(), amiquip::Error> {
    let sent = channel.basic_publish(exchange, publish);
    let outcome = match sent {
        Ok(()) => PublishOutcome::Unconfirmed,
        Err(_) => PublishOutcome::Failed,
    };
    observer.published(exchange, outcome);
    sent
}

/// What every publish does before its frames are built: the names and headers checked, the
/// trace context stamped (with the `opentelemetry` feature, the `publish` span started).
pub(crate) fn prepare(
    exchange: &str,
    routing_key: &str,
    message: &mut Message,
) -> Result<crate::trace::PublishSpan> {
    check_name("exchange", exchange, true)?;
    check_name("routing key", routing_key, true)?;
    message.validate()?;
    Ok(crate::trace::stamp(message, exchange, routing_key))
}

/// Why the channel went away, from its error `e` or (amiquip reports the broker's reason on the
/// channel's next call) from closing `broken`. Never called under the state lock.
fn channel_failure(broken: Option<amiquip::Channel>, e: amiquip::Error) -> ChannelFailure {
    let server = |e: &amiquip::Error| match e {
        amiquip::Error::ServerClosedChannel { code, message, .. } => Some((*code, message.clone())),
        _ => None,
    };
    let mut found = server(&e);
    if found.is_none() {
        // amiquip reports the broker's reason on the channel's next call.
        if let Some(c) = broken {
            if let Err(e) = c.close() {
                found = server(&e);
            }
        }
    }
    ChannelFailure { server: found }
}

fn fail_all(state: &mut State, observer: &Arc<dyn Observer>, error: impl Fn(&Pending) -> Error) {
    for (_, p) in std::mem::take(&mut state.pending) {
        observer.published(&p.exchange, PublishOutcome::Failed);
        let failed = Err(error(&p));
        crate::intercept::tell_answered(p.answered, &failed);
        let _ = p.reply.send(failed);
    }
}

/// The confirm thread: matches confirms and returns to pending publishes.
fn confirm_loop(shared: &Shared, control: &Receiver<Control>) {
    let mut epoch = 0u64;
    let mut confirms: Receiver<Confirm> = never();
    let mut returns: Receiver<Return> = never();
    loop {
        select! {
            recv(control) -> msg => match msg {
                Ok(Control::Channel { epoch: e, confirms: c, returns: r }) => {
                    epoch = e;
                    confirms = c;
                    returns = r;
                }
                Ok(Control::Stop) | Err(_) => {
                    let mut state = shared.state.lock();
                    state.closed = true;
                    fail_all(&mut state, &shared.observer, |_| Error::Closed { what: "publisher" });
                    shared.room.notify_all();
                    return;
                }
            },
            recv(returns) -> r => match r {
                Ok(r) => mark_returned(shared, epoch, r),
                Err(_) => returns = never(),
            },
            recv(confirms) -> c => match c {
                Ok(confirm) => {
                    // Every confirm already queued, resolved under one lock. A return is queued
                    // before the ack of the same message: the returns are drained after the
                    // confirms taken, so each of those confirms finds its return marked.
                    let mut batch = vec![confirm];
                    while batch.len() < CONFIRM_BATCH {
                        match confirms.try_recv() {
                            Ok(c) => batch.push(c),
                            Err(_) => break,
                        }
                    }
                    while let Ok(r) = returns.try_recv() {
                        mark_returned(shared, epoch, r);
                    }
                    resolve(shared, epoch, batch);
                }
                Err(_) => {
                    confirms = never();
                    returns = never();
                    // The channel is gone: taken out under the state lock, closed (to learn the
                    // broker's reason) outside it.
                    let broken = {
                        let mut state = shared.state.lock();
                        if state.epoch == epoch {
                            state.current.take()
                        } else {
                            None
                        }
                    };
                    if let Some(current) = broken {
                        let channel = current
                            .channel
                            .try_lock_for(CHANNEL_FAILURE_WAIT)
                            .and_then(|mut c| c.take());
                        let failure = channel_failure(channel, amiquip::Error::EventLoopDropped);
                        let mut state = shared.state.lock();
                        // (A new channel installed meanwhile failed these already.)
                        if state.epoch == epoch {
                            fail_all(&mut state, &shared.observer, |p| {
                                failure.error_for(&p.exchange)
                            });
                            shared.room.notify_all();
                        }
                    }
                }
            },
        }
    }
}

fn mark_returned(shared: &Shared, epoch: u64, r: Return) {
    let mut state = shared.state.lock();
    if state.epoch != epoch {
        return;
    }
    // The same message may be pending more than once (one id, several routing keys): a return
    // belongs to the earliest pending publish of that id to that exchange and routing key (the
    // broker returns in publish order, before the ack of the same message).
    let id = r.properties.message_id().clone().unwrap_or_default();
    if let Some(p) = state.pending.values_mut().find(|p| {
        p.returned.is_none()
            && p.message_id == id
            && p.exchange == r.exchange
            && p.routing_key == r.routing_key
    }) {
        p.returned = Some((r.reply_code, r.reply_text));
    } else {
        log::warn!(
            "acemq: a return for message {id:?} to {:?} with routing key {:?} matched no \
             pending publish",
            r.exchange,
            r.routing_key
        );
    }
}

/// The most confirms the confirm thread resolves under one lock.
const CONFIRM_BATCH: usize = 256;

/// How long the confirm thread waits for a broken channel's lock (a publish failing on it) to
/// learn the broker's reason; past it the publishes are failed without it.
const CHANNEL_FAILURE_WAIT: Duration = Duration::from_secs(5);

fn resolve(shared: &Shared, epoch: u64, confirms: Vec<Confirm>) {
    let mut done = Vec::new();
    {
        let mut state = shared.state.lock();
        if state.epoch != epoch {
            return;
        }
        for confirm in confirms {
            let (payload, acked) = match confirm {
                Confirm::Ack(p) => (p, true),
                Confirm::Nack(p) => (p, false),
            };
            if payload.multiple {
                let rest = state.pending.split_off(&(payload.delivery_tag + 1));
                done.extend(
                    std::mem::replace(&mut state.pending, rest)
                        .into_values()
                        .map(|p| (p, acked)),
                );
            } else if let Some(p) = state.pending.remove(&payload.delivery_tag) {
                done.push((p, acked));
            }
        }
        shared.room.notify_all();
    }
    for (p, acked) in done {
        let (outcome, result) = match (acked, p.returned) {
            (true, None) => (PublishOutcome::Confirmed, Ok(())),
            (true, Some((reply_code, reply_text))) => (
                PublishOutcome::Unroutable,
                Err(Error::Unroutable {
                    exchange: p.exchange.clone(),
                    routing_key: p.routing_key,
                    message_id: p.message_id,
                    reply_code,
                    reply_text,
                }),
            ),
            (false, _) => (
                PublishOutcome::Nacked,
                Err(Error::Nacked {
                    message_id: p.message_id,
                }),
            ),
        };
        shared.observer.published(&p.exchange, outcome);
        crate::intercept::tell_answered(p.answered, &result);
        let _ = p.reply.send(result);
    }
}

/// A timeout while the broker blocks publishing is reported as [`Error::Blocked`].
pub(crate) fn blocked_or(blocked: &parking_lot::Mutex<Option<String>>, e: Error) -> Error {
    match e {
        Error::Timeout { after, .. } => match blocked.lock().clone() {
            Some(reason) => Error::Blocked { reason, after },
            None => e,
        },
        e => e,
    }
}
