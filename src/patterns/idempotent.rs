//! The idempotent consumer: at-least-once delivery made harmless.
//!
//! [`idempotent`] wraps any [`Handler`]. For each message it takes a key (the `x-acemq-id` by
//! default, or a natural key from [`Idempotent::key`]) and asks the store:
//!
//! * first time ([`Claim::Claimed`]) → the handler runs; on accept the claim is confirmed;
//! * duplicate ([`Claim::Duplicate`]: confirmed before) → accepted without running the
//!   handler — a duplicate is not an alarm, and settles exactly like a real run; the wrapper
//!   counts it ([`Idempotent::duplicates`]) and reports it to its observer
//!   ([`Observer::duplicate`], set with [`Idempotent::observer`]);
//! * in progress ([`Claim::InProgress`]: claimed by someone whose lease still holds) →
//!   [`Outcome::InProgress`] so it comes back later without spending an attempt.
//!
//! Wrapped around a batched handler (the batched [`idempotent_tx`] behind a chain, say), it
//! passes the batching on: each message of a batch is claimed on its own, the claimed ones are
//! handed on in one batch, and each claim is then confirmed or given back by its own message's
//! result.
//!
//! When the handler does not accept — an `Err`, a panic, or any other outcome — the claim is
//! **given back** ([`release`](IdempotencyStore::release), fenced by the claim's token) before
//! the outcome is returned, so the retry really runs and the retry policy and dead-letter queue
//! are reached as without the wrapper. A worker whose lease ran out mid-handler and was taken
//! over gives back nothing of its successor's, and a receipt is never given back. The one
//! exception: a retry because a deadline inside this wrapper
//! ([`with_timeout`](crate::patterns::chain::with_timeout)) gave up on a handler that still runs. Then
//! the claim is held until that orphan ends (confirmed if it accepted, given back if not), and
//! meanwhile the key is in progress, so the retry never runs beside the orphan.
//!
//! A store with only `first_time` (no claims) works too, but cannot tell work in progress from
//! work done: a redelivery while the first delivery is still running is taken for a duplicate.
//!
//! # What the plain form does not guarantee
//!
//! The effect and the confirmation are two steps: a crash after the effect and before the
//! confirmation runs the effect again once the claim's lease runs out. [`idempotent_tx`]
//! closes that gap for effects in the database.
//!
//! # The transactional form
//!
//! [`idempotent_tx`] opens a database transaction (the driver's own: `rusqlite::Transaction`,
//! `postgres::Transaction`), claims the key **on it**, runs the handler with the same
//! transaction, confirms the receipt on it and commits; the message is acknowledged only after
//! the commit. The handler can record the messages it causes in the outbox on that transaction
//! ([`SqlOutboxStore::add`](crate::patterns::outbox::SqlOutboxStore::add)): they are published by the
//! relay if and only if the work commits. So the receipt commits if and only if the work does:
//! a crash between the commit and the acknowledgement leads to a redelivery that finds the
//! receipt and is acknowledged without running the effect again. Effects **outside** the
//! database (an e-mail, an HTTP call, a publish) are not covered: they can still happen twice.
//!
//! # Batches
//!
//! [`IdempotentTx::batch`] runs up to `max_messages` messages in **one** transaction and
//! commits once, which is what makes the transactional form fast on a database whose commit
//! costs an `fsync`. Handed to a consumer directly, the wrapper asks the consumer's worker to
//! gather the batch ([`Handler::batch_limits`]); called through [`Handler::handle`] (inside
//! another handler), it gathers the calls of the consumer's concurrent workers instead. Either
//! way: the batch's keys are claimed on the transaction under one fresh token; each claimed
//! message's handler runs, and one that fails (an `Err`, a panic, any outcome but accept, an
//! SQL error) has its work rolled back alone and takes the retry / dead-letter path alone, its
//! claim given back (a batch runs without savepoints until a handler fails, then again from the
//! start with a savepoint per message: the handlers before the failure run twice, their first
//! run rolled back — see [`IdempotentTx::batch`]); the receipts of the accepted are written on
//! the same transaction; one commit; and only then is any message of the batch handed back to
//! the consumer for acknowledgement — so no acknowledgement, `multiple` or not, covers an
//! uncommitted effect. A crash before the commit redelivers the batch with nothing applied;
//! after it, every redelivery finds its receipt and is a duplicate.
//!
//! For the plain form over a [`SqlIdempotencyStore`](crate::patterns::idempotency::SqlIdempotencyStore),
//! [`group_commit`](crate::patterns::idempotency::SqlIdempotencyStoreOptions::group_commit) lets the
//! claims and confirms of concurrent workers share commits.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::consume::{Handler, HandlerResult, Outcome};
use crate::envelope::Message;
use crate::error::BoxError;
use crate::error::FatalError;
use crate::observe::{Duplicate, LogObserver, Observer};
use crate::patterns::chain::orphans::{self, End};
use crate::patterns::idempotency::{Claim, ClaimToken, IdempotencyStore};

type KeyFn = Box<dyn Fn(&Message) -> Result<String, BoxError> + Send + Sync>;

/// The number of duplicates an idempotent wrapper absorbed, shared with it: take it with
/// [`Idempotent::duplicates`] before the wrapper moves into a consumer.
#[derive(Clone, Debug, Default)]
pub struct DuplicateCount(Arc<AtomicU64>);

impl DuplicateCount {
    /// Duplicates absorbed so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What the wrappers keep to report duplicates.
struct Duplicates {
    observer: Arc<dyn Observer>,
    count: DuplicateCount,
}

impl Default for Duplicates {
    fn default() -> Self {
        Duplicates {
            observer: Arc::new(LogObserver),
            count: DuplicateCount::default(),
        }
    }
}

impl Duplicates {
    /// Counts and reports a duplicate of `key`; the outcome is an accept, as for a real run.
    fn absorbed(&self, key: &str, m: &Message) -> HandlerResult {
        let duplicates = self.count.0.fetch_add(1, Ordering::Relaxed) + 1;
        self.observer.duplicate(&Duplicate {
            key,
            message_id: m.id(),
            attempt: m.envelope.attempt,
            duplicates,
        });
        Ok(Outcome::Accept)
    }
}

/// Wraps `handler` so that each key's effect is applied once. See the [module docs](self).
///
/// ```no_run
/// use acemq_amqp::patterns::idempotent::idempotent;
/// use acemq_amqp::patterns::idempotency::InMemoryIdempotencyStore;
/// use acemq_amqp::{Connection, Message, Outcome};
/// # fn main() -> acemq_amqp::Result<()> {
/// let connection = Connection::open("amqp://127.0.0.1")?;
/// let handler = idempotent(InMemoryIdempotencyStore::default(), |m: &Message| {
///     println!("charging for {}", m.id());
///     Ok(Outcome::Accept)
/// })
/// .key(|m: &Message| Ok(m.payload::<serde_json::Value>()?["order_id"].to_string()));
/// let consumer = connection.consume("payments", handler)?;
/// # consumer.close()?; Ok(()) }
/// ```
pub fn idempotent<S, H>(store: S, handler: H) -> Idempotent<S, H>
where
    S: IdempotencyStore,
    H: Handler,
{
    Idempotent {
        store,
        handler,
        key: None,
        in_progress_delay: Duration::from_secs(5),
        duplicates: Duplicates::default(),
        held: Mutex::new(Vec::new()),
    }
}

/// A handler made idempotent by [`idempotent`].
pub struct Idempotent<S, H> {
    store: S,
    handler: H,
    key: Option<KeyFn>,
    in_progress_delay: Duration,
    duplicates: Duplicates,
    /// Claims held for handlers that overran a deadline inside this wrapper and run on as
    /// orphans: given back (or confirmed) once they end, not before (see [`Held`]).
    held: Mutex<Vec<Held>>,
}

/// A claim held for orphaned handlers (a deadline inside the wrapper gave up on them, so the
/// message's outcome is a retry, while they still work on it): given back only once they have
/// all ended — confirmed instead if one of them accepted — so that the retry cannot run beside
/// them. Meanwhile a message with the key is in progress (until the claim's lease runs out).
struct Held {
    key: String,
    token: ClaimToken,
    /// Each orphan, and the place of this message in what it was given (`None`: not known,
    /// taken as not accepted).
    orphans: Vec<(Arc<End>, Option<usize>)>,
}

impl Held {
    /// `Some(accepted)` once every orphan has ended: whether one of them accepted the message.
    fn ended(&self) -> Option<bool> {
        let mut accepted = false;
        for (end, place) in &self.orphans {
            let each = end.ended()?;
            accepted |= place.and_then(|i| each.get(i).copied()).unwrap_or(false);
        }
        Some(accepted)
    }
}

/// The most claims one wrapper holds for orphans; past it a claim is left to run out its lease
/// (a store without claims: given back at once, as without a deadline).
const MAX_HELD: usize = 1024;

fn accepted(result: &std::thread::Result<HandlerResult>) -> bool {
    matches!(result, Ok(Ok(Outcome::Accept)))
}

impl<S, H> Idempotent<S, H> {
    /// Takes the key from the message (e.g. an order id from the payload) instead of its
    /// `x-acemq-id`. A key function that fails rejects the message (it can never succeed).
    pub fn key<K>(mut self, key: K) -> Self
    where
        K: Fn(&Message) -> Result<String, BoxError> + Send + Sync + 'static,
    {
        self.key = Some(Box::new(key));
        self
    }

    /// How long a message claimed by someone else waits before it comes back. Defaults to 5 s.
    pub fn in_progress_delay(mut self, delay: Duration) -> Self {
        self.in_progress_delay = delay;
        self
    }

    /// Where absorbed duplicates are reported ([`Observer::duplicate`]); give it the observer
    /// the connection has. Defaults to [`LogObserver`] (a debug line).
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.duplicates.observer = crate::observe::Guarded::wrap(observer);
        self
    }

    /// The count of duplicates this wrapper absorbed (a shared handle: it goes on counting
    /// after the wrapper moved into a consumer).
    pub fn duplicates(&self) -> DuplicateCount {
        self.duplicates.count.clone()
    }
}

/// The key of a message, or the outcome that ends it (no usable key).
///
/// Without a key function the key is the message id, which is never empty: a message without
/// `x-acemq-id` and `message_id` reads with an id derived from the delivery, the same on every
/// redelivery. A key function can still return an empty key: that message can never be
/// deduplicated, so it is refused (fatal, to `.dlq`) without running the handler.
fn key_of(key: &Option<KeyFn>, m: &Message) -> Result<String, BoxError> {
    match key {
        Some(f) => {
            let k = f(m)
                .map_err(|e| FatalError::new(format!("cannot compute the idempotency key: {e}")))?;
            if k.is_empty() {
                return Err(Box::new(FatalError::new(
                    "the key function returned an empty idempotency key",
                )));
            }
            Ok(k)
        }
        None => Ok(m.id().to_string()),
    }
}

impl<S: IdempotencyStore, H> Idempotent<S, H> {
    /// The claim of `key`. A store with claims answers in progress by itself while a claim
    /// held for orphans lasts (until its lease runs out, as for any handler); for one without,
    /// whose `first_time` would take the key for done, the key is in progress while held.
    fn claim(&self, key: &str) -> crate::Result<Claim> {
        if self.store.supports_claims() {
            return self.store.claim(key);
        }
        if self.held.lock().iter().any(|h| h.key == key) {
            return Ok(Claim::InProgress);
        }
        Ok(if self.store.first_time(key)? {
            Claim::Claimed(ClaimToken::new())
        } else {
            Claim::Duplicate
        })
    }

    /// The claim after its handler: confirmed when it accepted; else held while `orphans`
    /// run, or given back now.
    fn settle(
        &self,
        key: String,
        token: ClaimToken,
        accepted: bool,
        orphans: Vec<(Arc<End>, Option<usize>)>,
    ) {
        if accepted {
            self.confirm(&key, &token);
            return;
        }
        if !orphans.is_empty() {
            let mut held = self.held.lock();
            if held.len() < MAX_HELD {
                held.push(Held {
                    key,
                    token,
                    orphans,
                });
                return;
            }
            drop(held);
            if self.store.supports_claims() {
                log::warn!(
                    "acemq: {MAX_HELD} claims are held for handlers still running past their \
                     deadline; the claim on {key:?} is left to run out its lease"
                );
                return;
            }
            log::warn!(
                "acemq: {MAX_HELD} keys are held for handlers still running past their \
                 deadline; {key:?} is given back while its handler may still run"
            );
        }
        self.give_back(&key, &token);
    }

    /// Confirms or gives back the claims held for orphans that have ended.
    fn sweep(&self) {
        let ended: Vec<(Held, bool)> = {
            let mut held = self.held.lock();
            if held.is_empty() {
                return;
            }
            let mut ended = Vec::new();
            let mut i = 0;
            while i < held.len() {
                match held[i].ended() {
                    Some(accepted) => ended.push((held.swap_remove(i), accepted)),
                    None => i += 1,
                }
            }
            ended
        };
        for (held, accepted) in ended {
            if accepted {
                self.confirm(&held.key, &held.token);
            } else {
                self.give_back(&held.key, &held.token);
            }
        }
    }

    fn confirm(&self, key: &str, token: &ClaimToken) {
        if let Err(e) = self.store.confirm(key, token) {
            // The effect is done; the claim expires by itself.
            log::warn!("acemq: confirming {key:?} failed (the claim will expire): {e}");
        }
    }

    /// Gives the claim back before the retry is issued, so that the retry runs. For a store
    /// without claims this forgets the key (`first_time` recorded it as done).
    fn give_back(&self, key: &str, token: &ClaimToken) {
        let given_back = if self.store.supports_claims() {
            self.store.release(key, token)
        } else {
            self.store.forget(key)
        };
        if let Err(e) = given_back {
            log::warn!("acemq: giving back the claim on {key:?} failed: {e}");
        }
    }
}

impl<S, H> Handler for Idempotent<S, H>
where
    S: IdempotencyStore,
    H: Handler,
{
    fn ordering(&self) -> Option<&crate::consume::OrderBy> {
        self.handler.ordering()
    }

    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.handler.batch_limits()
    }

    fn handle(&self, m: &Message) -> HandlerResult {
        self.sweep();
        let key = key_of(&self.key, m)?;
        match self.claim(&key)? {
            Claim::Duplicate => self.duplicates.absorbed(&key, m),
            Claim::InProgress => Ok(Outcome::in_progress(self.in_progress_delay)),
            Claim::Claimed(token) => {
                let (result, orphans) =
                    orphans::watch(|| catch_unwind(AssertUnwindSafe(|| self.handler.handle(m))));
                let orphans = orphans.into_iter().map(|end| (end, Some(0))).collect();
                self.settle(key, token, accepted(&result), orphans);
                match result {
                    Ok(r) => r,
                    Err(panic) => resume_unwind(panic),
                }
            }
        }
    }

    /// Each message claimed on its own, as in [`handle`](Self::handle); the claimed ones
    /// handed to the inner handler's `handle_batch` in one call; each claim then confirmed or
    /// given back by its own message's result. A key twice in one batch: the second message
    /// is in progress.
    fn handle_batch(&self, messages: &[&Message]) -> Vec<std::thread::Result<HandlerResult>> {
        self.sweep();
        let mut results: Vec<Option<std::thread::Result<HandlerResult>>> =
            messages.iter().map(|_| None).collect();
        let mut claimed: Vec<(usize, String, ClaimToken)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, m) in messages.iter().enumerate() {
            let answer = match key_of(&self.key, m) {
                Err(e) => Err(e),
                Ok(key) if !seen.insert(key.clone()) => {
                    Ok(Outcome::in_progress(self.in_progress_delay))
                }
                Ok(key) => match self.claim(&key) {
                    Err(e) => Err(e.into()),
                    Ok(Claim::Duplicate) => self.duplicates.absorbed(&key, m),
                    Ok(Claim::InProgress) => Ok(Outcome::in_progress(self.in_progress_delay)),
                    Ok(Claim::Claimed(token)) => {
                        claimed.push((i, key, token));
                        continue;
                    }
                },
            };
            results[i] = Some(Ok(answer));
        }
        if !claimed.is_empty() {
            let to_run: Vec<&Message> = claimed.iter().map(|(i, ..)| messages[*i]).collect();
            let (ran, orphans) = orphans::watch(|| {
                catch_unwind(AssertUnwindSafe(|| self.handler.handle_batch(&to_run)))
            });
            let of = |place: Option<usize>| -> Vec<(Arc<End>, Option<usize>)> {
                orphans.iter().map(|end| (end.clone(), place)).collect()
            };
            match ran {
                Ok(ran) if ran.len() == claimed.len() => {
                    for (j, ((i, key, token), result)) in claimed.into_iter().zip(ran).enumerate() {
                        self.settle(key, token, accepted(&result), of(Some(j)));
                        results[i] = Some(result);
                    }
                }
                Ok(ran) => {
                    let wrong = format!(
                        "the batch handler returned {} results for {} messages",
                        ran.len(),
                        claimed.len()
                    );
                    for (i, key, token) in claimed {
                        self.settle(key, token, false, of(None));
                        results[i] = Some(Ok(Err(wrong.clone().into())));
                    }
                }
                Err(panic) => {
                    for (_, key, token) in claimed {
                        self.settle(key, token, false, of(None));
                    }
                    resume_unwind(panic);
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Ok(Err("no result for the message".into()))))
            .collect()
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::batch::IdempotentTxBatch;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use self::transactional::{idempotent_tx, IdempotentTx};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod batch;

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod transactional {
    use super::*;
    use crate::patterns::idempotency::SqlIdempotencyStore;
    use crate::sql::{SqlTransaction, Transactional};

    /// The transactional idempotent consumer: claim, effect and receipt in one database
    /// transaction, committed before the message is acknowledged. See the
    /// [module docs](super).
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
    /// use acemq_amqp::patterns::idempotent::idempotent_tx;
    /// use acemq_amqp::patterns::relay::record;
    /// use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
    /// use acemq_amqp::patterns::outbox::SqlOutboxStore;
    /// use acemq_amqp::sql::{checkout, CheckIdle, PostgresConnectionManager};
    /// use acemq_amqp::{Connection, JsonCodec, Message, Outcome};
    ///
    /// let config: postgres::Config = "host=127.0.0.1 user=postgres dbname=shop".parse()?;
    /// let pool = r2d2::Pool::new(CheckIdle::new(PostgresConnectionManager::new(
    ///     config,
    ///     postgres::NoTls,
    /// )))?;
    /// let receipts = Arc::new(SqlIdempotencyStore::open(checkout(&pool), SqlIdempotencyStoreOptions::default())?);
    /// let outbox = SqlOutboxStore::builder(checkout(&pool)).build()?;
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
            key: None,
            in_progress_delay: Duration::from_secs(5),
            duplicates: Duplicates::default(),
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
        /// Takes the key from the message instead of its `x-acemq-id`.
        pub fn key<K>(mut self, key: K) -> Self
        where
            K: Fn(&Message) -> Result<String, BoxError> + Send + Sync + 'static,
        {
            self.key = Some(Box::new(key));
            self
        }

        /// How long a message claimed elsewhere waits before it comes back. Defaults to 5 s.
        pub fn in_progress_delay(mut self, delay: Duration) -> Self {
            self.in_progress_delay = delay;
            self
        }

        /// Where absorbed duplicates are reported ([`Observer::duplicate`]). Defaults to
        /// [`LogObserver`].
        pub fn observer(mut self, observer: impl Observer) -> Self {
            self.duplicates.observer = crate::observe::Guarded::wrap(observer);
            self
        }

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
}
