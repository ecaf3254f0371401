//! acemq-amqp: synchronous, blocking RabbitMQ messaging patterns for threaded Rust services.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod codec;
mod connection;
mod envelope;
mod error;
pub mod observe;
pub mod patterns;
mod publish;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;

pub use codec::{BytesCodec, Codec, JsonCodec};
pub use connection::{
    Address, Binding, Connection, ConnectionOptions, ExchangeKind, ExchangeSpec, QueueInfo,
    QueueKind, QueueSpec,
};
pub use envelope::{
    headers, new_id, now_ms, Envelope, HeaderValue, Message, Received, MAX_SHORT_STRING,
};
pub use error::{BoxError, Error, Result};
pub use observe::{LogObserver, Observer};
pub use publish::{Publisher, PublisherOptions, Ticket};
