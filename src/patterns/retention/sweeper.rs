//! [`Sweeper`]: [`purge`] every interval on a thread of its own (`acemq-retention`), as the
//! service host runs it.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::options::RetentionOptions;
use super::purge::purge;
use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::patterns::idempotency::SqlIdempotencyStore;
use crate::patterns::outbox::SqlOutboxStore;

/// A purge run every `interval` (the first one after an interval).
pub struct Sweeper {
    connection: Connection,
    receipts: Arc<SqlIdempotencyStore>,
    outbox: Option<Arc<SqlOutboxStore>>,
    options: RetentionOptions,
    interval: Duration,
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("options", &self.options)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Sweeper {
    /// A sweeper of `receipts` (and `outbox`'s retired records, when the options say so),
    /// guarded by the messages waiting on `connection`'s broker.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for options without queues or a zero interval.
    pub fn new(
        connection: &Connection,
        receipts: SqlIdempotencyStore,
        outbox: Option<SqlOutboxStore>,
        options: RetentionOptions,
        interval: Duration,
    ) -> Result<Sweeper> {
        options.validate()?;
        if interval.is_zero() {
            return Err(Error::invalid("the sweeper's interval must be above zero"));
        }
        Ok(Sweeper {
            connection: connection.clone(),
            receipts: Arc::new(receipts),
            outbox: outbox.map(Arc::new),
            options,
            interval,
        })
    }

    /// Starts the thread.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when it cannot be spawned.
    pub fn start(self) -> Result<RunningSweeper> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name("acemq-retention".into())
            .spawn(move || {
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(self.interval)
                {
                    let outbox = self.outbox.as_deref();
                    if let Err(e) = purge(&self.connection, &self.receipts, outbox, &self.options) {
                        log::warn!("acemq: retention: nothing purged: {e}");
                    }
                }
            })
            .map_err(|e| Error::Io {
                context: "spawning the retention sweeper".into(),
                source: e,
            })?;
        Ok(RunningSweeper {
            stop,
            thread: Some(thread),
        })
    }
}

/// A running [`Sweeper`]; dropping it stops it.
#[derive(Debug)]
pub struct RunningSweeper {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl RunningSweeper {
    /// Stops it, waiting for a purge under way to finish.
    pub fn close(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        let _ = self.stop.try_send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RunningSweeper {
    fn drop(&mut self) {
        self.stop_thread();
    }
}
