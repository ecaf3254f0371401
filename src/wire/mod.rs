//! The AMQP data a message carries, as this crate's own types: [`AmqpProperties`], the header
//! [`FieldTable`] and its [`AmqpValue`]s, and the [`AmqpError`] a transport answers with.
//!
//! Every transport speaks these (`memory://` keeps them as they are; the AMQP transport converts
//! to and from amiquip's where a frame is sent or read, in `transport/amqp/convert.rs`), so
//! nothing but that one folder knows which AMQP client is underneath. The values are AMQP 0-9-1's
//! own field types, every one of them: a header another library wrote in a type this crate
//! would not choose (a 16-bit integer, a decimal) is read and passed on in that type.

mod error;
mod properties;
mod value;

pub use error::AmqpError;
pub use properties::AmqpProperties;
pub use value::{AmqpValue, Decimal, FieldTable};
