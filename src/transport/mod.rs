//! The transport seam: what the engine (publisher, consumer runtime, requester, replay, peek,
//! scheduler, stream reader) asks of a broker connection, behind one small internal trait pair,
//! and its implementations.
//!
//! * [`Transport`] is one live connection: open a channel, close, what it can do.
//! * [`ChannelApi`] is one channel: declare / check / delete / bind, publish with confirms and
//!   returns, consume with a prefetch, ack / nack (`multiple`, requeue or not), get, close.
//!   [`Channel`] owns one (boxed) and gives it the AMQP methods' names.
//! * A [`Feed`] is a buffer the transport fills (a subscription's deliveries, confirms,
//!   returns, blocked notices): a crossbeam receiver the callers `select` on beside their own
//!   channels, each item made the seam's where it is read — no thread and no copy in between.
//!
//! Everything that crosses is the crate's own: a message's data ([`crate::wire`]: properties,
//! tables, values, the [`AmqpError`] with AMQP's reply codes) and the seam's small types
//! ([`wire`]: a publish, a confirm, a return, a declaration's options). A delivery carries its
//! transport's [`Settle`], opaque to the engine. Only [`amqp`] names amiquip
//! (`tests/layout.rs`).
//!
//! Implementations: [`amqp`] (amiquip, `amqp://` and `amqps://`) and, with the `memory`
//! feature, `memory` (an in-process broker, `memory://name`). A third is a folder here and an
//! entry in the table of [`schemes`], through which addresses are read and opened.

mod amqp;
mod capabilities;
mod channel;
/// The conformance cases every transport runs beside RabbitMQ (tests only).
#[cfg(all(test, feature = "memory"))]
pub(crate) mod conformance;
mod feed;
#[cfg(feature = "memory")]
pub(crate) mod memory;
pub(crate) mod schemes;
mod wire;

/// The AMQP transport's conversions, for tests that compare with amiquip's own encoder.
#[cfg(test)]
pub(crate) use amqp::convert as amqp_convert;
#[cfg(feature = "internals")]
pub(crate) use amqp::internals;
pub use capabilities::Capabilities;
pub(crate) use channel::{Channel, Consumer, ConsumerMessage, Deliveries, Delivery, Transport};
#[cfg(feature = "memory")]
pub(crate) use channel::{ChannelApi, ConsumerApi, Get, QueueState, Settle};
pub(crate) use feed::Feed;
#[cfg(feature = "memory")]
pub(crate) use wire::ConfirmPayload;
pub(crate) use wire::{
    AmqpError, AmqpProperties, AmqpValue, Blocked, Confirm, ConsumerOptions,
    ExchangeDeclareOptions, ExchangeType, FieldTable, Publish, QueueDeclareOptions,
    QueueDeleteOptions, Return,
};

/// Opens a connection to `address` with the transport its scheme names — the one place a
/// transport is chosen: one of [`schemes::SCHEMES`] (`memory://`, the in-process broker), else
/// AMQP (`amqp://`, `amqps://`). A new transport is a folder here and a line in that table.
pub(crate) fn connect(
    options: &crate::connection::ConnectionOptions,
    address: &crate::connection::Address,
) -> std::result::Result<(Box<dyn Transport>, Feed<Blocked>), crate::error::BoxError> {
    match address.transport.and_then(schemes::ops) {
        Some(ops) => (ops.connect)(&address.host, options.name.as_deref()),
        None => amqp::connect(options, address),
    }
}

/// How far the broker at `address` keeps its clock ahead of the system's, in ms: 0 on AMQP;
/// `memory://`'s is moved on by `testing::MemoryBroker::advance_clock`.
pub(crate) fn clock_offset_ms(address: &crate::connection::Address) -> i64 {
    address
        .transport
        .and_then(schemes::ops)
        .map_or(0, |ops| (ops.clock_offset_ms)(&address.host))
}
