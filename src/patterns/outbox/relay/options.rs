//! The relay's options and its report.

use std::time::Duration;

use crate::error::{Error, Result};

/// Options for an [`OutboxRelay`](super::OutboxRelay), fixed when it is made
/// ([`OutboxRelay::new`](super::OutboxRelay::new)).
///
/// ```
/// use acemq_amqp::patterns::outbox::OutboxRelayOptions;
/// use std::time::Duration;
/// let options = OutboxRelayOptions::new()
///     .interval(Duration::from_millis(200))
///     .batch_size(50);
/// # let _ = options;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxRelayOptions {
    pub(super) interval: Duration,
    pub(super) batch_size: usize,
    pub(super) health_backlog: u64,
    pub(super) health_oldest_pending: Duration,
    pub(super) health_lag: Duration,
}

impl Default for OutboxRelayOptions {
    fn default() -> Self {
        OutboxRelayOptions {
            interval: Duration::from_millis(500),
            batch_size: 100,
            health_backlog: 10_000,
            health_oldest_pending: Duration::from_secs(300),
            health_lag: Duration::from_secs(60),
        }
    }
}

impl OutboxRelayOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a started relay waits after a sweep that found less than a full batch before
    /// it sweeps again (a sweep that found a full batch is followed by the next one at once).
    /// Defaults to 500 ms; must not be zero (the relay would query an empty outbox without
    /// pause).
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The most records one sweep leases and publishes (pipelined, then the confirms awaited).
    /// `1` publishes strictly in order, one confirm at a time. Defaults to 100; must be at
    /// least 1.
    #[must_use]
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Past how many records waiting in the outbox (as last counted) a running relay reports
    /// itself `degraded` in [`Connection::health`](crate::Connection::health). Defaults to
    /// 10,000.
    #[must_use]
    pub fn health_backlog_threshold(mut self, records: u64) -> Self {
        self.health_backlog = records;
        self
    }

    /// Past how old the oldest waiting record may be before a running relay reports itself
    /// `degraded`. Defaults to 5 minutes.
    #[must_use]
    pub fn health_oldest_pending_threshold(mut self, age: Duration) -> Self {
        self.health_oldest_pending = age;
        self
    }

    /// Past how long from its commit to its confirm the last published record may have taken
    /// (its lag) before a running relay reports itself `degraded`. Defaults to 60 s.
    #[must_use]
    pub fn health_lag_threshold(mut self, lag: Duration) -> Self {
        self.health_lag = lag;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(Error::invalid(
                "the outbox relay's batch_size must be at least 1",
            ));
        }
        if self.interval.is_zero() {
            return Err(Error::invalid(
                "the outbox relay's interval must not be zero: it would query an empty outbox \
                 without pause",
            ));
        }
        Ok(())
    }
}

/// What a started relay did, from [`OutboxRelay::start`](super::OutboxRelay::start) to
/// [`RunningRelay::close`](super::RunningRelay::close): sweeps of its thread and those through
/// [`RunningRelay::sweep`](super::RunningRelay::sweep). For a relay that was never started,
/// what [`OutboxRelay::close`](super::OutboxRelay::close) returns: the sweeps made on it by hand
/// ([`OutboxRelay::sweep`](super::OutboxRelay::sweep)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayReport {
    /// Sweeps run, empty ones included.
    pub sweeps: u64,
    /// Of those, sweeps that ended with an error (logged, or returned by
    /// [`RunningRelay::sweep`](super::RunningRelay::sweep)); their unpublished records stayed in the outbox.
    pub failed_sweeps: u64,
    /// Records the broker confirmed. A record whose delete failed afterwards is published
    /// again after its lease and then counted again.
    pub published: u64,
}
