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
//!     consume, Batcher, BatcherOptions, CounterIncrement, CounterStore, CounterStoreOptions,
//!     Delivery, IterSource,
//! };
//! let dir = std::env::temp_dir().join(format!("acemq-ack-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).map_err(|e| acemq_amqp::Error::Io {
//!     context: "creating a directory".into(),
//!     source: e,
//! })?;
//! let store = CounterStore::new(dir.join("counters.db"), CounterStoreOptions::new())?;
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
//! let batcher = Batcher::new(BatcherOptions::new().batch_size(32).max_pending(64))?;
//! let report = consume(source, &store, acknowledge, &batcher)?;
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
//! * A [`Batcher`] (and so [`consume`]) is stopped with the crate's one
//!   [`StopHandle`](crate::StopHandle), as a consumer is; stopping it is final for its batcher
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
//! * [`consume`] (with a configured [`Batcher`]: `batch_size`, `max_pending`, poll interval,
//!   stop handle): the recipe; returns a [`Report`].
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
//!   store refused it ([`Error::InvalidArgument`](crate::Error::InvalidArgument), [`Error::InvalidName`](crate::Error::InvalidName),
//!   [`Error::InvalidHeader`](crate::Error::InvalidHeader), [`Error::Codec`](crate::Error::Codec) — it fails the same way every time), or it
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
//! rejected [`AmqpQueueOptions::dead_letter_after`] times goes to `{queue}.dlq` (see *Rolled-back
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
//!   ([`AmqpQueueOptions::requeue_backoff_first`] and [`requeue_backoff_max`](AmqpQueueOptions::requeue_backoff_max); 200 ms and 30 s by default), times a random factor
//!   between ½ and 1. The random factor brings the deliveries of one failed batch back at
//!   different times, so that a message is not batched again and again with the one that made
//!   its batch fail. A committed batch resets the counts of its identities and the queue's.
//!   The failure counts of at most 4096 identities are kept, with the queue, across runs.
//! * **Nothing spins.** A message that always fails comes back ever more slowly, and once the
//!   backoff is capped at most once every `max / 2`; every failure is counted in
//!   [`Report::failed`] (a message that failed three times counts three) and logged.
//! * **A message that can never be applied is dead-lettered.** After
//!   [`AmqpQueueOptions::dead_letter_after`] failures through its own fault
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
mod consume;
#[cfg(feature = "sqlite")]
mod counter;
mod delivery;
mod isolate;
mod run;
mod source;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod store;
mod store_apply;

pub use amqp::{AmqpAcknowledge, AmqpQueue, AmqpQueueOptions, AmqpSource, AmqpToken};
pub use batcher::{Batcher, BatcherOptions};
pub use consume::{consume, Report};
#[cfg(feature = "sqlite")]
pub use counter::{CounterIncrement, CounterStore, CounterStoreOptions};
pub use delivery::{Acknowledge, Delivery};
pub use source::{IterSource, Polled, Source};
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use store::{BatchStore, BatchStoreOptions, Effect, DEFAULT_RECEIPTS_TABLE};
pub use store_apply::{ApplyBatch, Message, Receipt};
