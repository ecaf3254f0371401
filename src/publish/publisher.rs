//! The publisher handle: created from a connection, its publish calls (through the
//! connection's interceptors), and its close.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use serde::Serialize;

use super::confirms::confirm_loop;
use super::flush::flush_loop;
use super::frame;
use super::options::PublisherOptions;
use super::state::{fail_all, Control, Shared, State};
use crate::codec::Codec;
use crate::connection::Connection;
use crate::envelope::Message;
use crate::error::{Error, Result};
use crate::ticket::{blocked_or, Ticket};

/// Publishes with confirms — or, made with [`PublisherOptions::confirms`]`(false)`, without
/// them (at most once). `Clone + Send + Sync`: clones share one channel and its thread.
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
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.inner.shared.state.lock();
        f.debug_struct("Publisher")
            .field("confirms", &self.inner.options.confirms)
            .field("pending", &s.pending.len())
            .field("window", &self.inner.options.window)
            .finish()
    }
}

pub(super) struct Inner {
    pub(super) connection: Connection,
    pub(super) options: PublisherOptions,
    pub(super) codec: Arc<dyn Codec>,
    pub(super) shared: Arc<Shared>,
    pub(super) control: Sender<Control>,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
    /// Disconnects when the thread ends (its sender is dropped with it).
    pub(super) ended: Receiver<()>,
}

impl Drop for Inner {
    /// Stops the thread and waits for it, up to the publisher's timeout (an unconfirmed
    /// publisher's thread may be waiting in a round trip on a broker that does not read: it
    /// ends with the connection).
    fn drop(&mut self) {
        let _ = self.control.send(Control::Stop);
        join_within(
            &self.thread,
            &self.ended,
            Instant::now() + self.options.timeout,
        );
    }
}

/// Joins the publisher's thread if it ends by `deadline`; otherwise leaves it to end on its own
/// (with the connection) and says whether it did end.
fn join_within(
    thread: &Mutex<Option<JoinHandle<()>>>,
    ended: &Receiver<()>,
    deadline: Instant,
) -> bool {
    let Some(h) = thread.lock().take() else {
        return true;
    };
    match ended.recv_deadline(deadline) {
        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
            log::warn!(
                "acemq: the publisher's thread is still waiting on the broker; it ends with the \
                 connection"
            );
            false
        }
        _ => {
            let _ = h.join();
            true
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

    /// A publisher. Its channel is opened on the first publish. With
    /// [`PublisherOptions::confirms`]`(false)` it publishes without confirms (at most once).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a zero window; [`Error::Io`] if its thread cannot start.
    pub fn publisher_with(&self, options: PublisherOptions) -> Result<Publisher> {
        options.validate()?;
        let (kick_tx, kick_rx) = crossbeam_channel::bounded(1);
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                current: None,
                epoch: 0,
                pending: BTreeMap::new(),
                closed: false,
                missing: None,
            }),
            room: Condvar::new(),
            observer: self.observer().clone(),
            kick: kick_tx,
            wake: wake_tx,
            returned: AtomicU64::new(0),
        });
        let (control, control_rx) = crossbeam_channel::unbounded();
        let (ended_tx, ended) = crossbeam_channel::bounded::<()>(0);
        let thread_shared = shared.clone();
        let confirms = options.confirms;
        let thread = std::thread::Builder::new()
            .name(
                if confirms {
                    "acemq-confirms"
                } else {
                    "acemq-flush"
                }
                .into(),
            )
            .spawn(move || {
                let _ended = ended_tx;
                if confirms {
                    confirm_loop(&thread_shared, &control_rx)
                } else {
                    flush_loop(&thread_shared, &control_rx, &kick_rx, &wake_rx)
                }
            })
            .map_err(|e| Error::Io {
                context: "spawning the publisher's thread".into(),
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
                ended,
            }),
        })
    }
}

impl Publisher {
    /// Publishes and waits for the broker's answer — without [confirms](PublisherOptions::confirms),
    /// only until the message is handed over to be written (at most once).
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

    /// The connection's observer, which this publisher reports to.
    pub(crate) fn observer(&self) -> &Arc<dyn crate::observe::Observer> {
        &self.inner.shared.observer
    }

    /// Hands the message over and returns a [`Ticket`] for the answer, so a caller can publish a
    /// batch and wait once. Waits only for room in the window and, while the connection
    /// recovers, for a channel. Without [confirms](PublisherOptions::confirms) the ticket is
    /// answered already (`Ok`: handed over, not confirmed).
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
        self.confirmed_for("a pattern's next hop (a pipeline step, a routing slip's stop)")?;
        self.publish_intercepted(exchange, routing_key, message, true)?
            .wait()
    }

    /// Refuses `what` on a publisher without confirms: it needs to know the broker took the
    /// message before the original is settled (or before it reports).
    pub(super) fn confirmed_for(&self, what: &str) -> Result<()> {
        if self.inner.options.confirms {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "{what} needs a publisher with confirms; this one was made with \
             PublisherOptions::confirms(false) (at most once)"
        )))
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
        self.confirmed_for("a consumer's copy")?;
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

    /// Publishes awaiting a confirm (without [confirms](PublisherOptions::confirms): handed
    /// over and not yet known to have been read by the broker).
    pub fn in_flight(&self) -> usize {
        self.inner.shared.state.lock().pending.len()
    }

    /// Whether this publisher waits for confirms ([`PublisherOptions::confirms`]).
    pub fn confirms(&self) -> bool {
        self.inner.options.confirms
    }

    /// Mandatory publishes the broker returned as unroutable after they were handed over,
    /// since this publisher was made: counted only without
    /// [confirms](PublisherOptions::confirms), where no caller is left to tell (with confirms,
    /// each caller gets [`Error::Unroutable`] instead, and this stays 0).
    pub fn unroutable(&self) -> u64 {
        self.inner.shared.returned.load(Ordering::Relaxed)
    }

    /// Waits for every pending publish to be answered (up to the publisher's timeout), then
    /// closes the channel and stops the publisher's thread. Other clones fail with
    /// [`Error::Closed`] afterwards. Without [confirms](PublisherOptions::confirms), waits
    /// until the broker is known to have read every publish handed over (a round trip).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when publishes were still unanswered (they are failed with
    /// [`Error::Closed`]; unconfirmed ones are logged as possibly lost); the channel's close
    /// error.
    pub fn close(&self) -> Result<()> {
        let shared = &self.inner.shared;
        let deadline = Instant::now() + self.inner.options.timeout;
        let mut state = shared.state.lock();
        state.closed = true;
        if !self.inner.options.confirms {
            shared.kick();
        }
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
        join_within(&self.inner.thread, &self.inner.ended, deadline);
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

/// The publisher's codec ([`codec`](Publisher::codec)) for the calls that take a
/// [`CodecSource`](crate::CodecSource).
impl crate::CodecSource for Publisher {
    fn with_codec<R>(&self, f: impl FnOnce(&dyn Codec) -> R) -> R {
        f(self.codec().as_ref())
    }
}
