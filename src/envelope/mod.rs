//! The envelope of the AceMQ wire contract, header values and their validation, and [`Message`].
//!
//! Every message this crate publishes carries the reserved `x-acemq-` headers (see
//! [`headers`]); the id is also the AMQP `message_id`. Applications may add their own headers,
//! but never with the reserved prefix.
//!
//! Values are checked **before** anything is handed to amiquip, because amiquip writes an AMQP
//! short string over 255 bytes with a truncated length byte (a corrupt frame that closes the
//! connection) and, when it reads a `longstr` header that is not UTF-8, drops it and every header
//! after it. Text is always UTF-8 here (a Rust `String`); bytes that may not be text go as
//! [`HeaderValue::Bytes`] (an AMQP byte array), and [`HeaderValue::try_text`] refuses bytes that
//! are not UTF-8.

mod death;
pub mod headers;
mod ids;
mod message;
mod renamed;
mod reserved;
#[cfg(test)]
mod tests;
mod validate;
mod value;

pub(crate) use death::DELIVERY_COUNT;
pub use ids::{new_id, now_ms};
pub(crate) use ids::{random_u64, uuid_v8};
pub use message::{Message, Received};
pub(crate) use reserved::hash_id;
pub use reserved::Envelope;
pub(crate) use validate::check_name;
pub use validate::MAX_SHORT_STRING;
pub use value::HeaderValue;
