//! The connection handle: opening, the current link, its state, and closing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::budget::ByteBudget;
use super::connect::connect_any;
use super::link::Link;
use super::options::ConnectionOptions;
use super::shared::{Control, LinkState, Shared, Supervisor};
use super::supervisor::supervise;
use super::topology::Topology;
use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::observe::{ConnectionEvent, Observer};

/// A connection to RabbitMQ that recovers by itself. `Clone + Send + Sync`: clones share one
/// AMQP connection and one supervisor. Dropping the last clone without [`close`](Self::close)
/// closes the AMQP connection and joins the supervisor thread (waiting up to 5 s).
///
/// ```no_run
/// use acemq_amqp::{Connection, QueueSpec};
/// # fn main() -> acemq_amqp::Result<()> {
/// let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
/// connection.declare_queue(&QueueSpec::new("orders"))?;
/// connection.close()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Connection {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*self.shared.state.lock() {
            LinkState::Up(link) => {
                format!("up to {} (generation {})", link.address, link.generation)
            }
            LinkState::Down { last_error, .. } => format!("recovering ({last_error})"),
            LinkState::Closed => "closed".to_string(),
        };
        f.debug_struct("Connection")
            .field("state", &state)
            .field("options", &self.shared.options)
            .finish()
    }
}

impl Connection {
    /// Opens a connection to one address with default options.
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with).
    pub fn open(url: &str) -> Result<Connection> {
        Connection::open_with(ConnectionOptions::new().address(url))
    }

    /// Opens a connection: tries each address once, in order, and returns the first that
    /// answers. After that the supervisor keeps it up.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for bad options; [`Error::Connect`] naming the last address
    /// tried (never its password) when none could be reached.
    pub fn open_with(options: ConnectionOptions) -> Result<Connection> {
        let addresses = options.validate()?;
        let (amqp, blocked, address) = connect_any(&options, &addresses)?;
        let (control, control_rx) = crossbeam_channel::unbounded();
        let link = Arc::new(Link::new(1, &address, amqp, options.operation_timeout));
        options.observer.connection(&ConnectionEvent::Connected {
            address: &link.address,
            generation: 1,
        });
        let shared = Arc::new(Shared {
            origin: options.origin(),
            budget: ByteBudget::new(options.max_unconfirmed_bytes),
            options,
            addresses,
            state: Mutex::new(LinkState::Up(link.clone())),
            changed: Condvar::new(),
            topology: Mutex::new(Topology::default()),
            blocked: Arc::default(),
            control,
            health: super::health_state::HealthState::default(),
            supervisor: Mutex::new(None),
        });
        let weak = Arc::downgrade(&shared);
        let (ended_tx, ended) = crossbeam_channel::bounded::<()>(0);
        let handle = std::thread::Builder::new()
            .name("acemq-supervisor".into())
            .spawn(move || {
                let _ended = ended_tx; // dropped (disconnecting `ended`) when the thread ends
                supervise(weak, control_rx, link, blocked)
            })
            .map_err(|e| Error::Io {
                context: "spawning the supervisor thread".into(),
                source: e,
            })?;
        *shared.supervisor.lock() = Some(Supervisor { handle, ended });
        Ok(Connection { shared })
    }

    /// The current link, waiting up to `timeout` while the connection recovers.
    pub(crate) fn link(&self, timeout: Duration) -> Result<Arc<Link>> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.state.lock();
        loop {
            match &*state {
                LinkState::Up(link) => return Ok(link.clone()),
                LinkState::Closed => return Err(Error::Closed { what: "connection" }),
                LinkState::Down { .. } => {
                    if self
                        .shared
                        .changed
                        .wait_until(&mut state, deadline)
                        .timed_out()
                    {
                        let last_error = match &*state {
                            LinkState::Down { last_error } => last_error.clone(),
                            _ => continue,
                        };
                        let context = format!(
                            "waiting {timeout:?} for the connection to recover (last error: {last_error})"
                        );
                        return Err(Error::ConnectionLost { context });
                    }
                }
            }
        }
    }

    /// Opens a channel on the current link, waiting up to the operation timeout for recovery.
    pub(crate) fn open_channel(&self) -> Result<(crate::transport::Channel, Arc<Link>)> {
        let link = self.link(self.shared.options.operation_timeout)?;
        let channel = link.open_channel()?;
        Ok((channel, link))
    }

    /// The generation of the current link (1 for the first connection, +1 per recovery), or
    /// `None` while recovering or after close.
    pub fn generation(&self) -> Option<u64> {
        match &*self.shared.state.lock() {
            LinkState::Up(link) => Some(link.generation),
            _ => None,
        }
    }

    /// True while the broker blocks publishing on this connection (`connection.blocked`: a
    /// memory or disk alarm). Publishes wait meanwhile and, past their timeout, fail with
    /// [`Error::Blocked`]; the observer hears of it as
    /// [`ConnectionEvent::Blocked`] and `Unblocked`.
    pub fn is_blocked(&self) -> bool {
        self.shared.blocked.lock().is_some()
    }

    /// The broker's reason while it blocks publishing (e.g. `low on memory`).
    pub fn blocked_reason(&self) -> Option<String> {
        self.shared.blocked.lock().clone()
    }

    /// True while connected.
    pub fn is_connected(&self) -> bool {
        self.generation().is_some()
    }

    /// Waits until connected, up to `timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::ConnectionLost`] when still recovering after `timeout`; [`Error::Closed`].
    pub fn wait_connected(&self, timeout: Duration) -> Result<()> {
        self.link(timeout).map(|_| ())
    }

    /// Takes one message from `queue` (`basic.get`) and acknowledges it once it is read, or
    /// `None` when the queue is empty. Meant for tools and tests; services should consume.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when there is no such queue; [`Error::ConnectionLost`].
    pub fn get(&self, queue: &str) -> Result<Option<crate::Message>> {
        crate::envelope::check_name("queue", queue, false)?;
        let (channel, _link) = self.open_channel()?;
        let got = channel
            .basic_get(queue, false)
            .map_err(|e| Error::from_amqp_on("queue", queue, "getting from", e))?;
        let Some(got) = got else {
            let _ = channel.close();
            return Ok(None);
        };
        let mut delivery = got.delivery;
        let message = delivery.take_message();
        delivery
            .ack(&channel)
            .map_err(|e| Error::amqp(format!("acknowledging a message from {queue:?}"), e))?;
        let _ = channel.close();
        Ok(Some(message))
    }

    /// The connection's default codec.
    pub fn codec(&self) -> Arc<dyn Codec> {
        self.shared.options.codec.clone()
    }

    /// `service@host`: the `x-acemq-origin` stamped on messages published through this
    /// connection that carry no origin of their own.
    pub fn origin(&self) -> &str {
        &self.shared.origin
    }

    /// The broker's version as it announced it when this connection (or its latest reconnect)
    /// was made — RabbitMQ's `version` server property, e.g. `"4.0.5"` — or `None` while the
    /// connection is down or when the broker did not say. On `memory://`, the RabbitMQ version
    /// the in-process broker follows.
    pub fn broker_version(&self) -> Option<String> {
        match &*self.shared.state.lock() {
            LinkState::Up(link) => link.broker_version.clone(),
            _ => None,
        }
    }

    /// What the transport of the current link can do (`/acemq-info`'s `transport`), or `None`
    /// while the connection is down.
    pub fn capabilities(&self) -> Option<crate::transport::Capabilities> {
        match &*self.shared.state.lock() {
            LinkState::Up(link) => Some(link.capabilities),
            _ => None,
        }
    }

    /// The broker's major version (`4` for RabbitMQ 4.0.5), from [`broker_version`](Self::broker_version).
    pub fn broker_major(&self) -> Option<u32> {
        self.broker_version()?.split('.').next()?.parse().ok()
    }

    /// The largest frame this connection sends, in bytes: the `frame_max` it asked for in the
    /// handshake ([`ConnectionOptions::frame_max`], 131,072 by default), which the broker
    /// lowers only when its own limit is lower. A message's header frame (properties and
    /// header table) must fit in one frame; publishes are checked against this before anything
    /// is sent.
    pub fn frame_max(&self) -> usize {
        usize::try_from(self.shared.options.frame_max).unwrap_or(usize::MAX)
    }

    /// The broker's "now" in ms since the epoch: the system clock, and on `memory://` the
    /// in-process broker's clock (which `testing::MemoryBroker::advance_clock` moves on), so a
    /// scheduler's due times and the broker's TTLs agree.
    pub(crate) fn now_ms(&self) -> i64 {
        let offset = self
            .shared
            .addresses
            .first()
            .map_or(0, crate::transport::clock_offset_ms);
        crate::envelope::now_ms().saturating_add(offset)
    }

    pub(crate) fn budget(&self) -> &Arc<ByteBudget> {
        &self.shared.budget
    }

    pub(crate) fn observer(&self) -> &Arc<dyn Observer> {
        &self.shared.options.observer
    }

    /// Closes the AMQP connection and joins the supervisor. Every clone is closed with it:
    /// publishers and consumers on it fail with [`Error::Closed`] or
    /// [`Error::ConnectionLost`]. Closing twice is harmless.
    ///
    /// A channel open under way (a stalled link) is waited for up to the operation timeout;
    /// past it, close returns [`Error::Timeout`] and that open closes the AMQP connection when
    /// it returns. The supervisor is joined within the operation timeout too.
    ///
    /// # Errors
    ///
    /// The error amiquip reported when closing the AMQP connection; [`Error::Timeout`] as
    /// above.
    pub fn close(&self) -> Result<()> {
        let previous = std::mem::replace(&mut *self.shared.state.lock(), LinkState::Closed);
        self.shared.changed.notify_all();
        let timeout = self.shared.options.operation_timeout;
        let deadline = Instant::now() + timeout;
        // Close the AMQP connection here, to return its error; the supervisor then sees the I/O
        // thread end, finds the state Closed and returns.
        let result = match previous {
            LinkState::Up(link) => link.close_within(deadline, timeout),
            _ => Ok(()),
        };
        let _ = self.shared.control.send(Control::Close);
        self.shared.join_supervisor(deadline);
        result
    }
}

/// The connection's codec ([`codec`](Connection::codec)) for `record(&connection, …)` and the
/// other calls that take a [`CodecSource`](crate::CodecSource).
impl crate::CodecSource for Connection {
    fn with_codec<R>(&self, f: impl FnOnce(&dyn Codec) -> R) -> R {
        f(self.codec().as_ref())
    }
}
