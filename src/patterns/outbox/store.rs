//! The outbox's records and the store trait the relay works through.

use std::time::Duration;

use crate::error::{Error, Result};

/// A message to put in the outbox.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NewOutboxRecord {
    /// The exchange to publish to (`""` for the default exchange).
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The message body.
    pub body: Vec<u8>,
    /// The body's content type, e.g. `application/json`.
    pub content_type: String,
    /// AMQP headers, stored as JSON text in the `headers` column.
    pub headers: serde_json::Map<String, serde_json::Value>,
}

impl NewOutboxRecord {
    /// The message id the relay publishes this record with, as `x-acemq-id` and as the AMQP
    /// `message_id`, the same however often it is published: store it beside the business row
    /// to point at its message. Always there on a record made by
    /// [`record`](super::record()) or [`record_message`](super::record_message());
    /// `None` on one built by hand (or a row another program wrote) without a string
    /// `x-acemq-id`: the relay then publishes it with an id derived from the row (its id, when
    /// it was added, exchange, routing key, content type and body), the same on every publish.
    pub fn message_id(&self) -> Option<&str> {
        self.headers
            .get(crate::envelope::headers::ID)
            .and_then(serde_json::Value::as_str)
            .filter(|id| !id.is_empty())
    }
}

/// A record in the outbox.
#[derive(Clone, Debug, PartialEq)]
pub struct OutboxRecord {
    /// The record's id, increasing in insertion order.
    pub id: i64,
    /// The exchange to publish to.
    pub exchange: String,
    /// The routing key.
    pub routing_key: String,
    /// The message body.
    pub body: Vec<u8>,
    /// The body's content type.
    pub content_type: String,
    /// AMQP headers.
    pub headers: serde_json::Map<String, serde_json::Value>,
    /// When the record was added, in epoch milliseconds (the outbox lag is measured from here).
    pub created_ms: i64,
    /// Failed publish attempts so far.
    pub attempts: i64,
    /// The last failure's error text.
    pub last_error: Option<String>,
}

/// The relay's view of an outbox: what to publish, and what became of it.
pub trait OutboxStore: Send + Sync {
    /// Up to `limit` records to publish, oldest first, leased to this store so that no other
    /// relay is offered them while the lease holds. Retired records are not offered.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn pending(&self, limit: usize) -> Result<Vec<OutboxRecord>>;

    /// The record was published and confirmed: delete it. An unknown id is not an error.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn mark_published(&self, id: i64) -> Result<()>;

    /// Publishing the record failed: count the attempt, keep `error`, end the lease.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn record_failure(&self, id: i64, error: &str) -> Result<()>;

    /// The records that reached `max_attempts`, oldest first.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn retired(&self) -> Result<Vec<OutboxRecord>>;

    /// Puts a (retired) record back in play: resets its attempts and lease.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn release(&self, id: i64) -> Result<()>;

    /// Deletes several published records at once (one commit). Defaults to
    /// [`mark_published`](Self::mark_published) for each.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn mark_published_many(&self, ids: &[i64]) -> Result<()> {
        ids.iter().try_for_each(|id| self.mark_published(*id))
    }

    /// Deletes the published records `published`, then leases up to `limit` records as
    /// [`pending`](Self::pending) does — in **one commit** where the store can, so that a relay
    /// pays one database round trip and one durable commit per batch instead of two. On an
    /// error neither happened (the published records stay, to be deleted by a later call).
    /// Defaults to [`mark_published_many`](Self::mark_published_many) then `pending`.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn mark_published_and_lease(
        &self,
        published: &[i64],
        limit: usize,
    ) -> Result<Vec<OutboxRecord>> {
        self.mark_published_many(published)?;
        self.pending(limit)
    }

    /// Ends this store's lease on records it was offered but did not publish (the connection
    /// dropped, the batch stopped short of them, the store failed mid-sweep), without counting
    /// an attempt, so that they are offered again at once. Defaults to doing nothing: the
    /// leases then run out by themselves.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn unlease(&self, ids: &[i64]) -> Result<()> {
        let _ = ids;
        Ok(())
    }

    /// Extends this store's lease on those of `ids` it still holds — leased to it, the lease
    /// not run out — by a whole [`lease`](Self::lease) from now, and returns them; a record
    /// whose lease ran out (another relay may hold it now) is not renewed. The relay renews the
    /// leases of a batch whose confirms are slow to come (a stalled link) instead of giving the
    /// records back while they may still reach the broker (which would publish them twice).
    /// Defaults to renewing none: the relay then gives up on such a batch at half its lease.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn renew(&self, ids: &[i64]) -> Result<Vec<i64>> {
        let _ = ids;
        Ok(Vec::new())
    }

    /// How long a record [`pending`](Self::pending) returns stays leased. The relay keeps each
    /// batch well inside it (half of it from the lease, then [`renew`](Self::renew)ing it), so
    /// that a lease never runs out while this relay is still publishing the record and another
    /// relay takes it too. Defaults to 30 s.
    fn lease(&self) -> Duration {
        Duration::from_secs(30)
    }

    /// How many records wait to be published (retired ones excluded) and when the oldest of
    /// them was added.
    ///
    /// # Errors
    ///
    /// A store error, such as [`Error::Sql`].
    fn stats(&self) -> Result<OutboxStats>;
}

/// A shared store is a store: open the outbox once, keep it in an `Arc`, `add` to it in the
/// handlers and hand a clone of the `Arc` to [`OutboxRelay::new`](super::OutboxRelay::new). Every
/// call (the defaulted ones too) goes to the store itself, so its overrides are kept.
impl<S: OutboxStore + ?Sized> OutboxStore for std::sync::Arc<S> {
    fn pending(&self, limit: usize) -> Result<Vec<OutboxRecord>> {
        (**self).pending(limit)
    }
    fn mark_published(&self, id: i64) -> Result<()> {
        (**self).mark_published(id)
    }
    fn record_failure(&self, id: i64, error: &str) -> Result<()> {
        (**self).record_failure(id, error)
    }
    fn retired(&self) -> Result<Vec<OutboxRecord>> {
        (**self).retired()
    }
    fn release(&self, id: i64) -> Result<()> {
        (**self).release(id)
    }
    fn mark_published_many(&self, ids: &[i64]) -> Result<()> {
        (**self).mark_published_many(ids)
    }
    fn mark_published_and_lease(
        &self,
        published: &[i64],
        limit: usize,
    ) -> Result<Vec<OutboxRecord>> {
        (**self).mark_published_and_lease(published, limit)
    }
    fn unlease(&self, ids: &[i64]) -> Result<()> {
        (**self).unlease(ids)
    }
    fn renew(&self, ids: &[i64]) -> Result<Vec<i64>> {
        (**self).renew(ids)
    }
    fn lease(&self) -> Duration {
        (**self).lease()
    }
    fn stats(&self) -> Result<OutboxStats> {
        (**self).stats()
    }
}

/// The backlog of an outbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Records waiting to be published (not retired).
    pub pending: u64,
    /// `created_ms` of the oldest of them.
    pub oldest_created_ms: Option<i64>,
}

pub(super) fn headers_json(headers: &serde_json::Map<String, serde_json::Value>) -> Result<String> {
    serde_json::to_string(headers).map_err(|e| Error::Codec {
        content_type: "application/json".into(),
        source: e.into(),
    })
}

/// The limits every outbox store takes: a record retired after `max_attempts` (at least 1)
/// failed publishes, leased for `lease` (at least 1 ms) by `pending`.
pub(crate) fn check_limits(max_attempts: u32, lease: Duration) -> Result<()> {
    if max_attempts == 0 {
        return Err(Error::invalid("max_attempts must be at least 1"));
    }
    if lease.as_millis() == 0 {
        return Err(Error::invalid(format!(
            "the outbox lease must be at least 1 ms, got {lease:?}"
        )));
    }
    Ok(())
}
