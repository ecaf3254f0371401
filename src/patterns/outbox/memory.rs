//! The in-memory outbox, for tests.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::store::{
    check_limits, headers_json, NewOutboxRecord, OutboxRecord, OutboxStats, OutboxStore,
};
use crate::error::Result;

/// An outbox in a map, for tests. **Not for production**: see the [module docs](super).
///
/// Leases work as in [`SqlOutboxStore`](super::SqlOutboxStore), shared by every thread using this one instance.
pub struct InMemoryOutboxStore {
    max_attempts: i64,
    lease: Duration,
    state: Mutex<MemState>,
}

#[derive(Default)]
struct MemState {
    next_id: i64,
    records: BTreeMap<i64, (OutboxRecord, Option<Instant>)>,
}

/// Options for an [`InMemoryOutboxStore`], checked by [`InMemoryOutboxStore::open`].
///
/// ```
/// use acemq_amqp::patterns::outbox::{InMemoryOutboxStore, InMemoryOutboxStoreOptions};
/// use std::time::Duration;
/// let store = InMemoryOutboxStore::open(
///     InMemoryOutboxStoreOptions::default()
///         .max_attempts(2)
///         .lease(Duration::from_millis(200)),
/// )?;
/// # let _ = store;
/// # Ok::<(), acemq_amqp::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InMemoryOutboxStoreOptions {
    max_attempts: u32,
    lease: Duration,
}

impl Default for InMemoryOutboxStoreOptions {
    fn default() -> Self {
        InMemoryOutboxStoreOptions {
            max_attempts: 10,
            lease: Duration::from_secs(30),
        }
    }
}

impl InMemoryOutboxStoreOptions {
    /// Failed attempts after which a record is retired (at least 1). Defaults to 10.
    #[must_use]
    pub fn max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// How long `pending` leases the records it returns (at least 1 ms). Defaults to 30 s.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }
}

impl InMemoryOutboxStore {
    /// An empty outbox with the default options: `max_attempts` 10 and a 30 s lease.
    pub fn new() -> InMemoryOutboxStore {
        InMemoryOutboxStore::from_valid(InMemoryOutboxStoreOptions::default())
    }

    /// An empty outbox with these options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for zero `max_attempts` or a lease under 1 ms (as
    /// [`SqlOutboxStore::open`](super::SqlOutboxStore::open)).
    pub fn open(options: InMemoryOutboxStoreOptions) -> Result<InMemoryOutboxStore> {
        check_limits(options.max_attempts, options.lease)?;
        Ok(InMemoryOutboxStore::from_valid(options))
    }

    fn from_valid(options: InMemoryOutboxStoreOptions) -> InMemoryOutboxStore {
        InMemoryOutboxStore {
            max_attempts: i64::from(options.max_attempts),
            lease: options.lease,
            state: Mutex::new(MemState::default()),
        }
    }

    /// Adds a record and returns its id.
    ///
    /// # Errors
    ///
    /// [`Error::Codec`](crate::Error::Codec) if the headers cannot be serialized (they always can; kept for
    /// symmetry with [`SqlOutboxStore::add`](super::SqlOutboxStore::add)).
    pub fn add(&self, record: &NewOutboxRecord) -> Result<i64> {
        headers_json(&record.headers)?;
        let mut state = self.state.lock();
        state.next_id += 1;
        let id = state.next_id;
        let rec = OutboxRecord {
            id,
            exchange: record.exchange.clone(),
            routing_key: record.routing_key.clone(),
            body: record.body.clone(),
            content_type: record.content_type.clone(),
            headers: record.headers.clone(),
            created_ms: crate::envelope::now_ms(),
            attempts: 0,
            last_error: None,
        };
        state.records.insert(id, (rec, None));
        Ok(id)
    }

    /// The number of records held, retired ones included.
    pub fn len(&self) -> usize {
        self.state.lock().records.len()
    }

    /// True when the outbox holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for InMemoryOutboxStore {
    fn default() -> Self {
        InMemoryOutboxStore::new()
    }
}

impl fmt::Debug for InMemoryOutboxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryOutboxStore")
            .field("max_attempts", &self.max_attempts)
            .field("lease", &self.lease)
            .field("len", &self.len())
            .finish()
    }
}

impl OutboxStore for InMemoryOutboxStore {
    fn lease(&self) -> Duration {
        self.lease
    }

    fn pending(&self, limit: usize) -> Result<Vec<OutboxRecord>> {
        let now = Instant::now();
        let mut state = self.state.lock();
        let mut out = Vec::new();
        for (rec, lease) in state.records.values_mut() {
            if out.len() >= limit {
                break;
            }
            if rec.attempts >= self.max_attempts || lease.is_some_and(|until| until > now) {
                continue;
            }
            *lease = Some(now + self.lease);
            out.push(rec.clone());
        }
        Ok(out)
    }

    fn mark_published(&self, id: i64) -> Result<()> {
        self.state.lock().records.remove(&id);
        Ok(())
    }

    fn record_failure(&self, id: i64, error: &str) -> Result<()> {
        if let Some((rec, lease)) = self.state.lock().records.get_mut(&id) {
            rec.attempts += 1;
            rec.last_error = Some(error.to_owned());
            *lease = None;
        }
        Ok(())
    }

    fn retired(&self) -> Result<Vec<OutboxRecord>> {
        Ok(self
            .state
            .lock()
            .records
            .values()
            .filter(|(rec, _)| rec.attempts >= self.max_attempts)
            .map(|(rec, _)| rec.clone())
            .collect())
    }

    fn release(&self, id: i64) -> Result<()> {
        if let Some((rec, lease)) = self.state.lock().records.get_mut(&id) {
            rec.attempts = 0;
            *lease = None;
        }
        Ok(())
    }

    fn unlease(&self, ids: &[i64]) -> Result<()> {
        let mut state = self.state.lock();
        for id in ids {
            if let Some((_, lease)) = state.records.get_mut(id) {
                *lease = None;
            }
        }
        Ok(())
    }

    fn renew(&self, ids: &[i64]) -> Result<Vec<i64>> {
        let now = Instant::now();
        let mut state = self.state.lock();
        let mut renewed = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some((_, lease)) = state.records.get_mut(id) {
                if lease.is_some_and(|until| until > now) {
                    *lease = Some(now + self.lease);
                    renewed.push(*id);
                }
            }
        }
        Ok(renewed)
    }

    fn stats(&self) -> Result<OutboxStats> {
        let state = self.state.lock();
        let live = state
            .records
            .values()
            .filter(|(rec, _)| rec.attempts < self.max_attempts);
        let mut stats = OutboxStats::default();
        for (rec, _) in live {
            stats.pending += 1;
            stats.oldest_created_ms = Some(
                stats
                    .oldest_created_ms
                    .map_or(rec.created_ms, |o| o.min(rec.created_ms)),
            );
        }
        Ok(stats)
    }
}
