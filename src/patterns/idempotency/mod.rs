//! Idempotency stores: remember which messages were already handled.
//!
//! # The protocol
//!
//! [`IdempotencyStore::first_time`] answers "have I seen this key?" and records it in one step.
//! A store that [supports claims](IdempotencyStore::supports_claims) offers the safer two-step
//! form: [`claim`](IdempotencyStore::claim) before the work, [`confirm`](IdempotencyStore::confirm)
//! after it, [`release`](IdempotencyStore::release) when the work failed and should run again.
//!
//! - A claim is a **lease**: it holds for `claim_timeout`. While it holds, other claims of the
//!   same key get [`Claim::InProgress`]; once its deadline has passed, the next claim takes it
//!   over and gets [`Claim::Claimed`] (the first worker is presumed dead).
//! - A claim is **fenced**: [`Claim::Claimed`] carries a fresh [`ClaimToken`], written with the
//!   claim. `release` deletes the claim only while that token still holds it, so a worker whose
//!   lease was taken over cannot give back its successor's claim, and a confirmed key is never
//!   deleted by `release`. `confirm` turns the holder's claim into a receipt; a holder whose
//!   lease was taken over still records the receipt when it confirms (its work *is* done, and a
//!   receipt is what stops the key from running a third time), with a warning in the log.
//! - A confirmed key is a **receipt**: claims get [`Claim::Duplicate`] until `retention` has
//!   passed; after that the key counts as new again, whether or not it was purged.
//! - In [`SqlIdempotencyStore`] the insert *is* the claim: one `INSERT … ON CONFLICT DO UPDATE …
//!   WHERE deadline_ms <= now` statement (`now` being the database's clock, see
//!   [Clocks](#clocks)), atomic by the primary key across threads, processes
//!   and hosts. Nothing on the message path deletes a receipt: `release` deletes only the
//!   caller's own claim (`WHERE key = ? AND state = 'CLAIMED' AND token = ?`),
//!   [`SqlIdempotencyStore::purge_expired`] deletes what has expired, and
//!   [`forget`](IdempotencyStore::forget) (by key alone, whatever its state) is for operators.
//!
//! The table has a `token` column (since 0.1: tables created before it need
//! `ALTER TABLE acemq_idempotency ADD COLUMN token TEXT`).
//! - [`SqlIdempotencyStore::claim_in`] and [`SqlIdempotencyStore::confirm_in`] run on the
//!   caller's transaction so the receipt commits (or rolls back) with the work. On PostgreSQL a
//!   second claim of a key whose claim is not yet committed waits for that transaction. On
//!   SQLite begin such a transaction with `BEGIN IMMEDIATE` (`TransactionBehavior::Immediate`)
//!   so the claim does not fail with `SQLITE_BUSY` when it upgrades a read to a write.
//!
//! - With [`group_commit`](SqlIdempotencyStoreOptions::group_commit), the claims, confirms and
//!   releases that concurrent threads ask for at the same moment run in one transaction (one
//!   commit), each answered only after that commit, with the answer it would have had alone.
//!
//! # Clocks
//!
//! In [`SqlIdempotencyStore`] **the database's clock decides** every deadline: a claim's
//! `deadline_ms` is written as the database's now plus `claim_timeout` (a receipt's as its now
//! plus `retention`), and "has it expired" compares it with the database's now, in the same
//! statement ([`Dialect::now_ms_sql`](crate::sql::Dialect::now_ms_sql)). The clocks of the
//! hosts running the store may disagree by any amount: a host whose clock runs behind cannot
//! take over a live claim, nor write one that is already expired, and a host whose clock runs
//! ahead does not hold a claim longer than its lease. On PostgreSQL that is the server's clock
//! (`clock_timestamp()`); SQLite runs in the process, so there it is the host's own clock,
//! which the processes sharing a database file share. A claim can still outlive its holder's
//! work if the holder's process stalls for longer than `claim_timeout`: that is what the token
//! fences.
//!
//! [`InMemoryIdempotencyStore`] keeps keys in a map for one process; it is for tests and
//! examples, **not for production**: it forgets everything on restart and does not coordinate
//! processes.

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod group_commit;
mod memory;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod sql;
mod store;

pub use memory::InMemoryIdempotencyStore;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use sql::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
pub use store::{Claim, ClaimToken, IdempotencyStore};
