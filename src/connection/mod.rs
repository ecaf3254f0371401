//! The connection: a cloneable handle over one amiquip connection at a time, kept alive by a
//! supervisor thread.
//!
//! # Threads
//!
//! * amiquip's I/O thread, one per live amiquip connection.
//! * The **supervisor** thread (`acemq-supervisor`), one per [`Connection`]: it watches the
//!   amiquip connection (its connection-blocked listener disconnects when the I/O thread ends),
//!   and when it drops it closes it to learn the cause, reconnects with capped exponential
//!   backoff and jitter across the addresses, re-declares the remembered topology, and publishes
//!   the new link with a generation one higher. It holds only a `Weak` reference and ends when
//!   the connection is closed or the last handle is dropped; either way it is joined, with a
//!   deadline (the operation timeout for [`Connection::close`], at most 5 s when the last
//!   handle is dropped), and left to end by itself past it (logged).
//!
//! * A channel open is a round trip amiquip does not bound, made under the link's lock
//!   (amiquip's `open_channel` takes the connection `&mut`), so it runs on a short-lived thread
//!   of its own (`acemq-channel-open`), and its caller waits for it with a deadline (the
//!   operation timeout, or a publish's own): past it the caller gets [`Error::ConnectionLost`]
//!   and a channel opened later is closed by that thread. The lock is only ever waited for with
//!   a deadline too: a second open behind a hung one fails on time, and [`Connection::close`]
//!   gives up on it after the operation timeout, leaving the hung open to close the AMQP
//!   connection when it returns.
//!
//! Publishers and consumers ask for the current link (waiting while it
//! recovers), open their own channels on it, and remember its generation; a failure on their
//! channel sends them back here for the next link.

mod address;
mod budget;
mod connect;
mod handle;
mod health;
mod health_state;
mod link;
#[cfg(any(feature = "tls", feature = "test-ca"))]
mod marker;
mod options;
mod shared;
mod supervisor;
#[cfg(feature = "tls")]
pub(crate) mod tls;
mod topology;

pub use address::Address;
pub(crate) use budget::{ByteBudget, Reservation};
pub use handle::Connection;
pub(crate) use link::Link;
#[cfg(feature = "test-ca")]
pub(crate) use marker::DEVELOPMENT_MARKER;
pub use options::ConnectionOptions;
pub(crate) use supervisor::backoff;
#[cfg(feature = "tls")]
pub use tls::{TlsError, TlsFailure};

pub(crate) use topology::{declare_queue_on, to_table};
pub use topology::{
    Binding, ExchangeKind, ExchangeSpec, QueueInfo, QueueKind, QueueSpec, StreamRetention,
    TopologyDifference,
};
