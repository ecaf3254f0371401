//! The asking side's handle: [`RequesterOptions`] (where requests go, the timeout, the reply
//! queue, the window), the configured [`Requester`], the [`RunningRequester`] the calls are made
//! on, and what closing it reports ([`RequesterReport`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};

use super::calls::{Inner, State};
use super::session::reply_loop;
use super::wire::REPLY_QUEUE_PREFIX;
use crate::connection::Connection;
use crate::envelope::{check_name, Message};
use crate::error::{Error, Result};
use crate::observe::{RequestEvent, RequestOutcome};

/// How long [`RunningRequester::ask`] waits for a reply unless told otherwise: 30 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Options for a [`Requester`]: where its requests go, how long a call waits, where the replies
/// come back.
#[derive(Clone, Debug)]
pub struct RequesterOptions {
    exchange: String,
    routing_key: String,
    timeout: Duration,
    reply_queue: Option<String>,
    window: usize,
}

impl Default for RequesterOptions {
    fn default() -> Self {
        RequesterOptions {
            exchange: String::new(),
            routing_key: String::new(),
            timeout: DEFAULT_REQUEST_TIMEOUT,
            reply_queue: None,
            window: 1024,
        }
    }
}

impl RequesterOptions {
    /// Every check of these options, in one place (run by [`Requester::new`]).
    fn validate(&self) -> Result<()> {
        check_name("exchange", &self.exchange, true)?;
        check_name("routing key", &self.routing_key, true)?;
        if let Some(q) = &self.reply_queue {
            check_name("queue", q, false)?;
            if q.starts_with(REPLY_QUEUE_PREFIX) {
                return Err(Error::invalid(format!(
                    "the reply queue {q:?} (RequesterOptions::reply_queue) starts with \
                     {REPLY_QUEUE_PREFIX:?}, which names the transient reply queues requesters \
                     generate (responders send replies to those unconfirmed); name a durable \
                     reply queue otherwise"
                )));
            }
        }
        if self.timeout.is_zero() {
            return Err(Error::invalid(format!(
                "the request timeout (RequesterOptions::timeout) must be above zero, got {:?}",
                self.timeout
            )));
        }
        if self.window == 0 {
            return Err(Error::invalid(
                "the requester's window (RequesterOptions::window) must be at least 1, got 0",
            ));
        }
        Ok(())
    }

    /// Default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The exchange requests are published to. Defaults to `""`, the default exchange (which
    /// routes by queue name).
    #[must_use]
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.exchange = exchange.into();
        self
    }

    /// The routing key requests are published with: with the default exchange, the responder's
    /// queue. Defaults to `""`.
    #[must_use]
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.routing_key = routing_key.into();
        self
    }

    /// How long [`RunningRequester::ask`] waits for its reply. Defaults to 30 s
    /// ([`DEFAULT_REQUEST_TIMEOUT`]); zero is refused by [`Requester::new`].
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Replies go to this durable (quorum) queue, declared if missing and kept after the
    /// requester closes, rather than to a transient `acemq-reply-<id>` of its own. Only one
    /// requester may consume it at a time (it consumes exclusively). Defaults to none. A name
    /// starting `acemq-reply-` is refused by [`Requester::new`]: responders take such a
    /// queue for a generated transient one and send replies to it unconfirmed (see
    /// [`Responder`](super::Responder)).
    #[must_use]
    pub fn reply_queue(mut self, name: impl Into<String>) -> Self {
        self.reply_queue = Some(name.into());
        self
    }

    /// The most calls waiting for their replies at once; a call beyond that waits (within its
    /// own timeout) for one of them to finish. Defaults to 1024; zero is refused by
    /// [`Requester::new`].
    #[must_use]
    pub fn window(mut self, window: usize) -> Self {
        self.window = window;
        self
    }
}

/// A requester configured and checked, not yet running: [`start`](Self::start) declares its
/// reply queue and returns the [`RunningRequester`] the calls are made on.
#[derive(Debug)]
pub struct Requester {
    connection: Connection,
    options: RequesterOptions,
}

impl Requester {
    /// A requester on `connection` with these options (the exchange and routing key its
    /// requests go to among them). Starts nothing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for the exchange, routing key or reply queue;
    /// [`Error::InvalidArgument`] for a zero timeout or window, or a reply queue named
    /// `acemq-reply-…`.
    pub fn new(connection: &Connection, options: RequesterOptions) -> Result<Requester> {
        options.validate()?;
        Ok(Requester {
            connection: connection.clone(),
            options,
        })
    }

    /// Starts `acemq-requester`, which declares and consumes the reply queue; returns once the
    /// reply queue is consumed.
    ///
    /// # Errors
    ///
    /// Declaring or consuming the reply queue can fail ([`Error::ConnectionLost`],
    /// [`Error::Closed`], [`Error::TopologyConflict`]); [`Error::Io`] if the thread cannot start.
    pub fn start(self) -> Result<RunningRequester> {
        let Requester {
            connection,
            options,
        } = self;
        let (ended, ended_rx) = crossbeam_channel::bounded(1);
        let (ack_wake, ack_woken) = crossbeam_channel::bounded(1);
        let inner = Arc::new(Inner {
            observer: connection.observer().clone(),
            connection,
            exchange: options.exchange,
            routing_key: options.routing_key,
            window: options.window,
            reply_queue: options.reply_queue,
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
        Ok(RunningRequester {
            inner,
            timeout: options.timeout,
            stop,
            thread: Some(thread),
        })
    }
}

/// What closing a requester found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequesterReport {
    /// Calls that got no reply in time, over the requester's life
    /// ([`RunningRequester::timed_out`]).
    pub timed_out: u64,
    /// Replies that matched no waiting call (late, or never asked for), dropped
    /// ([`RunningRequester::unmatched`]).
    pub unmatched: u64,
    /// Calls still waiting for their replies when the requester closed: each failed with
    /// [`Error::Closed`].
    pub abandoned: usize,
}

/// A started requester: sends requests and waits for their replies. `Send + Sync`: many threads
/// ask through one requester at once (see the [module docs](super)).
///
/// Dropping it closes it as [`close`](Self::close) does (it blocks until `acemq-requester` has
/// ended).
pub struct RunningRequester {
    inner: Arc<Inner>,
    /// [`RequesterOptions::timeout`].
    timeout: Duration,
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RunningRequester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningRequester")
            .field("exchange", &self.inner.exchange)
            .field("routing_key", &self.inner.routing_key)
            .field("reply_queue", &self.reply_queue())
            .finish()
    }
}

impl RunningRequester {
    /// Sends `request` and waits for its reply, up to the requester's timeout (30 s unless set
    /// in [`RequesterOptions::timeout`]).
    ///
    /// # Errors
    ///
    /// As [`ask_timeout`](Self::ask_timeout).
    pub fn ask(&self, request: impl Into<Message>) -> Result<Message> {
        self.ask_timeout(request, self.timeout)
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
        let result = self.inner.round_trip(request.into(), start, timeout);
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
    pub fn close(mut self) -> Result<RequesterReport> {
        let abandoned = self.shut();
        Ok(RequesterReport {
            timed_out: self.timed_out(),
            unmatched: self.unmatched(),
            abandoned,
        })
    }

    /// Stops `acemq-requester` and fails the calls still waiting; returns how many there were.
    fn shut(&mut self) -> usize {
        let Some(thread) = self.thread.take() else {
            return 0;
        };
        self.inner.stopping.store(true, Ordering::SeqCst);
        let _ = self.stop.try_send(());
        if thread.join().is_err() {
            log::error!("acemq: the requester thread panicked");
        }
        self.inner
            .close_state(|| Error::Closed { what: "requester" })
    }
}

impl Drop for RunningRequester {
    fn drop(&mut self) {
        self.shut();
    }
}
