//! The confirmed publisher, and the same without confirms (at most once, on purpose).
//!
//! # Threads
//!
//! A [`Publisher`] is `Clone + Send + Sync`. A publish runs on the **caller's thread**: under the
//! channel's lock (waited for with the caller's deadline) it numbers the message (confirm
//! delivery tags start at 1 per channel) and records it as pending under the publisher's state
//! lock, then, with the state lock released, hands the frames to amiquip's I/O thread — it never
//! waits for the network there, and the confirm thread never waits for it. One **confirm thread** per publisher (`acemq-confirms`) receives the broker's
//! `basic.ack`/`basic.nack` and `basic.return`, matches them to pending publishes and answers
//! each caller through its [`Ticket`]. A return arrives before the ack of the same message, so on
//! each confirm the thread first drains the returns; returns carry no delivery tag and are
//! matched by `message_id`.
//!
//! Every publish is answered: confirmed, nacked ([`Error::Nacked`]), returned as unroutable
//! ([`Error::Unroutable`]), or failed because the channel or connection went away
//! ([`Error::ConnectionLost`], retriable). A publish that could not even be handed over while
//! the connection is down waits for recovery (up to the timeout) and then goes out on the new
//! channel; one already handed over is never re-sent silently (that would be a duplicate the
//! caller did not choose).
//!
//! The number of unconfirmed publishes is bounded by [`PublisherOptions::window`]: a caller
//! beyond it waits for room. The bytes unconfirmed on one connection, all its publishers
//! together, are bounded too ([`ConnectionOptions::max_unconfirmed_bytes`], 8 MiB by default),
//! below the point where amiquip's I/O thread stops taking frames (it blocks the publishing
//! thread, without a timeout, once it buffers 16 MiB for a broker that stopped reading — a
//! memory alarm, a stalled socket). So a publish never blocks inside amiquip: when the broker
//! stops reading, callers wait for room with their deadline and get [`Error::Timeout`] on time,
//! and confirms, [`Publisher::close`] and [`Publisher::in_flight`] stay responsive.
//!
//! Without confirms ([`PublisherOptions::confirms`]`(false)`) the channel is not in confirm
//! mode and a publish is answered once it is handed over; the same window and byte budget
//! bound what was handed over until a round trip on the channel shows the broker read it
//! (`flush.rs`: the thread `acemq-flush` in place of `acemq-confirms`, which also counts what
//! the broker returns).
//!
//! [`ConnectionOptions::max_unconfirmed_bytes`]: crate::ConnectionOptions::max_unconfirmed_bytes

mod batch;
mod confirms;
mod flush;
mod frame;
mod handover;
mod options;
mod publisher;
mod state;

pub use crate::observe::batch_report::{BatchItem, BatchOutcome, BatchReport};
pub(crate) use crate::ticket::blocked_or;
pub use crate::ticket::Ticket;
pub(crate) use frame::check_fits;
#[cfg(feature = "internals")]
pub(crate) use frame::header_frame_size;
pub(crate) use handover::{prepare, send_unconfirmed};
pub use options::PublisherOptions;
pub use publisher::Publisher;
