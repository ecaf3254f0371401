//! The connection: a cloneable handle over one amiquip connection at a time, kept alive by a
//! supervisor thread.
//!
//! # Threads
//!
//! * amiquip's I/O thread, one per live amiquip connection.
//! * The **supervisor** thread (`acemq-supervisor`), one per [`Connection`]: it watches the
//!   amiquip connection (its connection-blocked listener disconnects when the I/O thread ends),
//!   and when it drops it closes it to learn the cause, reconnects with capped exponential
//!   backoff and jitter across the addresses, re-declares the remembered topology, and publishes
//!   the new link with a generation one higher. It holds only a `Weak` reference and ends when
//!   the connection is closed or the last handle is dropped; either way it is joined, with a
//!   deadline (the operation timeout for [`Connection::close`], at most 5 s when the last
//!   handle is dropped), and left to end by itself past it (logged).
//!
//! * A channel open is a round trip amiquip does not bound, made under the link's lock
//!   (amiquip's `open_channel` takes the connection `&mut`), so it runs on a short-lived thread
//!   of its own (`acemq-channel-open`), and its caller waits for it with a deadline (the
//!   operation timeout, or a publish's own): past it the caller gets [`Error::ConnectionLost`]
//!   and a channel opened later is closed by that thread. The lock is only ever waited for with
//!   a deadline too: a second open behind a hung one fails on time, and [`Connection::close`]
//!   gives up on it after the operation timeout, leaving the hung open to close the AMQP
//!   connection when it returns.
//!
//! Publishers and consumers ask for the current link (waiting while it
//! recovers), open their own channels on it, and remember its generation; a failure on their
//! channel sends them back here for the next link.

mod budget;
mod options;
mod topology;

pub(crate) use budget::{ByteBudget, Reservation};
pub use options::{Address, ConnectionOptions};
pub(crate) use topology::{declare_queue_on, to_table};
pub use topology::{
    Binding, ExchangeKind, ExchangeSpec, QueueInfo, QueueKind, QueueSpec, TopologyDifference,
};

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use amiquip::{Auth, ConnectionBlockedNotification, ConnectionTuning};
use crossbeam_channel::{select, Receiver, Sender};
use parking_lot::{Condvar, Mutex};

use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::observe::{ConnectionEvent, Observer};
use topology::Topology;

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

pub(crate) struct Shared {
    pub(crate) options: ConnectionOptions,
    /// `service@host`, stamped as `x-acemq-origin` on what this connection publishes.
    pub(crate) origin: String,
    /// The bytes its publishers have handed over and not yet had answered.
    pub(crate) budget: Arc<ByteBudget>,
    addresses: Vec<Address>,
    state: Mutex<LinkState>,
    changed: Condvar,
    pub(crate) topology: Mutex<Topology>,
    /// What the broker said when it blocked publishing (`connection.blocked`), until it
    /// unblocks or the link is replaced.
    pub(crate) blocked: Arc<Mutex<Option<String>>>,
    control: Sender<Control>,
    supervisor: Mutex<Option<Supervisor>>,
}

/// The supervisor thread, and a receiver that disconnects when it ends (so that it can be
/// joined with a deadline).
struct Supervisor {
    handle: JoinHandle<()>,
    ended: Receiver<()>,
}

/// How long dropping the last [`Connection`] handle waits for the supervisor to close the AMQP
/// connection and end: 5 s (or the operation timeout, if shorter).
const SUPERVISOR_DROP_JOIN: Duration = Duration::from_secs(5);

impl Shared {
    /// Joins the supervisor thread, waiting up to `deadline` for it to end; past it (or when
    /// called on the supervisor thread itself, which may drop the last handle) it is left to
    /// end by itself.
    fn join_supervisor(&self, deadline: Instant) {
        let Some(s) = self.supervisor.lock().take() else {
            return;
        };
        if s.handle.thread().id() == std::thread::current().id() {
            return; // it returns once this drop is over
        }
        match s.ended.recv_deadline(deadline) {
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                if s.handle.join().is_err() {
                    log::error!("acemq: the supervisor thread panicked");
                }
            }
            _ => log::warn!(
                "acemq: the supervisor thread did not end in time (closing the AMQP connection \
                 takes long: a stalled link?); it ends by itself"
            ),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The supervisor holds only a Weak: tell it to close the AMQP connection and end, and
        // join it (with a deadline).
        let _ = self.control.send(Control::Close);
        let wait = SUPERVISOR_DROP_JOIN.min(self.options.operation_timeout);
        self.join_supervisor(Instant::now() + wait);
    }
}

enum Control {
    Close,
}

enum LinkState {
    Up(Arc<Link>),
    Down { last_error: String },
    Closed,
}

/// One live amiquip connection, with the generation it was made in.
pub(crate) struct Link {
    pub(crate) generation: u64,
    pub(crate) address: String,
    /// The AMQP connection and what a channel open needs of the link, shared with the threads
    /// that make the opens.
    opener: Arc<Opener>,
    /// How long a channel open waits: the operation timeout.
    open_wait: Duration,
}

/// The AMQP connection, held across a channel open (amiquip takes it `&mut`) by the thread that
/// makes it; only ever waited for with a deadline.
struct Opener {
    address: String,
    amqp: Mutex<Option<amiquip::Connection>>,
    /// The connection was closed while a channel open held `amqp`: that open closes the AMQP
    /// connection when it returns.
    closing: AtomicBool,
}

impl Opener {
    /// Opens a channel, waiting up to `deadline` for another open to finish.
    fn open(&self, deadline: Instant, wait: Duration) -> Result<amiquip::Channel> {
        let Some(mut amqp) = self.amqp.try_lock_until(deadline) else {
            return Err(Error::ConnectionLost {
                context: format!(
                    "opening a channel: another channel open on this connection has not been \
                     answered in {wait:?} (a stalled connection?)"
                ),
            });
        };
        let opened = match amqp.as_mut() {
            Some(c) => c
                .open_channel(None)
                .map_err(|e| Error::amqp("opening a channel", e)),
            None => Err(Error::ConnectionLost {
                context: "opening a channel".into(),
            }),
        };
        if self.closing.load(Ordering::SeqCst) {
            // Closed while this open was under way: closing the AMQP connection fell to it.
            let taken = amqp.take();
            drop(amqp);
            if let Some(c) = taken {
                if let Err(e) = c.close() {
                    log::debug!("acemq: closing the connection to {}: {e}", self.address);
                }
            }
            drop(opened);
            return Err(Error::Closed { what: "connection" });
        }
        opened
    }
}

impl Link {
    fn new(
        generation: u64,
        address: &Address,
        amqp: amiquip::Connection,
        open_wait: Duration,
    ) -> Link {
        Link {
            generation,
            address: address.to_string(),
            opener: Arc::new(Opener {
                address: address.to_string(),
                amqp: Mutex::new(Some(amqp)),
                closing: AtomicBool::new(false),
            }),
            open_wait,
        }
    }

    /// Opens a channel on this link, within the operation timeout.
    pub(crate) fn open_channel(&self) -> Result<amiquip::Channel> {
        self.open_channel_within(self.open_wait)
    }

    /// Opens a channel on this link, within `wait`. amiquip's open is a round trip it does not
    /// bound (on a stalled link it returns when the heartbeats give up; under a memory alarm the
    /// broker does not read it at all), so it is made on a thread of its own
    /// (`acemq-channel-open`): past `wait` the caller gets [`Error::ConnectionLost`], and a
    /// channel opened after that is closed by that thread.
    pub(crate) fn open_channel_within(&self, wait: Duration) -> Result<amiquip::Channel> {
        let deadline = Instant::now() + wait;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let opener = self.opener.clone();
        let spawned = std::thread::Builder::new()
            .name("acemq-channel-open".into())
            .spawn(move || {
                let opened = opener.open(deadline, wait);
                // Nobody waits for it any more: the channel is closed (dropped) here.
                drop(tx.send(opened));
            });
        if let Err(e) = spawned {
            log::debug!("acemq: no thread for a channel open ({e}); opening on this one");
            return self.opener.open(deadline, wait);
        }
        match rx.recv_deadline(deadline) {
            Ok(opened) => opened,
            Err(_) => Err(Error::ConnectionLost {
                context: format!(
                    "opening a channel: not answered in {wait:?} (a stalled or blocked \
                     connection?)"
                ),
            }),
        }
    }

    /// Closes the AMQP connection, waiting up to `deadline` for a channel open under way;
    /// past it, that open closes the connection when it returns.
    fn close_within(&self, deadline: Instant, timeout: Duration) -> Result<()> {
        self.opener.closing.store(true, Ordering::SeqCst);
        let Some(mut amqp) = self.opener.amqp.try_lock_until(deadline) else {
            return Err(Error::Timeout {
                what: "a channel open on the connection to finish before closing it (it closes \
                       the AMQP connection when it returns)"
                    .into(),
                after: timeout,
            });
        };
        let taken = amqp.take();
        drop(amqp);
        match taken {
            Some(c) => c
                .close()
                .map_err(|e| Error::amqp("closing the connection", e)),
            None => Ok(()),
        }
    }
}

impl Connection {
    /// Opens a connection to one address with default options.
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with).
    pub fn open(url: &str) -> Result<Connection> {
        ConnectionOptions::new().address(url).open()
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
    pub(crate) fn open_channel(&self) -> Result<(amiquip::Channel, Arc<Link>)> {
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
        let message = crate::Message::take_delivery(&mut delivery);
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

    /// The largest frame this connection sends, in bytes: the `frame_max` it asked for in the
    /// handshake ([`ConnectionOptions::frame_max`], 131,072 by default), which the broker
    /// lowers only when its own limit is lower. A message's header frame (properties and
    /// header table) must fit in one frame; publishes are checked against this before anything
    /// is sent.
    pub fn frame_max(&self) -> usize {
        usize::try_from(self.shared.options.frame_max).unwrap_or(usize::MAX)
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

/// Tries each address once, in order.
fn connect_any(
    options: &ConnectionOptions,
    addresses: &[Address],
) -> Result<(
    amiquip::Connection,
    Receiver<ConnectionBlockedNotification>,
    Address,
)> {
    let mut last = None;
    for address in addresses {
        match connect_one(options, address) {
            Ok((c, b)) => return Ok((c, b, address.clone())),
            Err(e) => {
                log::debug!("acemq: connecting to {address} failed: {e}");
                last = Some((address, e));
            }
        }
    }
    match last {
        Some((address, source)) => Err(Error::Connect {
            address: address.to_string(),
            source,
        }),
        None => Err(Error::invalid("no broker address given")),
    }
}

fn connect_one(
    options: &ConnectionOptions,
    address: &Address,
) -> std::result::Result<
    (amiquip::Connection, Receiver<ConnectionBlockedNotification>),
    crate::error::BoxError,
> {
    let socket_addrs: Vec<SocketAddr> = (address.host.as_str(), address.port)
        .to_socket_addrs()?
        .collect();
    let mut last: Option<std::io::Error> = None;
    let mut stream = None;
    for sa in socket_addrs {
        match std::net::TcpStream::connect_timeout(&sa, options.connect_timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let stream = match stream {
        Some(s) => s,
        None => {
            return Err(last
                .map(Into::into)
                .unwrap_or_else(|| "the host resolved to no address".into()))
        }
    };
    // amiquip's own URL opener leaves Nagle on: a publish that waits for its confirm then takes
    // ~25 ms instead of well under one.
    stream.set_nodelay(true)?;
    let stream = mio::net::TcpStream::from_stream(stream)?;
    let heartbeat = u16::try_from(options.heartbeat.as_secs()).unwrap_or(u16::MAX);
    let (username, password) = match &options.credentials {
        // Asked now, at each connect: a rotated secret is picked up by the next reconnect.
        Some(source) => {
            let c = source.credentials()?;
            (c.username().to_string(), c.secret().to_string())
        }
        None => (address.user.clone(), address.password.clone()),
    };
    let amqp_options = amiquip::ConnectionOptions::<Auth>::default()
        .auth(Auth::Plain { username, password })
        .virtual_host(address.vhost.clone())
        .heartbeat(heartbeat)
        .channel_max(options.channel_max)
        .frame_max(options.frame_max)
        .connection_timeout(Some(options.connect_timeout))
        .information(options.name.clone());
    let mut conn = {
        let _quiet = HandshakeLogGuard::enter();
        open_stream(options, address, stream, amqp_options)?
    };
    let blocked = conn.listen_for_connection_blocked()?;
    Ok((conn, blocked))
}

/// amiquip 0.4 logs the `connection.start-ok` it sends — the SASL response with the password in
/// it — at debug level. While any handshake is under way, the `log` crate's maximum level is
/// held at `Info`, then restored when the last handshake ends.
struct HandshakeLogGuard;

static HANDSHAKES: Mutex<(usize, Option<log::LevelFilter>)> = Mutex::new((0, None));

impl HandshakeLogGuard {
    fn enter() -> HandshakeLogGuard {
        let mut h = HANDSHAKES.lock();
        if h.0 == 0 {
            let level = log::max_level();
            if level > log::LevelFilter::Info {
                h.1 = Some(level);
                log::set_max_level(log::LevelFilter::Info);
            }
        }
        h.0 += 1;
        HandshakeLogGuard
    }
}

impl Drop for HandshakeLogGuard {
    fn drop(&mut self) {
        let mut h = HANDSHAKES.lock();
        h.0 -= 1;
        if h.0 == 0 {
            if let Some(level) = h.1.take() {
                log::set_max_level(level);
            }
        }
    }
}

#[cfg(not(feature = "tls"))]
fn open_stream(
    ours: &ConnectionOptions,
    _address: &Address,
    stream: mio::net::TcpStream,
    options: amiquip::ConnectionOptions<Auth>,
) -> std::result::Result<amiquip::Connection, crate::error::BoxError> {
    Ok(amiquip::Connection::insecure_open_stream(
        stream,
        options,
        tuning(ours),
    )?)
}

#[cfg(feature = "tls")]
fn open_stream(
    ours: &ConnectionOptions,
    address: &Address,
    stream: mio::net::TcpStream,
    options: amiquip::ConnectionOptions<Auth>,
) -> std::result::Result<amiquip::Connection, crate::error::BoxError> {
    if address.tls {
        let mut builder = native_tls::TlsConnector::builder();
        for pem in &ours.tls_roots {
            builder.add_root_certificate(native_tls::Certificate::from_pem(pem)?);
        }
        let connector = builder.build()?;
        Ok(amiquip::Connection::open_tls_stream(
            connector,
            &address.host,
            stream,
            options,
            tuning(ours),
        )?)
    } else {
        Ok(amiquip::Connection::insecure_open_stream(
            stream,
            options,
            tuning(ours),
        )?)
    }
}

/// amiquip's tuning: its I/O thread keeps taking frames (never blocking a publishing thread) up
/// to well above what this connection's publishers may leave unconfirmed.
fn tuning(ours: &ConnectionOptions) -> ConnectionTuning {
    let high_water = (16usize << 20).max(ours.max_unconfirmed_bytes.saturating_mul(2));
    ConnectionTuning::default().buffered_writes_high_water(high_water)
}

/// The capped exponential backoff with jitter for reconnect attempt `attempt` (from 1): a delay
/// drawn between half and all of `min * 2^(attempt-1)`, capped at `max`.
pub(crate) fn backoff(min: Duration, max: Duration, attempt: u32) -> Duration {
    let exp = min.saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
    let full = exp.min(max);
    let half = full / 2;
    let jitter_ns = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
    let r = crate::envelope::random_u64() % jitter_ns.max(1);
    half + Duration::from_nanos(r)
}

/// The supervisor thread's body: watch, recover, repeat.
fn supervise(
    weak: Weak<Shared>,
    control: Receiver<Control>,
    mut link: Arc<Link>,
    mut blocked: Receiver<ConnectionBlockedNotification>,
) {
    loop {
        let Some((observer, state)) = weak
            .upgrade()
            .map(|s| (s.options.observer.clone(), s.blocked.clone()))
        else {
            return;
        };
        let watched = watch(&control, &blocked, &state, observer.as_ref());
        // A new link starts unblocked (the broker says again if the alarm holds).
        *state.lock() = None;
        if let Watched::Closing = watched {
            close_link(&link);
            return;
        }
        // The I/O thread has ended: close to learn why.
        let reason = match link.opener.amqp.lock().take() {
            Some(amqp) => match amqp.close() {
                Ok(()) => "closed".to_string(),
                Err(e) => e.to_string(),
            },
            None => "closed".to_string(),
        };
        match weak.upgrade() {
            Some(shared) if set_down(&shared, &reason) => {}
            _ => return,
        }
        observer.connection(&ConnectionEvent::Lost {
            address: &link.address,
            reason: &reason,
        });
        match reconnect(&weak, &control, link.generation + 1, observer.as_ref()) {
            Some((new, b)) => {
                link = new;
                blocked = b;
            }
            None => return,
        }
    }
}

/// How watching a live link ended.
enum Watched {
    /// The I/O thread ended (the connection dropped).
    Dropped,
    /// [`Connection::close`] was called.
    Closing,
}

/// Watches a live link, reporting the broker's blocked/unblocked notices, until its I/O thread
/// ends or the connection is closed.
fn watch(
    control: &Receiver<Control>,
    blocked: &Receiver<ConnectionBlockedNotification>,
    state: &Mutex<Option<String>>,
    observer: &dyn Observer,
) -> Watched {
    loop {
        select! {
            recv(blocked) -> note => match note {
                Ok(ConnectionBlockedNotification::Blocked(reason)) => {
                    *state.lock() = Some(reason.clone());
                    observer.connection(&ConnectionEvent::Blocked { reason: &reason })
                }
                Ok(ConnectionBlockedNotification::Unblocked) => {
                    *state.lock() = None;
                    observer.connection(&ConnectionEvent::Unblocked)
                }
                Err(_) => return Watched::Dropped,
            },
            recv(control) -> _ => return Watched::Closing,
        }
    }
}

/// Marks the connection down with `reason`, unless it was closed meanwhile: a closed connection
/// stays closed (the one place this state is written while recovering). False when closed.
fn set_down(shared: &Shared, reason: &str) -> bool {
    let mut state = shared.state.lock();
    if matches!(*state, LinkState::Closed) {
        return false;
    }
    *state = LinkState::Down {
        last_error: reason.to_string(),
    };
    true
}

/// Reconnects with capped exponential backoff until it works (the new link, topology
/// re-declared, and its blocked notices) or the connection is closed or dropped (`None`).
fn reconnect(
    weak: &Weak<Shared>,
    control: &Receiver<Control>,
    generation: u64,
    observer: &dyn Observer,
) -> Option<(Arc<Link>, Receiver<ConnectionBlockedNotification>)> {
    let mut attempt = 0u32;
    loop {
        let shared = weak.upgrade()?;
        match connect_any(&shared.options, &shared.addresses) {
            Ok((amqp, blocked, address)) => {
                let new = Arc::new(Link::new(
                    generation,
                    &address,
                    amqp,
                    shared.options.operation_timeout,
                ));
                topology::redeclare(&shared, &new);
                let mut state = shared.state.lock();
                if matches!(*state, LinkState::Closed) {
                    drop(state);
                    close_link(&new);
                    return None;
                }
                *state = LinkState::Up(new.clone());
                shared.changed.notify_all();
                drop(state);
                observer.connection(&ConnectionEvent::Connected {
                    address: &new.address,
                    generation,
                });
                return Some((new, blocked));
            }
            Err(e) => {
                attempt += 1;
                let delay = backoff(
                    shared.options.backoff_min,
                    shared.options.backoff_max,
                    attempt,
                );
                let reason = e.to_string();
                // Closed while this attempt was under way: closed it stays.
                if !set_down(&shared, &reason) {
                    return None;
                }
                drop(shared);
                observer.connection(&ConnectionEvent::ReconnectFailed {
                    attempt,
                    reason: &reason,
                    retry_in: delay,
                });
                match control.recv_timeout(delay) {
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    _ => return None,
                }
            }
        }
    }
}

/// Closes the link's AMQP connection; when a channel open holds it (a stalled link), that
/// open closes it when it returns.
fn close_link(link: &Link) {
    link.opener.closing.store(true, Ordering::SeqCst);
    let Some(mut amqp) = link.opener.amqp.try_lock() else {
        return;
    };
    let taken = amqp.take();
    drop(amqp);
    if let Some(amqp) = taken {
        if let Err(e) = amqp.close() {
            log::debug!("acemq: closing the connection to {}: {e}", link.address);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        for attempt in 1..30 {
            let d = backoff(min, max, attempt);
            let full = (min * (1 << (attempt - 1).min(20))).min(max);
            assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
        }
    }
}
