//! The idempotent consumer: at-least-once delivery made harmless.
//!
//! [`idempotent`] wraps any [`Handler`]. For each message it takes a key (the `x-acemq-id` by
//! default, or a natural key from [`IdempotentOptions::key`]) and asks the store:
//!
//! * first time ([`Claim::Claimed`]) → the handler runs; on accept the claim is confirmed;
//! * duplicate ([`Claim::Duplicate`]: confirmed before) → accepted without running the
//!   handler — a duplicate is not an alarm, and settles exactly like a real run; the wrapper
//!   counts it ([`Idempotent::duplicates`]) and reports it to its observer
//!   ([`Observer::duplicate`], set with [`IdempotentOptions::observer`]);
//! * in progress ([`Claim::InProgress`]: claimed by someone whose lease still holds) →
//!   [`Outcome::InProgress`] so it comes back later without spending an attempt.
//!
//! Wrapped around a batched handler (the batched [`idempotent_tx`] behind a chain, say), it
//! passes the batching on: each message of a batch is claimed on its own, the claimed ones are
//! handed on in one batch, and each claim is then confirmed or given back by its own message's
//! result.
//!
//! When the handler does not accept — an `Err`, a panic, or any other outcome — the claim is
//! **given back** ([`release`](crate::patterns::idempotency::IdempotencyStore::release), fenced by the claim's token) before
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
//!
//! [`Handler`]: crate::Handler
//! [`Handler::batch_limits`]: crate::Handler::batch_limits
//! [`Handler::handle`]: crate::Handler::handle
//! [`Claim::Claimed`]: crate::patterns::idempotency::Claim::Claimed
//! [`Claim::Duplicate`]: crate::patterns::idempotency::Claim::Duplicate
//! [`Claim::InProgress`]: crate::patterns::idempotency::Claim::InProgress
//! [`Observer::duplicate`]: crate::observe::Observer::duplicate
//! [`Outcome::InProgress`]: crate::Outcome::InProgress

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod batch;
mod duplicates;
mod options;
mod plain;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod tx;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use batch::IdempotentTxBatch;
pub use duplicates::DuplicateCount;
pub use options::IdempotentOptions;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use options::IdempotentTxBatchOptions;
pub use plain::{idempotent, Idempotent};
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use tx::{idempotent_tx, IdempotentTx};
