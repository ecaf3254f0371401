//! The transactional outbox: records written with the business data (the stores), published
//! later by the relay ([`OutboxRelay`], below).
//!
//! # Guarantees
//!
//! - [`SqlOutboxStore::add`] inserts on **the caller's transaction** and never commits, rolls
//!   back or opens one of its own: the record exists exactly when the caller's work commits. On a
//!   connection in autocommit mode (a `rusqlite::Connection` outside `BEGIN`, a
//!   `postgres::Client`) it refuses with [`Error::InvalidArgument`](crate::Error::InvalidArgument).
//! - [`OutboxStore::pending`] returns records in insertion order (by `id`) and **leases** them
//!   to this store instance for `lease` (default 30 s): until the lease runs out no other
//!   `SqlOutboxStore` on the same table (another relay thread, process or host) is offered them.
//!   On PostgreSQL the lease is taken with `FOR UPDATE SKIP LOCKED` and a lease deadline; on
//!   SQLite with one conditional `UPDATE … RETURNING` under the database's write lock. A relay
//!   that dies simply lets its leases expire.
//! - [`OutboxStore::mark_published`] deletes the record (call it after the broker's confirm);
//!   [`OutboxStore::record_failure`] counts a failed attempt, keeps the error text, and ends the
//!   lease so the record is offered again. After `max_attempts` failures (default 10) the record
//!   is **retired**: kept, no longer offered by `pending`, listed by [`OutboxStore::retired`],
//!   and put back in play by [`OutboxStore::release`], which resets its attempts.
//! - **The database's clock decides leases**: `pending` writes `lease_until_ms` as the
//!   database's now plus `lease` and offers only records whose lease ended by the database's
//!   now, in one statement ([`Dialect::now_ms_sql`](crate::sql::Dialect::now_ms_sql)). The
//!   relays' hosts may disagree about the time by any amount: a relay whose clock runs behind
//!   cannot take another's live lease (nor write a lease that already ended), one whose clock
//!   runs ahead does not hold a lease longer than `lease`. On PostgreSQL that is the server's
//!   clock (`clock_timestamp()`); on SQLite, which runs in the process, it is the host's own,
//!   shared by the processes on one database file. `created_ms` (the outbox lag, the
//!   message's `x-acemq-first-seen`) is still the adding host's clock: it decides no lease.
//! - The relay publishes at least once: a relay that published and died before
//!   `mark_published`, or whose lease ran out mid-publish, leads to a second publish.
//!
//! [`InMemoryOutboxStore`] follows the same rules in one process; it is for tests, **not for
//! production** (it is not transactional with anything and forgets everything on restart).
//!
//! # The relay
//!
//! [`OutboxRelay`] publishes what the outbox holds, mandatory with confirms, and deletes a
//! record only after its confirm.
//!
//! ```text
//!  service transaction ──add──▶ outbox table ──pending(batch)──▶ relay ──publish──▶ broker
//!                                    ▲                              │ confirm
//!                                    └─ mark_published_and_lease ◀──┘
//! ```
//!
//! ## What the relay guarantees
//!
//! * **Nothing is lost**: a record leaves the outbox only after the broker confirmed it. A
//!   crash or a dropped connection between the confirm and the delete publishes it again
//!   (with the same `x-acemq-id`, so an [idempotent](mod@super::idempotent) consumer ignores the
//!   second one).
//! * **Order**: records are offered oldest first and published in that order. A batch is
//!   pipelined (all of it handed to the broker, then the confirms awaited). When a record fails
//!   through its own fault (unroutable, nacked, no such exchange) the failure is counted against
//!   it; a record that failed before is published **alone**, at the head of a sweep, before
//!   anything behind it (a batch stops short of it), so the queue behind a failing record waits
//!   until it goes out or retires at `max_attempts` — except records of the very batch in which
//!   it first failed that the broker had already confirmed (sending them again would duplicate
//!   them) and, on a started relay, the batch after it: a started relay hands over the next
//!   full batch before it awaits the confirms of the one before (see below). Use
//!   [`OutboxRelayOptions::batch_size`]`(1)` for strict order (a started relay then never has
//!   two batches out at once).
//! * **Pipelined**: a started relay keeps at most two batches out — the one whose confirms it
//!   awaits and the next, handed over meanwhile — and, while the broker confirms them, deletes
//!   the batch confirmed before them and leases the next in one commit
//!   ([`OutboxStore::mark_published_and_lease`]); so a confirmed batch is deleted one batch
//!   later than it could be (a crash in between publishes it again, as any crash between a
//!   confirm and its delete does). A batch that is not full, a record that failed before and any
//!   failure end the overlap: what is out settles, what was confirmed is deleted and what was
//!   leased ahead is given back before anything more goes.
//! * **A lease is the fence**: the relay publishes, awaits and deletes a record only while it
//!   holds the record's lease, so no other relay (nor this one) leases it meanwhile. Each
//!   batch's time counts from its lease, not from its hand-over: a batch leased ahead that
//!   waited past a quarter of its lease behind slow confirms has its leases renewed
//!   ([`OutboxStore::renew`]) before it goes, or is given back and leased afresh; and when
//!   confirms are slower than half the lease (a stalled link), the leases of every record in
//!   flight — the batch awaited and the one handed over behind it — are renewed and the relay
//!   goes on waiting, up to eight times, rather than giving back records whose first copies may
//!   still reach the broker. (A store that cannot renew gives up at half the lease, as a
//!   timeout.)
//! * What is not the record's fault is not counted: a dropped connection, a channel the broker
//!   closed over another record's failure (that record's own `NotFound` is counted), a confirm
//!   that timed out. Those records' leases are ended and they go out after recovery.
//! * **Leases are given back** on every path: a record the relay leased and did not publish is
//!   offered again at once (to this relay or another), not after the lease ran out, also when
//!   the store fails mid-sweep (deleting what went out, counting a failure). A record that went
//!   out but could not be deleted stays leased and is published again after the lease.
//!
//! ## Life cycle and threads
//!
//! The crate's rule (see the crate docs, "Life cycle"): configure, then start, then close.
//!
//! 1. [`OutboxRelay::new`] takes the connection, the store and [`OutboxRelayOptions`] (interval,
//!    batch size), checks the options and starts nothing. The options are fixed from then on:
//!    there is no setter on a relay, so none can be ignored.
//! 2. [`OutboxRelay::start`] consumes the relay and returns a [`RunningRelay`] with one sweeper
//!    thread (`acemq-outbox-relay`): it sweeps, and when a sweep finds less than a full batch
//!    it waits the interval (or until it is closed).
//! 3. [`RunningRelay::close`] stops the thread after its current sweep, deletes what went out,
//!    gives back what it had leased, joins the thread, closes the relay's publisher and returns
//!    a [`RelayReport`]. Dropping a [`RunningRelay`] does the same best-effort (blocking; errors
//!    are logged).
//!
//! `sweep()` publishes one batch on the caller's thread, on a relay that was never started
//! ([`OutboxRelay::sweep`]: tests, a service that flushes at the end of each request) or on a
//! running one ([`RunningRelay::sweep`]); it may be called from any thread at any time, and
//! sweeps of one relay never overlap. [`OutboxRelay::close`] closes the publisher of a relay
//! that was never started. Two relays (threads or processes) on one table are kept apart by the
//! store's leases.

mod memory;
mod record;
mod relay;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod sql;
mod store;

pub use memory::{InMemoryOutboxStore, InMemoryOutboxStoreOptions};
#[cfg(all(
    feature = "internals",
    any(feature = "sqlite", feature = "postgres", feature = "mysql")
))]
pub(crate) use record::take_message;
pub use record::{record, record_message};
pub use relay::{OutboxRelay, OutboxRelayOptions, RelayReport, RunningRelay};
#[cfg(all(
    feature = "internals",
    any(feature = "sqlite", feature = "postgres", feature = "mysql")
))]
pub(crate) use sql::record as record_from_row;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub use sql::{SqlOutboxStore, SqlOutboxStoreOptions};
pub use store::{NewOutboxRecord, OutboxRecord, OutboxStats, OutboxStore};
