//! The handler chain: the concerns every handler needs — logging, a deadline, the idempotency
//! guard, ordering — put around one handler in an order you can read.
//!
//! ```no_run
//! use acemq_amqp::patterns::ordering::by_header;
//! use acemq_amqp::patterns::idempotency::InMemoryIdempotencyStore;
//! use acemq_amqp::patterns::chain::{chain, with_idempotency, with_logging, with_ordering, with_timeout};
//! use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome};
//! use std::time::Duration;
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let handler = chain(
//!     |m: &Message| {
//!         println!("shipping {}", m.id());
//!         Ok(Outcome::Accept)
//!     },
//!     [
//!         with_logging(),
//!         with_timeout(Duration::from_secs(10))?,
//!         with_idempotency(InMemoryIdempotencyStore::default()),
//!         with_ordering(by_header("order-id")),
//!     ],
//! );
//! let options = ConsumerOptions::new().concurrency(8).prefetch(128);
//! let running = connection.consumer("shipments", options)?.start(handler)?;
//! # running.close()?; Ok(()) }
//! ```
//!
//! The list reads **outermost first**: the first layer sees the message first and the outcome
//! last, so logging (outermost) records what the deadline and the idempotency guard decided.
//! Each layer is also a plain [`Handler`] wrapper that works alone: [`Logged`],
//! [`TimeLimited`] (made by a [`Deadline`]), [`idempotent`](fn@crate::patterns::idempotent::idempotent) and [`ordered`]. Every one of them
//! passes on the ordering of the handler it wraps ([`Handler::ordering`]), so `with_ordering`
//! works wherever it sits in the list, and its batching ([`Handler::batch_limits`],
//! [`Handler::handle_batch`]), so a batched [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx)
//! inside a chain still gets its batches from the consumer's worker: the logging layer writes a
//! line per message of a batch (with the batch's duration), the deadline covers the batch as a
//! whole (below), the idempotency layer claims each message of a batch on its own and hands
//! the claimed ones on in one batch.
//!
//! There is no layer that turns an error into a decision: an `Err` or a panic escaping a handler
//! is already a retry, which is what most failures want.
//!
//! # `with_timeout`: what a deadline can and cannot do
//!
//! Each message's handler runs on a thread of its own (`acemq-handler-deadline`, one per
//! message) while the worker waits up to the limit. A handler that finishes in time settles as
//! it decided (a panic in it is passed on to the consumer, which retries it). One that overruns
//! is settled **as a retry, on time** — retrying work that may have succeeded risks doing it
//! twice, accepting work that may have failed loses it, and duplicates can be made harmless
//! ([`idempotent`](fn@crate::patterns::idempotent::idempotent)) while a loss cannot — with the error
//! `acemq: handling message {id} did not finish within {limit}`.
//!
//! **The overrunning thread cannot be interrupted** (Rust has no way to stop a thread): it runs
//! on to the end of what it was doing, as an *orphan*, and its result is thrown away. Orphans
//! are counted ([`Deadline::orphans`]) and each overrun is reported to the observer
//! ([`Observer::overrun`], set with [`DeadlineOptions::observer`]). While [`DeadlineOptions::max_orphans`]
//! (default 16) orphans of a wrapper are still running, a new message is **not started** and is
//! settled as a retry at once (`acemq: not started: {n} handlers are still running past their
//! deadline`), so a handler stuck for good cannot pile up threads without bound. The limit is
//! checked when a message starts, and a handler already running when it is reached may still
//! overrun: with a consumer of concurrency `c` at most `max_orphans + c − 1` orphans exist at once
//! (a strict `max_orphans` would have to refuse to start handlers that may well finish in time).
//! Its message still retries: the key of an ordered message is freed when the overrun is settled,
//! so the next message with the key may run beside the orphan.
//!
//! **A batch** (a batched handler inside the deadline) runs on one thread as a whole, and the
//! limit is the batch's: its messages' outcomes come together, so the batch is what overruns,
//! and then every message of it is a retry (each reported to the observer; one orphan). Give a
//! batched handler a limit for a whole batch.
//!
//! **With the idempotency layer, in either order.** Inside [`idempotent`](fn@crate::patterns::idempotent::idempotent)
//! (`with_idempotency` after `with_timeout` in the list) the orphan runs the whole idempotent
//! step and confirms its own claim if it finishes. Outside it (`with_idempotency` before
//! `with_timeout`) the idempotency layer learns of the overrun and **holds the message's
//! claim until the orphan has ended** — confirming it if the orphan accepted, giving it back
//! if not — instead of giving it back at once: meanwhile the retry finds the key in progress
//! and comes back later, so it never runs beside the orphan and the effect is not applied
//! twice. (An orphan that outlives the claim's lease can still be taken over, as any handler
//! that slow can.)
//!
//! # `with_logging`
//!
//! One line per message through the `log` crate (target `acemq_amqp::patterns::chain`): id,
//! type, attempt, outcome (with the reason the handler gave, or its error) and duration — at
//! info for an outcome, warn for an error or a panic. **Never the payload**: it is the one part
//! of a message that may not be safe to write down.
//!
//! [`Handler`]: crate::Handler
//! [`Handler::ordering`]: crate::Handler::ordering
//! [`Handler::batch_limits`]: crate::Handler::batch_limits
//! [`Handler::handle_batch`]: crate::Handler::handle_batch
//! [`ordered`]: crate::patterns::ordering::ordered
//! [`Observer::overrun`]: crate::observe::Observer::overrun

mod deadline;
mod layer;
mod logging;
pub(crate) mod orphans;

pub use deadline::{with_timeout, Deadline, DeadlineOptions, OrphanCount, TimeLimited};
pub use layer::{chain, with_idempotency, with_ordering, BoxHandler, Chain, Layer};
pub use logging::{with_logging, Logged};
