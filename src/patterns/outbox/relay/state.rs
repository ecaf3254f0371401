//! What a relay holds, shared by its sweeps and its thread: the store, the options, the
//! publisher a sweep opens, the counters of its report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::options::{OutboxRelayOptions, RelayReport};
use crate::connection::Connection;
use crate::envelope::now_ms;
use crate::error::Result;
use crate::observe::{Observer, OutboxEvent};
use crate::patterns::outbox::store::{OutboxRecord, OutboxStore};
use crate::publish::{Publisher, PublisherOptions};

/// What the relay last learned, kept for its health report.
#[derive(Default)]
pub(super) struct RelayStats {
    /// Records waiting and the age of the oldest, when the backlog was last counted.
    pub(super) backlog: Option<(u64, Option<Duration>, Instant)>,
    /// From commit to confirm, for the last record published.
    pub(super) last_lag: Option<Duration>,
    /// The last sweep's error, until a sweep succeeds.
    pub(super) last_error: Option<String>,
}

/// A relay's state: one per relay, shared by the [`OutboxRelay`](super::OutboxRelay) or
/// [`RunningRelay`](super::RunningRelay) and the sweeper thread.
pub(super) struct Core {
    pub(super) connection: Connection,
    pub(super) store: Arc<dyn OutboxStore>,
    pub(super) options: OutboxRelayOptions,
    pub(super) publisher: Mutex<Option<Publisher>>,
    /// Sweeps of one relay never overlap.
    pub(super) sweeping: Mutex<()>,
    pub(super) observer: Arc<dyn Observer>,
    pub(super) sweeps: AtomicU64,
    pub(super) failed_sweeps: AtomicU64,
    pub(super) published: AtomicU64,
    /// What its health report reads.
    pub(super) health: Mutex<RelayStats>,
}

impl Drop for Core {
    /// A relay dropped without `close` (never started, or its start failed) closes its
    /// publisher here.
    fn drop(&mut self) {
        if let Err(e) = self.close_publisher() {
            log::warn!("acemq: closing the outbox relay: {e}");
        }
    }
}

pub(super) fn ids(records: &[OutboxRecord]) -> Vec<i64> {
    records.iter().map(|r| r.id).collect()
}

impl Core {
    /// Counts a sweep (of the thread or on demand) for the [`RelayReport`].
    pub(super) fn count_sweep(&self, result: Result<usize>) -> Result<usize> {
        self.sweeps.fetch_add(1, Ordering::SeqCst);
        if result.is_err() {
            self.failed_sweeps.fetch_add(1, Ordering::SeqCst);
        }
        self.health.lock().last_error = result.as_ref().err().map(ToString::to_string);
        result
    }

    pub(super) fn report(&self) -> RelayReport {
        RelayReport {
            sweeps: self.sweeps.load(Ordering::SeqCst),
            failed_sweeps: self.failed_sweeps.load(Ordering::SeqCst),
            published: self.published.load(Ordering::SeqCst),
        }
    }

    /// Closes the publisher a sweep opened, if any; the next sweep would open a new one.
    pub(super) fn close_publisher(&self) -> Result<()> {
        match self.publisher.lock().take() {
            Some(p) => p.close(),
            None => Ok(()),
        }
    }

    pub(super) fn publisher(&self) -> Result<Publisher> {
        let mut slot = self.publisher.lock();
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        // Each wait of a publish (room, recovery, its confirm) is a third of the lease at most.
        let timeout =
            (self.store.lease() / 3).clamp(Duration::from_millis(100), Duration::from_secs(10));
        let p = self.connection.publisher_with(
            PublisherOptions::new()
                // Two batches: the one in flight and the next (see `pump`).
                .window(self.options.batch_size.saturating_mul(2).max(16))
                .timeout(timeout),
        )?;
        *slot = Some(p.clone());
        Ok(p)
    }

    /// When publishing a batch leased at `leased_at` (taken just before the lease statement
    /// went, so no later than the database's lease began) must be over: half the lease after
    /// it, so that the lease never runs out while this relay still publishes, awaits or has yet
    /// to delete the records (another relay would then publish them too). Counted from the
    /// lease, not from the hand-over: a batch leased ahead waits while the batch before it is
    /// confirmed.
    pub(super) fn deadline(&self, leased_at: Instant) -> Instant {
        leased_at + self.store.lease() / 2
    }

    /// Whether a batch leased ahead at `leased_at` may still be handed over: while at least
    /// half of its time to publish is left (a quarter of the lease). One that waited longer
    /// behind slow confirms (a stalled link) is given back unpublished and a fresh batch
    /// leased, rather than published with too little of its lease left to be confirmed in.
    pub(super) fn still_fresh(&self, leased_at: Instant) -> bool {
        leased_at.elapsed() < self.store.lease() / 4
    }

    /// Ends the leases on records the relay will not publish now, when it is giving up on an
    /// error of its own (which it reports): a failure to do so is only logged.
    pub(super) fn give_back(&self, records: &[OutboxRecord]) {
        if records.is_empty() {
            return;
        }
        if let Err(e) = self.store.unlease(&ids(records)) {
            log::warn!("acemq: ending outbox leases: {e}");
        }
    }

    pub(super) fn published(&self, r: &OutboxRecord) {
        self.published.fetch_add(1, Ordering::SeqCst);
        let lag = Duration::from_millis(
            u64::try_from(now_ms().saturating_sub(r.created_ms)).unwrap_or(0),
        );
        self.health.lock().last_lag = Some(lag);
        self.observer.outbox(&OutboxEvent::Published {
            id: r.id,
            exchange: &r.exchange,
            routing_key: &r.routing_key,
            lag,
        });
    }
}
