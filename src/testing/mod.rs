//! Tools for testing a service built on this crate (feature `testing`, off by default): a
//! fault proxy, unique names, clean-up, waiting with a deadline, and a received message for
//! unit-testing a handler without a broker.
//!
//! ```toml
//! [dev-dependencies]
//! acemq-amqp = { version = "0.1", features = ["testing"] }
//! ```
//!
//! * [`received`]: a [`Message`](crate::Message) exactly as a consumer hands it to a handler
//!   (attempt, first seen, redelivered flag, headers read back from the wire form), so a
//!   handler — wrapped by [`idempotent`](fn@crate::patterns::idempotent::idempotent),
//!   [`ordered`](crate::patterns::ordering::ordered) or [`chain`](fn@crate::patterns::chain::chain) or not —
//!   can be tested by calling [`Handler::handle`](crate::Handler::handle) directly.
//! * [`FaultProxy`]: a loopback TCP proxy in front of the broker that cuts, stalls (holds) or
//!   refuses connections on cue, and counts them and their bytes: how a test shows that a
//!   consumer survives a dropped connection or a silent peer.
//! * [`TestNames`]: queue, exchange and table names unique to the test (its name, the process
//!   id), so tests run in parallel against one broker and database.
//! * [`Cleanup`]: deletes what the test declared when dropped, also when the test panics.
//! * [`wait_until`]: waits for a condition with a deadline — the way to wait in a test; never
//!   sleep for a guessed time.
//!
//! The guide, `docs/testing.md` in the repository (also rendered here as the
//! module `guide`), shows them together: unit-testing a handler, a consumer inside
//! `std::thread::scope` whose handler borrows the test's locals, surviving a cut and a stall,
//! exactly-once effects with [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx) across a cut.
//!
//! This is test tooling, not for production code paths: the clean-up reports what it could
//! not delete on standard error (where the test harness shows it), and the proxy runs a
//! thread per connection and direction.

mod cleanup;
mod memory;
mod names;
mod proxy;
mod received;
mod wait;

pub use cleanup::Cleanup;
pub use memory::MemoryBroker;
pub use names::TestNames;
pub use proxy::FaultProxy;
pub use received::{received, Delivered, DEFAULT_ROUTING_KEY};
pub use wait::{wait_until, TimedOut};

/// The testing guide (`docs/testing.md` in the repository). Every snippet in it is a doctest,
/// run by `cargo test --all-features` against the local broker (and SQLite).
#[cfg(feature = "sqlite")]
#[doc = include_str!("../../docs/testing.md")]
pub mod guide {}
