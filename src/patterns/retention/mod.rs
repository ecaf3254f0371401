//! Retention that cannot cause a duplicate: idempotency receipts (and retired outbox records)
//! deleted past a retention, **never a receipt younger than the oldest message still waiting
//! to be delivered again** — in a consumed queue, its `.dlq`, `.parked`, its retry rungs or
//! the scheduler's ladder.
//!
//! The family's seed text: "Keep receipts for the entire redelivery horizon: deleting them
//! permits the effect to happen again." A dead letter replayed a week after its original was
//! handled is recognised as a duplicate only while its receipt exists. So [`purge`] first reads
//! every message waiting in the queues it is given ([`horizon`]; each put back, nothing
//! consumed), and when the oldest was first sent before the retention's cutoff, it moves the
//! cutoff back to that message and says which message held it back ([`PurgeReport::held_by`]).
//! A queue holding more than the scan limit stops the purge: an unknown horizon deletes
//! nothing.
//!
//! ```no_run
//! use std::time::Duration;
//! use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
//! use acemq_amqp::patterns::retention::{purge, RetentionOptions};
//! use acemq_amqp::{Connection, RetryPolicy};
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! let receipts = SqlIdempotencyStore::open(
//!     || Ok(rusqlite::Connection::open("app.db")?),
//!     SqlIdempotencyStoreOptions::default(),
//! )?;
//! let options = RetentionOptions::new(Duration::from_secs(7 * 24 * 3600))
//!     .consumed_queue("orders", &RetryPolicy::exponential());
//! let report = purge(&connection, &receipts, None, &options)?;
//! println!("{report}");
//! # Ok(()) }
//! ```
//!
//! The service host runs it on a thread ([`Sweeper`], `Service::retention`); the command line
//! as `acemq receipts purge --older-than 7d --queue orders`.

mod horizon;
mod options;
mod purge;
mod sweeper;

pub use horizon::{horizon, Held, Horizon};
pub use options::RetentionOptions;
pub use purge::{purge, PurgeReport};
pub use sweeper::{RunningSweeper, Sweeper};
