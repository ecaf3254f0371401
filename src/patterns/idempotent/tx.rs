//! The transactional idempotent consumer: [`idempotent_tx`], claim, effect and receipt in one
//! database transaction.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::duplicates::{key_of, DuplicateCount, Duplicates, KeyFn};
use super::options::IdempotentOptions;
use crate::consume::{Handler, HandlerResult, Outcome};
use crate::envelope::Message;
use crate::patterns::idempotency::Claim;
use crate::patterns::idempotency::SqlIdempotencyStore;
use crate::sql::{SqlTransaction, Transactional};

/// The transactional idempotent consumer: claim, effect and receipt in one database
/// transaction, committed before the message is acknowledged. See the
/// [module docs](crate::patterns::idempotent).
///
/// `connect` opens (or checks out) a connection for each message: a
/// `rusqlite::Connection`, a `postgres::Client`, or an r2d2 checkout of either
/// ([`sql::checkout`](crate::sql::checkout)). The handler runs on **the driver's own
/// transaction** (`rusqlite::Transaction`, `postgres::Transaction`; see
/// [`Transactional`]), so it writes its business SQL with the driver's API, and passes the
/// same transaction to the stores that write on the caller's transaction, such as
/// [`SqlOutboxStore::add`](crate::patterns::outbox::SqlOutboxStore::add) to record the next
/// message. Only [`Outcome::Accept`] commits; anything else rolls back, claim included.
///
/// A connection that fails at `BEGIN`, before the handler ran, is replaced by another (up
/// to three) without spending the message's delivery attempt.
///
/// ```no_run
/// # #[cfg(feature = "postgres")]
/// # fn main() -> acemq_amqp::Result<()> {
/// use std::sync::Arc;
/// use acemq_amqp::patterns::idempotent::{idempotent_tx, IdempotentOptions};
/// use acemq_amqp::patterns::outbox::record;
/// use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
/// use acemq_amqp::patterns::outbox::{SqlOutboxStore, SqlOutboxStoreOptions};
/// use acemq_amqp::sql::{checkout, CheckIdle, PostgresConnectionManager};
/// use acemq_amqp::{Connection, JsonCodec, Message, Outcome};
///
/// let config: postgres::Config = "host=127.0.0.1 user=postgres dbname=shop".parse()?;
/// let pool = r2d2::Pool::new(CheckIdle::new(PostgresConnectionManager::new(
///     config,
///     postgres::NoTls,
/// )))?;
/// let receipts = Arc::new(SqlIdempotencyStore::open(checkout(&pool), SqlIdempotencyStoreOptions::default())?);
/// let outbox = SqlOutboxStore::open(checkout(&pool), SqlOutboxStoreOptions::default())?;
/// let handler = idempotent_tx(
///     receipts,
///     checkout(&pool),
///     move |m: &Message, tx: &mut postgres::Transaction<'_>| {
///         let order: serde_json::Value = m.payload()?;
///         let id = order["id"].as_str().unwrap_or_default();
///         tx.execute("UPDATE orders SET paid = true WHERE id = $1", &[&id])?;
///         outbox.add(tx, &record(&JsonCodec, "shop", "order.paid", &order)?)?;
///         Ok(Outcome::Accept)
///     },
///     IdempotentOptions::default(),
/// );
/// let connection = Connection::open("amqp://127.0.0.1")?;
/// let consumer = connection.consume("payments", handler)?;
/// # consumer.close()?; Ok(()) }
/// # #[cfg(not(feature = "postgres"))]
/// # fn main() {}
/// ```
pub fn idempotent_tx<F, C, H>(
    store: Arc<SqlIdempotencyStore>,
    connect: F,
    handler: H,
    options: IdempotentOptions,
) -> IdempotentTx<F, H>
where
    F: Fn() -> crate::Result<C> + Send + Sync,
    C: Transactional,
    H: Fn(&Message, &mut C::Transaction<'_>) -> HandlerResult + Send + Sync,
{
    IdempotentTx {
        store,
        connect,
        handler,
        key: options.key,
        in_progress_delay: options.in_progress_delay,
        duplicates: options.duplicates,
    }
}

/// A handler made transactional and idempotent by [`idempotent_tx`].
pub struct IdempotentTx<F, H> {
    pub(super) store: Arc<SqlIdempotencyStore>,
    pub(super) connect: F,
    pub(super) handler: H,
    pub(super) key: Option<KeyFn>,
    pub(super) in_progress_delay: Duration,
    pub(super) duplicates: Duplicates,
}

impl<F, H> IdempotentTx<F, H> {
    /// The count of duplicates this wrapper absorbed (a shared handle).
    pub fn duplicates(&self) -> DuplicateCount {
        self.duplicates.count.clone()
    }
}

/// How many connections one message may try at `BEGIN` before its handler runs.
pub(super) const BEGIN_TRIES: usize = 3;

pub(super) fn rollback<T: SqlTransaction>(tx: T) {
    if let Err(e) = tx.rollback() {
        log::warn!("acemq: rollback failed: {e}");
    }
}

impl<F, C, H> Handler for IdempotentTx<F, H>
where
    F: Fn() -> crate::Result<C>,
    C: Transactional,
    H: Fn(&Message, &mut C::Transaction<'_>) -> HandlerResult,
{
    fn handle(&self, m: &Message) -> HandlerResult {
        let key = key_of(&self.key, m)?;
        // A connection that fails at BEGIN (one the server killed, say in a restart, that
        // a pool handed out) is dropped and the step retried on another, so that it does
        // not cost the message a delivery attempt: the handler has not run. A failing
        // checkout is returned at once (a pool has already waited its checkout timeout).
        let mut tries = 0;
        loop {
            tries += 1;
            let mut conn = (self.connect)()?;
            let begun = conn.begin();
            match begun {
                Ok(tx) => return self.run(m, &key, tx),
                Err(e) if tries < BEGIN_TRIES => {
                    log::warn!("acemq: BEGIN failed, trying another connection: {e}");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl<F, H> IdempotentTx<F, H> {
    /// Claim, handler, receipt and commit on `tx`.
    fn run<T>(&self, m: &Message, key: &str, mut tx: T) -> HandlerResult
    where
        T: SqlTransaction,
        H: Fn(&Message, &mut T) -> HandlerResult,
    {
        let claim = match self.store.claim_in(&mut tx, key) {
            Ok(c) => c,
            Err(e) => {
                rollback(tx);
                return Err(e.into());
            }
        };
        match claim {
            Claim::Duplicate => {
                rollback(tx);
                self.duplicates.absorbed(key, m)
            }
            Claim::InProgress => {
                rollback(tx);
                Ok(Outcome::in_progress(self.in_progress_delay))
            }
            Claim::Claimed(token) => {
                let result = catch_unwind(AssertUnwindSafe(|| (self.handler)(m, &mut tx)));
                if !matches!(result, Ok(Ok(Outcome::Accept))) {
                    // The claim and the work vanish together.
                    rollback(tx);
                    return match result {
                        Ok(r) => r,
                        Err(panic) => resume_unwind(panic),
                    };
                }
                if let Err(e) = self.store.confirm_in(&mut tx, key, &token) {
                    rollback(tx);
                    return Err(e.into());
                }
                tx.commit()?;
                Ok(Outcome::Accept)
            }
        }
    }
}
