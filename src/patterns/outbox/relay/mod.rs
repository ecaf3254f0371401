//! The outbox relay: its life cycle (configured, started, closed). The module docs are those
//! of [`crate::patterns::outbox`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::patterns::outbox::store::OutboxStore;
use state::Core;

mod backlog;
mod batch;
mod health;
mod options;
mod state;
mod sweep;

pub use options::{OutboxRelayOptions, RelayReport};

/// Publishes an outbox's records: configured, not running. [`sweep`](Self::sweep) it on the
/// caller's thread, or [`start`](Self::start) it. See the [module docs](super).
///
/// ```no_run
/// # #[cfg(feature = "sqlite")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use acemq_amqp::patterns::outbox::{
///     OutboxRelay, OutboxRelayOptions, SqlOutboxStore, SqlOutboxStoreOptions,
/// };
/// use acemq_amqp::Connection;
/// use std::time::Duration;
/// let connection = Connection::open("amqp://127.0.0.1")?;
/// let store = SqlOutboxStore::open(
///     || {
///         rusqlite::Connection::open("app.db")
///             .map_err(|e| acemq_amqp::Error::Sql { context: "opening".into(), source: e.into() })
///     },
///     SqlOutboxStoreOptions::default(),
/// )?;
/// let options = OutboxRelayOptions::new()
///     .interval(Duration::from_millis(200))
///     .batch_size(100);
/// let running = OutboxRelay::new(&connection, store, options)?.start()?;
/// // … the service runs; records added on its transactions go out …
/// let report = running.close()?;
/// println!("published {} record(s)", report.published);
/// # Ok(()) }
/// # #[cfg(not(feature = "sqlite"))]
/// # fn main() {}
/// ```
pub struct OutboxRelay {
    core: Arc<Core>,
}

impl std::fmt::Debug for OutboxRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxRelay")
            .field("options", &self.core.options)
            .finish()
    }
}

impl OutboxRelay {
    /// A relay publishing `store`'s records on `connection` with these options. Nothing runs
    /// until [`start`](Self::start) or [`sweep`](Self::sweep); the relay's publisher is opened
    /// by its first sweep.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when a batch size or interval is zero.
    pub fn new(
        connection: &Connection,
        store: impl OutboxStore + 'static,
        options: OutboxRelayOptions,
    ) -> Result<OutboxRelay> {
        options.validate()?;
        Ok(OutboxRelay {
            core: Arc::new(Core {
                connection: connection.clone(),
                store: Arc::new(store),
                options,
                publisher: Mutex::new(None),
                sweeping: Mutex::new(()),
                observer: connection.observer().clone(),
                sweeps: AtomicU64::new(0),
                failed_sweeps: AtomicU64::new(0),
                published: AtomicU64::new(0),
                health: Mutex::new(state::RelayStats::default()),
            }),
        })
    }

    /// The options it was made with (and runs with).
    pub fn options(&self) -> &OutboxRelayOptions {
        &self.core.options
    }

    /// Publishes one batch now, on the caller's thread, and returns how many records went out.
    ///
    /// # Errors
    ///
    /// The store's error, else the error of the first record that failed through its own fault
    /// (for example [`Error::Unroutable`] or [`Error::Nacked`]), else the connection's; the
    /// records not published stay in the outbox and their leases are ended.
    pub fn sweep(&self) -> Result<usize> {
        self.core.sweep()
    }

    /// Starts the sweeper thread (`acemq-outbox-relay`) and returns the running relay. The
    /// report of its [`close`](RunningRelay::close) counts from here.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the thread cannot be spawned (the relay is then dropped, and its
    /// publisher closed).
    pub fn start(self) -> Result<RunningRelay> {
        let core = self.core;
        for counter in [&core.sweeps, &core.failed_sweeps, &core.published] {
            counter.store(0, Ordering::SeqCst);
        }
        let (stop, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let sweeper = Arc::clone(&core);
        let thread = std::thread::Builder::new()
            .name("acemq-outbox-relay".into())
            .spawn(move || sweeper.run(&stop_rx))
            .map_err(|e| Error::Io {
                context: "spawning the outbox relay thread".into(),
                source: e,
            })?;
        let health = core
            .connection
            .register_health(Arc::new(health::RelayHealth {
                core: Arc::clone(&core),
            }));
        Ok(RunningRelay {
            core,
            stop,
            thread: Some(thread),
            _health: health,
        })
    }

    /// Closes the relay's publisher, if a sweep opened one, and reports the sweeps made on it
    /// ([`sweep`](Self::sweep)). Dropping the relay closes the publisher too, logging the
    /// error.
    ///
    /// # Errors
    ///
    /// The publisher's close error (for example [`Error::Timeout`] for confirms still awaited).
    pub fn close(self) -> Result<RelayReport> {
        self.core.close_publisher()?;
        Ok(self.core.report())
    }
}

/// A started [`OutboxRelay`]: its sweeper thread runs until [`close`](Self::close).
///
/// Dropping it closes it best-effort: it **blocks** until the thread's current sweep ends (a
/// sweep publishes for at most half the store's lease, then runs its database statements), the
/// thread has deleted what went out and given back what it had leased, and the publisher is
/// closed (waiting up to its timeout for confirms still awaited); errors are logged, not
/// returned. Call [`close`](Self::close) to see them and the [`RelayReport`].
pub struct RunningRelay {
    core: Arc<Core>,
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
    /// Lists it in [`Connection::health`] while it lives.
    _health: crate::health::Registered,
}

impl std::fmt::Debug for RunningRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningRelay")
            .field("options", &self.core.options)
            .field("report", &self.core.report())
            .finish()
    }
}

impl RunningRelay {
    /// The options it runs with.
    pub fn options(&self) -> &OutboxRelayOptions {
        &self.core.options
    }

    /// Publishes one batch now, on the caller's thread, between the thread's sweeps (they never
    /// overlap), and returns how many records went out: for an end-of-request flush, or a test
    /// that cannot wait for the interval. As [`OutboxRelay::sweep`].
    ///
    /// # Errors
    ///
    /// As [`OutboxRelay::sweep`].
    pub fn sweep(&self) -> Result<usize> {
        self.core.sweep()
    }

    /// Stops the sweeper thread after its current sweep (it then deletes what went out and
    /// gives back what it had leased), joins it, closes the relay's publisher and reports what
    /// the relay did since it started.
    ///
    /// # Errors
    ///
    /// The publisher's close error (for example [`Error::Timeout`] for confirms still awaited).
    /// A failure of the thread's last deletes is logged, as during the run: those records are
    /// published again after their lease.
    pub fn close(mut self) -> Result<RelayReport> {
        self.stop_thread();
        self.core.close_publisher()?;
        Ok(self.core.report())
    }

    fn stop_thread(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = self.stop.send(());
            if thread.join().is_err() {
                log::error!("acemq: the outbox relay thread panicked");
            }
        }
    }
}

impl Drop for RunningRelay {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop_thread();
            if let Err(e) = self.core.close_publisher() {
                log::warn!("acemq: closing the outbox relay: {e}");
            }
        }
    }
}
