//! acemq-amqp: synchronous, blocking RabbitMQ messaging patterns for threaded Rust services.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

// `Error::amqp` is only used by the broker side, built on main; drop this allow on merge.
#[allow(dead_code)]
mod error;
pub mod patterns;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod sql;

pub use error::{BoxError, Error, Result};
