//! The acknowledged consumer: commit an effect and its receipt in one transaction, then
//! acknowledge.
//!
//! A broker-neutral recipe: deliveries come from a [`Source`], their effects are applied in
//! batches by an [`ApplyBatch`] store that records one *receipt* per message identity in the
//! same database transaction as the effect, and only after that transaction has committed is
//! each delivery acknowledged through an [`Acknowledge`]. A redelivered message finds its receipt
//! and is acknowledged again without repeating its effect. Nothing here needs a broker: the
//! demonstration (`cargo run --example acknowledged_consumer`) runs on a temporary SQLite file.
//!
//! ```
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> acemq_amqp::Result<()> {
//! use acemq_amqp::patterns::acknowledged::{
//!     consume, ConsumeOptions, CounterIncrement, CounterStore, Delivery, IterSource,
//! };
//! let dir = std::env::temp_dir().join(format!("acemq-ack-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).map_err(|e| acemq_amqp::Error::Io {
//!     context: "creating a directory".into(),
//!     source: e,
//! })?;
//! let store = CounterStore::builder(dir.join("counters.db")).build()?;
//! store.create_tables()?;
//! let hit = CounterIncrement::new("page_views", 1).message("tenant-a/view/42");
//! // The same message delivered twice, with different delivery tokens.
//! let source = IterSource::new(vec![
//!     Delivery::new(hit.clone(), 1_u64),
//!     Delivery::new(hit, 2_u64),
//! ]);
//! let mut acked = Vec::new();
//! let acknowledge = |d: &Delivery<u64>| {
//!     acked.push(d.acknowledgement_token);
//!     Ok(())
//! };
//! let options = ConsumeOptions::new().batch_size(32).max_pending(64);
//! let report = consume(source, &store, acknowledge, options)?;
//! assert_eq!((report.acknowledged, report.replayed, report.failed), (2, 1, 0));
//! assert_eq!(acked, [1, 2]);
//! assert_eq!(store.value("page_views")?, 1);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! # Names shared with the crate root
//!
//! This module keeps the recipe's own names, [`Message`], [`Delivery`] and
//! [`consume`], though the crate root has types and a module of the same names. They are
//! different things; import this module's by path (`acknowledged::Message`) where both are in
//! scope.
//!
//! * [`Message`] here is broker-neutral: an `identifier` (the business identity the receipt is
//!   kept under) and the payload bytes (whose SHA-256 the receipt records). The crate root's
//!   [`crate::Message`] is an AMQP message: body, properties and the family's `x-acemq-`
//!   envelope. Over AMQP, [`AmqpQueue`] makes one of these from each received
//!   [`crate::Message`]: the identifier `{queue}/{message id}`, the payload its body.
//! * [`Delivery`] here is a [`Message`] with the token that acknowledges one delivery attempt.
//!   The crate root has no `Delivery`: its consumer hands a handler a `&crate::Message` and
//!   settles the delivery itself. Over AMQP the token is an [`AmqpToken`], which holds
//!   amiquip's `Delivery`.
//! * A [`Batcher`] (and so [`consume_with`]) is stopped with the crate's one
//!   [`StopHandle`](crate::StopHandle)(crate::StopHandle), as a consumer is; stopping it is final for its batcher
//!   (later runs return as soon as they start).
//! * [`consume`] here is a function: it applies batches in one transaction each, acknowledges
//!   after the commit, runs on the caller's thread until the source ends or is stopped, and
//!   returns a [`Report`]. The crate's AMQP consumer runtime is
//!   elsewhere: [`Connection::consume`](crate::Connection::consume) starts
//!   one: a handler per message on worker threads, settled by its [`Outcome`](crate::Outcome)
//!   (retry, dead-letter, park).
//!
//! # Messages, identities and tokens
//!
//! A [`Message`] has an `identifier` and a `payload`. The identifier is the message's immutable
//! business identity: the same on every replay, and scoped by whoever builds it (source, topic,
//! tenant, operation: `"billing/tenant-7/charge/9912"`), because the receipt table is one
//! namespace. A [`Delivery`] pairs a message with the `acknowledgement_token` of one delivery
//! attempt; the token may change on redelivery (an AMQP delivery tag does) and is what the
//! [`Acknowledge`] implementation needs to acknowledge *that* attempt.
//!
//! The receipt records the SHA-256 of the payload. A replay whose payload differs is not a
//! replay but an identity reused by mistake: it fails its batch (see below) rather than being
//! acknowledged as done.
//!
//! # The pieces
//!
//! * [`Batcher`] (reusable on its own): takes items from a [`Source`], forms batches of up to
//!   `batch_size`, runs each batch on one worker thread (`acemq-ack-worker`), and hands back one
//!   outcome per item, in order ([`Batcher::map_outcomes`], or per batch with
//!   [`Batcher::run_batches`]). Intake is bounded: at most `max_pending` items are taken from
//!   the source and not yet handed back (the callback holding a batch counts them until it
//!   returns). A batch is dispatched when it is full, or as soon as the worker is free and the
//!   source has nothing ready, so batches grow under load and stay small when traffic is light.
//! * [`BatchStore`] (on the [`Sql`](crate::sql::Sql) seam, SQLite or PostgreSQL): runs a
//!   user-supplied [`Effect`] for each new message inside one transaction per batch and keeps
//!   the receipts. This is also the batched form of the transactional idempotent consumer
//!   ([`BatchStore::apply_batch_in`] runs on the caller's transaction).
//! * [`CounterStore`] (SQLite): the demonstration effect, a named counter incremented by each
//!   message, on a file-backed database in WAL mode with `synchronous=FULL`.
//! * [`consume`] (with [`ConsumeOptions`]: `batch_size`, `max_pending`) / [`consume_with`]
//!   (with a configured [`Batcher`]): the recipe; returns a [`Report`].
//!
//! # One batch, one transaction
//!
//! For each batch the store, in one transaction: (1) looks up the receipts of the batch's
//! identities; (2) for a replay, checks the payload's hash and returns the earlier outcome
//! ([`Receipt::Replayed`]); (3) for a new message, runs the effect and writes the receipt
//! ([`Receipt::Applied`]); (4) commits, before any outcome is returned. An identity reused with
//! a different payload, an effect that refuses an item (a bad counter name, an unauthorised
//! counter, an overflow), or any database error rolls back the **whole batch**: none of its
//! effects or receipts stay ([`ApplyBatch`] is all or nothing). Earlier batches stay committed.
//!
//! # One message that fails, fails alone
//!
//! [`consume`] then applies the rolled-back batch's messages **again, one at a time** (one
//! transaction each, on the worker): those that commit are acknowledged, and only those that
//! fail alone stay unacknowledged, so a message that can never be applied does not take its
//! batchmates down with it (the cost, a transaction per message, is paid only for a batch that
//! failed). Each failure is counted in [`Report::failed`], and the acknowledgement is told
//! whose fault it was:
//!
//! * [`Acknowledge::rejected`], one delivery at a time, when it was the message's own: the
//!   store refused it ([`Error::InvalidArgument`], [`Error::InvalidName`],
//!   [`Error::InvalidHeader`], [`Error::Codec`] — it fails the same way every time), or it
//!   failed while another message of its batch committed (the database was up), or it failed
//!   with anything else (a database error, a panicking effect) while none of its batch
//!   committed and the store, asked once ([`ApplyBatch::check_up`]: [`BatchStore`] and
//!   [`CounterStore`] commit an empty transaction), says it is up — so a message whose effect
//!   always fails with a database error is rejected even when it is alone in every batch (at
//!   a low rate, the usual case).
//! * [`Acknowledge::failed`], for the rest: the same failures while the store is not up (or
//!   cannot tell: `check_up`'s default) — an outage is nobody's fault in particular. Once the
//!   first two messages of a batch tried alone have failed that way and none committed, the
//!   rest of the batch is not tried one by one (an outage is not made longer by a transaction
//!   per message).
//!
//! A panicking effect is caught around each transaction (which rolls back as the panic
//! unwinds) and fails its message like an error.
//!
//! What becomes of them is the acknowledgement's choice (by default nothing: they wait for the
//! broker to take them back); over AMQP they are requeued after a backoff, and a delivery
//! rejected [`AmqpQueue::dead_letter_after`] times goes to `{queue}.dlq` (see *Rolled-back
//! deliveries over AMQP* below). Consumption goes on with the next batch.
//!
//! # Crash and cancellation boundaries
//!
//! The receipt is the only record of "done"; the acknowledgement only tells the broker it may
//! forget the delivery. So every boundary resolves to "applied once, acknowledged at least
//! once":
//!
//! 1. **Crash before the commit.** The transaction never happened: no effect, no receipt. The
//!    broker still holds the deliveries (unacknowledged) and redelivers them; they are applied
//!    then, once.
//! 2. **Crash after the commit, before the acknowledgement.** The effect and the receipt are
//!    durable (`synchronous=FULL` on SQLite), the deliveries are not acknowledged. They are
//!    redelivered with new tokens, find their receipts, are reported as replayed and
//!    acknowledged; the effect is not repeated.
//! 3. **Acknowledgement sent, response lost** (the connection drops around a `basic.ack`). The
//!    broker may or may not have taken it. If it did not, the delivery comes back and is a replay
//!    as in case 2. The error is returned from [`consume`]; that is not data loss.
//! 4. **A later item fails.** A failing item rolls back its own batch only, and its batchmates
//!    are then applied one at a time (above). Earlier batches were
//!    committed and are acknowledged (or, if the acknowledgement fails, replayed later as in case
//!    2). Items of later batches are processed as usual. When an *acknowledgement* fails,
//!    [`consume`] stops taking deliveries, lets the batches already on the worker finish (they
//!    commit, but are not acknowledged), drops the items not yet dispatched without applying
//!    them, closes the source and returns the error: everything not acknowledged is redelivered
//!    and resolves as case 1 or 2.
//!
//! Cancellation through a [`StopHandle`](crate::StopHandle) is an orderly version of the same: the batcher stops
//! taking deliveries, applies and acknowledges every delivery it has already taken, closes the
//! source and returns the report. A source error does the same and then returns the error. In
//! every case, including a panic in the acknowledgement callback, the source is closed
//! ([`Source::close`]) and the worker thread is joined before `consume` returns.
//!
//! Receipts are kept until [`BatchStore::purge`] deletes them; an identity whose receipt was
//! purged is applied again if it is ever redelivered, so keep receipts longer than the broker
//! may redeliver (for RabbitMQ: longer than any message can sit in a queue).
//!
//! # Fitting a broker
//!
//! * [`Source::poll`] waits at most the given timeout and answers [`Polled::Idle`] when nothing
//!   came, so a consumer blocked on an idle queue still notices its stop handle (every
//!   `poll_interval`, 100 ms by default). The token type is the source's choice (for AMQP, a
//!   delivery tag with a channel generation).
//! * [`Acknowledge::acknowledge_batch`] receives the acknowledged deliveries of one batch in
//!   order, so an AMQP implementation can acknowledge them with one `basic.ack` with
//!   `multiple` where the tags are contiguous. Its default calls
//!   [`Acknowledge::acknowledge`] for each.
//! * The source and the acknowledgement run on the caller's thread and need not be `Send`;
//!   only the items (`Delivery<T>` with `T: Send`) cross to the worker thread.
//! * A run leaves deliveries unacknowledged (rolled back, or taken from the broker but not
//!   applied). Whatever owns the broker's session must keep them out of the next run's
//!   `multiple` acknowledgements and give them back. [`AmqpQueue`] does both: the unsettled
//!   deliveries belong to the queue (its channel), not to one acknowledger, it gives one
//!   source at a time, and closing a source requeues what its run left.
//! * A rolled-back delivery must not stay unacknowledged for the rest of the run: the broker's
//!   prefetch counts it, and once failed batches fill the prefetch nothing more is delivered
//!   and the run idles for ever. [`AmqpQueue`] requeues it after a backoff (below).
//!
//! # Rolled-back deliveries over AMQP: requeued after a backoff
//!
//! [`AmqpQueue`]'s acknowledger holds each delivery of a rolled-back batch for a backoff, and
//! its source requeues it (`basic.nack` with `requeue`, for that delivery's tag only) the next
//! time it is polled after the backoff; a poll never waits past the earliest requeue. The
//! broker then redelivers the message, to this run or to any consumer of the queue, where it is
//! applied, or found done and acknowledged as a replay.
//!
//! * **The backoff** grows with *consecutive* failures: the larger of the failures of the
//!   message's identity since it last committed and the queue's failed batches since its last
//!   committed batch (so it grows for a message that always fails, and for every message while
//!   the database is down). After `n` of them it is `first × 2^(n-1)`, capped at `max`
//!   ([`AmqpQueue::requeue_backoff`]; 200 ms and 30 s by default), times a random factor
//!   between ½ and 1. The random factor brings the deliveries of one failed batch back at
//!   different times, so that a message is not batched again and again with the one that made
//!   its batch fail. A committed batch resets the counts of its identities and the queue's.
//!   The failure counts of at most 4096 identities are kept, with the queue, across runs.
//! * **Nothing spins.** A message that always fails comes back ever more slowly, and once the
//!   backoff is capped at most once every `max / 2`; every failure is counted in
//!   [`Report::failed`] (a message that failed three times counts three) and logged.
//! * **A message that can never be applied is dead-lettered.** After
//!   [`AmqpQueue::dead_letter_after`] failures through its own fault
//!   ([`Acknowledge::rejected`]; 5 by default) a copy goes to `{queue}.dlq` — the family's
//!   dead letter: the same envelope and attempt, the body, `x-acemq-error: exhausted N
//!   attempts: <the error>` and where it was consumed from — and once the broker has confirmed
//!   it the delivery is acknowledged. The first dead letter declares the family's failure
//!   topology (`acemq.dlx`, `{queue}.dlq`, `{queue}.parked`). A copy that cannot be sent is
//!   logged and the delivery held as before: it is tried again after its next failure.
//!   Failures that are nobody's fault in particular (a database outage rolling back whole
//!   batches, and the store's check failing too) never count towards it: an outage delays
//!   messages, it does not dead-letter them. A store of your own that does not implement
//!   [`ApplyBatch::check_up`] cannot tell the two apart when a message fails alone: such a
//!   message keeps backing off.
//! * **No `multiple` covers a held delivery.** It stays in the queue's unsettled set until its
//!   requeue, so the acknowledgement of a later batch covers it neither with nor without
//!   `multiple`. A run that ends first (stopped, or on an error) gives the held deliveries back
//!   with the rest of what it left unacknowledged.
//!
//! Why not the alternatives: holding rolled-back deliveries until the run ends (the earlier
//! behaviour) stops a failing message from looping, but two failed batches can exhaust the
//! prefetch and the run never ends (issue 11, case 6). Requeueing at once would spin a message
//! that always fails. Ending the run with an error would turn a passing database outage into a
//! stopped consumer that its caller must restart, with the same backoff decision moved to every
//! caller; a backoff on the rolled-back deliveries keeps the run going, and a run can still be
//! stopped at any time with its [`StopHandle`](crate::StopHandle).

mod amqp;
mod batcher;
#[cfg(feature = "sqlite")]
mod counter;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod store;

use std::fmt;

use crate::error::{Error, Result};

pub use amqp::{AmqpAcknowledge, AmqpQueue, AmqpSource, AmqpToken};
pub use batcher::{Batcher, BatcherBuilder, IterSource, Polled, Source};
#[cfg(feature = "sqlite")]
pub use counter::{CounterIncrement, CounterStore, CounterStoreBuilder};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub use store::{BatchStore, BatchStoreBuilder, Effect, DEFAULT_RECEIPTS_TABLE};

/// A message as the acknowledged consumer sees it: an immutable identity and a payload.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Message {
    /// The business identity: the same on every replay, scoped by its source, topic, tenant or
    /// operation (the receipt table is one namespace). Must not be empty.
    pub identifier: String,
    /// The payload, as bytes. Its SHA-256 is recorded with the receipt.
    pub payload: Vec<u8>,
}

impl Message {
    /// A message with this identity and payload.
    pub fn new(identifier: impl Into<String>, payload: impl Into<Vec<u8>>) -> Message {
        Message {
            identifier: identifier.into(),
            payload: payload.into(),
        }
    }
}

impl fmt::Debug for Message {
    /// Shows the identifier and the payload's length, never the payload.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("identifier", &self.identifier)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

/// One delivery attempt of a [`Message`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Delivery<T> {
    /// The message.
    pub message: Message,
    /// What acknowledges this attempt (an AMQP delivery tag, an offset, …). May change on
    /// redelivery.
    pub acknowledgement_token: T,
}

impl<T> Delivery<T> {
    /// A delivery of `message` acknowledged by `acknowledgement_token`.
    pub fn new(message: Message, acknowledgement_token: T) -> Delivery<T> {
        Delivery {
            message,
            acknowledgement_token,
        }
    }
}

/// What a store did with one message of a committed batch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Receipt {
    /// New: the effect ran and its receipt was written in the batch's transaction.
    Applied {
        /// The effect's outcome, as recorded.
        outcome: String,
    },
    /// A replay of an identity already done (in an earlier batch, or earlier in this one) with
    /// the same payload: nothing ran; this is the earlier outcome.
    Replayed {
        /// The outcome recorded when it was applied.
        outcome: String,
    },
}

impl Receipt {
    /// The outcome recorded with the receipt.
    pub fn outcome(&self) -> &str {
        match self {
            Receipt::Applied { outcome } | Receipt::Replayed { outcome } => outcome,
        }
    }

    /// True for [`Receipt::Replayed`].
    pub fn is_replay(&self) -> bool {
        matches!(self, Receipt::Replayed { .. })
    }
}

/// A store that applies a batch of messages all or nothing: one [`Receipt`] per message, in
/// order, after its transaction committed.
///
/// Implemented by [`BatchStore`] and [`CounterStore`]. `Sync` because the batch runs on the
/// batcher's worker thread while the caller's thread keeps a reference.
pub trait ApplyBatch: Sync {
    /// Applies `messages` in one transaction and returns one receipt per message, in order,
    /// once it has committed.
    ///
    /// # Errors
    ///
    /// Any error means the whole batch was rolled back (nothing of it stays).
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>>;

    /// Whether the store can commit a transaction now: `Ok` if it can. Asked (at most once per
    /// batch) when messages failed alone with errors that are not refusals and none of the
    /// batch committed — the one case where a message's own failure and an outage look alike.
    /// `Ok` makes the failures the messages' own ([`Acknowledge::rejected`]: counted towards
    /// a dead letter); an error keeps them an outage (nothing rejected).
    ///
    /// Defaults to an error (the store cannot tell): such failures are treated as an outage,
    /// and a message that always fails that way alone is retried, never dead-lettered.
    /// [`BatchStore`] and [`CounterStore`] check by committing an empty transaction.
    ///
    /// # Errors
    ///
    /// The reason the store cannot commit now (or cannot tell).
    fn check_up(&self) -> Result<()> {
        Err(Error::invalid(
            "this store cannot tell whether it is up (ApplyBatch::check_up not implemented)",
        ))
    }
}

impl<S: ApplyBatch + ?Sized> ApplyBatch for &S {
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
        (**self).apply_batch(messages)
    }
    fn check_up(&self) -> Result<()> {
        (**self).check_up()
    }
}

impl<S: ApplyBatch + ?Sized + Send> ApplyBatch for std::sync::Arc<S> {
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
        (**self).apply_batch(messages)
    }
    fn check_up(&self) -> Result<()> {
        (**self).check_up()
    }
}

/// Acknowledges deliveries with the broker, after their batch committed.
///
/// Implemented for closures `FnMut(&Delivery<T>) -> Result<()>`. Runs on the caller's thread
/// (the one running [`consume`]); it need not be `Send`.
pub trait Acknowledge<T> {
    /// Acknowledges this delivery with its own token.
    ///
    /// # Errors
    ///
    /// An error stops the consumer (see the module docs, case 4) and is returned from
    /// [`consume`].
    fn acknowledge(&mut self, delivery: &Delivery<T>) -> Result<()>;

    /// Acknowledges the acknowledged deliveries of one committed batch, in the order they were
    /// taken from the source.
    ///
    /// Defaults to calling [`acknowledge`](Self::acknowledge) for each in turn, stopping at the
    /// first error. A broker adapter may acknowledge them at once (AMQP: `basic.ack` with
    /// `multiple`). Beware that the deliveries of a failed batch stay unacknowledged: a
    /// `multiple` acknowledgement must not cover their tags (nor those of deliveries still
    /// being applied, nor those an earlier run on the same channel left unacknowledged), so use
    /// it only up to a tag below which nothing else is outstanding on that channel, and
    /// acknowledge the rest singly.
    ///
    /// # Errors
    ///
    /// As for [`acknowledge`](Self::acknowledge).
    fn acknowledge_batch(&mut self, deliveries: &[Delivery<T>]) -> Result<()> {
        deliveries.iter().try_for_each(|d| self.acknowledge(d))
    }

    /// Told about the deliveries of a batch that was rolled back, with the reason.
    ///
    /// Defaults to doing nothing: the deliveries stay unacknowledged and the broker redelivers
    /// them when the consumer's channel closes. A broker adapter should give them back before
    /// that, after a backoff: held unacknowledged, they count against the consumer's prefetch,
    /// and a few failed batches can fill it and starve the run. [`AmqpQueue`]'s acknowledger
    /// requeues them after a growing backoff (see the [module docs](self)).
    ///
    /// # Errors
    ///
    /// An error stops the consumer like an acknowledgement failure.
    fn failed(&mut self, deliveries: &[Delivery<T>], error: &Error) -> Result<()> {
        let _ = (deliveries, error);
        Ok(())
    }

    /// Told about one delivery that failed **through its own fault**: it failed alone (in a
    /// batch of one, or when the recipe applied its rolled-back batch's messages again one at
    /// a time) and the store refused it (an invalid or unauthorised item, an identity reused
    /// with another payload, an overflow: [`Error::InvalidArgument`], [`Error::InvalidName`],
    /// [`Error::InvalidHeader`], [`Error::Codec`]), or another message of its batch committed,
    /// or the store says it is up ([`ApplyBatch::check_up`]). A message that keeps being
    /// rejected can never be applied; one that is only ever [`failed`](Self::failed) may be
    /// waiting out a database outage.
    ///
    /// Defaults to [`failed`](Self::failed) with this delivery alone. [`AmqpQueue`]'s
    /// acknowledger counts these and dead-letters the delivery to `{queue}.dlq` after
    /// [`AmqpQueue::dead_letter_after`] of them.
    ///
    /// # Errors
    ///
    /// An error stops the consumer like an acknowledgement failure.
    fn rejected(&mut self, delivery: &Delivery<T>, error: &Error) -> Result<()> {
        self.failed(std::slice::from_ref(delivery), error)
    }
}

/// True when the store refused the message itself: it fails the same way every time it is
/// applied, whether the database is up or down.
fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidArgument { .. }
            | Error::InvalidName { .. }
            | Error::InvalidHeader { .. }
            | Error::Codec { .. }
    )
}

/// What became of one message of a batch on the worker.
enum Applied {
    /// Committed: with its batch, or alone after the batch rolled back.
    Committed(Receipt),
    /// Failed alone through its own fault (see [`Acknowledge::rejected`]).
    Rejected(Error),
    /// Rolled back, and nothing says it was its own fault: a batch of one that failed with a
    /// database error, or a batch the store failed as if it were down.
    RolledBack(std::sync::Arc<Error>),
}

/// [`ApplyBatch::apply_batch`], with a panic of the effect turned into its batch's error (the
/// store's transaction is rolled back as the panic unwinds), so that a message whose effect
/// panics fails alone like any other.
fn apply_caught<St: ApplyBatch + ?Sized>(
    store: &St,
    messages: &[&Message],
) -> Result<Vec<Receipt>> {
    caught("the effect", || store.apply_batch(messages))
}

/// `call`'s result, or its panic as an error (`what` panicked).
fn caught<R>(what: &str, call: impl FnOnce() -> Result<R>) -> Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).unwrap_or_else(|panic| {
        Err(Error::Handler {
            source: format!("{what} panicked: {}", crate::error::panic_message(&*panic)).into(),
        })
    })
}

/// Messages tried alone after a rolled-back batch that fail with something other than a
/// refusal, with none committed, before the store is taken to be down and the rest of the batch
/// is not tried.
const DOWN_AFTER: usize = 2;

/// Applies a batch in one transaction; when it rolls back (and it held more than one message),
/// applies its messages again one at a time, so that one message that cannot be applied fails
/// alone and its batchmates commit. The second pass stops early when the first messages tried
/// all fail without a refusal and none commits, unless the store says it is up
/// ([`ApplyBatch::check_up`]): down, trying every message of the batch would only make an
/// outage longer. A failure is the message's own ([`Applied::Rejected`]) when it is a refusal,
/// when a batchmate committed, or when the store says it is up.
fn apply_isolating<T, St: ApplyBatch + ?Sized>(store: &St, batch: &[Delivery<T>]) -> Vec<Applied> {
    let messages: Vec<&Message> = batch.iter().map(|d| &d.message).collect();
    let batch_error = match apply_caught(store, &messages) {
        Ok(receipts) => return receipts.into_iter().map(Applied::Committed).collect(),
        Err(e) => e,
    };
    if messages.len() == 1 {
        return vec![
            if is_refusal(&batch_error) || store_is_up(store, &batch_error) {
                Applied::Rejected(batch_error)
            } else {
                Applied::RolledBack(std::sync::Arc::new(batch_error))
            },
        ];
    }
    log::debug!(
        "acknowledged consumer: a batch of {} rolled back ({batch_error}); applying its messages \
         one at a time",
        messages.len()
    );
    let batch_error = std::sync::Arc::new(batch_error);
    // `up`: asked of the store at most once, when messages failed unexplained and none
    // committed.
    let (mut committed, mut unexplained, mut up) = (false, 0, None);
    let mut each = Vec::with_capacity(messages.len());
    for m in &messages {
        if !committed
            && unexplained >= DOWN_AFTER
            && !*up.get_or_insert_with(|| store_is_up(store, &batch_error))
        {
            each.push(None);
            continue;
        }
        let alone = apply_caught(store, std::slice::from_ref(m)).and_then(|r| {
            r.into_iter()
                .next()
                .ok_or_else(|| Error::invalid("the store returned no receipt for a message"))
        });
        match &alone {
            Ok(_) => committed = true,
            Err(e) if !is_refusal(e) => unexplained += 1,
            Err(_) => {}
        }
        each.push(Some(alone));
    }
    let own_fault = committed
        || (unexplained > 0 && *up.get_or_insert_with(|| store_is_up(store, &batch_error)));
    each.into_iter()
        .map(|alone| match alone {
            Some(Ok(receipt)) => Applied::Committed(receipt),
            Some(Err(e)) if own_fault || is_refusal(&e) => Applied::Rejected(e),
            Some(Err(e)) => Applied::RolledBack(std::sync::Arc::new(e)),
            None => Applied::RolledBack(batch_error.clone()),
        })
        .collect()
}

/// The store's answer to [`ApplyBatch::check_up`] after `failure` (a panic in it counts as
/// down).
fn store_is_up<St: ApplyBatch + ?Sized>(store: &St, failure: &Error) -> bool {
    match caught("the store's check", || store.check_up()) {
        Ok(()) => {
            log::debug!(
                "acknowledged consumer: the store commits, so this failure is the message's \
                 own: {failure}"
            );
            true
        }
        Err(e) => {
            log::debug!(
                "acknowledged consumer: the store is not up ({e}); treating this failure as an \
                 outage: {failure}"
            );
            false
        }
    }
}

impl<T, F> Acknowledge<T> for F
where
    F: FnMut(&Delivery<T>) -> Result<()>,
{
    fn acknowledge(&mut self, delivery: &Delivery<T>) -> Result<()> {
        self(delivery)
    }
}

/// What [`consume`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Report {
    /// Deliveries acknowledged (applied now or replayed).
    pub acknowledged: u64,
    /// Of those, replays of an identity already done: acknowledged without running the effect.
    pub replayed: u64,
    /// Deliveries not acknowledged because they failed: alone after their batch rolled back,
    /// or with a batch the store failed as a whole. A delivery that is redelivered and fails
    /// again is counted again.
    pub failed: u64,
}

/// How [`consume`] batches: the largest batch and the intake bound.
///
/// ```
/// use acemq_amqp::patterns::acknowledged::ConsumeOptions;
/// let options = ConsumeOptions::new().batch_size(32).max_pending(64);
/// # let _ = options;
/// ```
///
/// For a poll interval or a stop handle, configure a [`Batcher`] and use [`consume_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeOptions {
    batch_size: usize,
    max_pending: Option<usize>,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        ConsumeOptions {
            batch_size: 32,
            max_pending: None,
        }
    }
}

impl ConsumeOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// The largest batch: the most deliveries applied in one transaction. Defaults to 32; must
    /// be at least 1.
    pub fn batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// The most deliveries taken from the source and not yet acknowledged (or failed).
    /// Defaults to twice the batch size; must be at least 1. Over AMQP, give the queue a
    /// prefetch of at least this plus one ([`AmqpQueue::open`]).
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.max_pending = Some(max_pending);
        self
    }

    /// The batcher these options describe.
    fn batcher(&self) -> Result<Batcher> {
        let builder = Batcher::builder().batch_size(self.batch_size);
        match self.max_pending {
            Some(n) => builder.max_pending(n),
            None => builder,
        }
        .build()
    }
}

/// Consumes `source` until it ends: applies its deliveries in batches of up to
/// [`batch_size`](ConsumeOptions::batch_size) through `store`, and acknowledges each delivery
/// after its batch committed.
///
/// At most [`max_pending`](ConsumeOptions::max_pending) deliveries are taken from the source and
/// not yet acknowledged (or failed). The source is closed before this returns, on every path
/// but an invalid option (then it is dropped unpolled). See the [module docs](self) for what
/// happens on failures and crashes; to stop it from another thread use [`consume_with`] and a
/// [`Batcher`]'s [`StopHandle`](crate::StopHandle).
///
/// # Errors
///
/// [`Error::InvalidArgument`] if the batch size or `max_pending` is zero; otherwise the first
/// error of the source, of an acknowledgement, or of closing the source. A batch that fails in
/// the store is not an error of `consume`: it is counted in [`Report::failed`].
pub fn consume<S, T, St, A>(
    source: S,
    store: &St,
    acknowledge: A,
    options: ConsumeOptions,
) -> Result<Report>
where
    S: Source<Item = Delivery<T>>,
    T: Send,
    St: ApplyBatch + ?Sized,
    A: Acknowledge<T>,
{
    let batcher = options.batcher()?;
    consume_with(source, store, acknowledge, &batcher)
}

/// [`consume`] with a configured [`Batcher`] (its batch size, intake bound, poll interval and
/// stop handle).
///
/// When the batcher's [`StopHandle`](crate::StopHandle) is stopped, this stops taking deliveries, applies and
/// acknowledges those it has taken, closes the source and returns the report.
///
/// # Errors
///
/// As for [`consume`].
pub fn consume_with<S, T, St, A>(
    source: S,
    store: &St,
    mut acknowledge: A,
    batcher: &Batcher,
) -> Result<Report>
where
    S: Source<Item = Delivery<T>>,
    T: Send,
    St: ApplyBatch + ?Sized,
    A: Acknowledge<T>,
{
    let mut report = Report::default();
    batcher.run_batches(
        source,
        |batch: &[Delivery<T>]| Ok(apply_isolating(store, batch)),
        |deliveries: Vec<Delivery<T>>, result: Result<Vec<Applied>>| {
            let n = deliveries.len() as u64;
            let applied = match result {
                Ok(applied) => applied,
                Err(e) => {
                    // The worker could not apply the batch at all.
                    log::warn!(
                        "acknowledged consumer: a batch of {n} deliveries was rolled back and \
                         not acknowledged: {e}"
                    );
                    report.failed += n;
                    return acknowledge.failed(&deliveries, &e);
                }
            };
            settle_batch(&mut acknowledge, &mut report, deliveries, applied)
        },
    )?;
    Ok(report)
}

/// Settles one applied batch: acknowledges what committed (as one batch), then tells the
/// acknowledgement about each message rejected through its own fault, then about the rest that
/// rolled back (together, with the first of their errors).
fn settle_batch<T, A: Acknowledge<T>>(
    acknowledge: &mut A,
    report: &mut Report,
    deliveries: Vec<Delivery<T>>,
    applied: Vec<Applied>,
) -> Result<()> {
    let (mut committed, mut rejected, mut rolled_back) = (Vec::new(), Vec::new(), Vec::new());
    let mut rolled_back_error = None;
    for (d, a) in deliveries.into_iter().zip(applied) {
        match a {
            Applied::Committed(receipt) => {
                report.replayed += u64::from(receipt.is_replay());
                committed.push(d);
            }
            Applied::Rejected(e) => rejected.push((d, e)),
            Applied::RolledBack(e) => {
                rolled_back_error.get_or_insert(e);
                rolled_back.push(d);
            }
        }
    }
    if !committed.is_empty() {
        acknowledge.acknowledge_batch(&committed)?;
        report.acknowledged += committed.len() as u64;
    }
    for (d, e) in &rejected {
        log::warn!(
            "acknowledged consumer: message {:?} failed on its own and was not acknowledged: {e}",
            d.message.identifier
        );
        report.failed += 1;
        acknowledge.rejected(d, e)?;
    }
    if let Some(e) = rolled_back_error {
        log::warn!(
            "acknowledged consumer: {} deliveries were rolled back and not acknowledged: {e}",
            rolled_back.len()
        );
        report.failed += rolled_back.len() as u64;
        acknowledge.failed(&rolled_back, &e)?;
    }
    Ok(())
}
