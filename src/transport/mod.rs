//! The transport seam: what the engine (publisher, consumer runtime, requester, replay, peek,
//! scheduler, stream reader) asks of a broker connection, behind one small internal trait pair,
//! and its implementations.
//!
//! * [`Transport`] is one live connection: open a channel, close.
//! * [`ChannelApi`] is one channel: declare / check / delete / bind, publish with confirms and
//!   returns, consume with a prefetch, ack / nack / reject (`multiple`, requeue or not), get,
//!   close. [`Channel`] owns one (boxed) and gives it amiquip's method names, so the callers read
//!   as they did.
//! * [`Deliveries`] is a subscription's buffer: a crossbeam receiver the callers `select` on
//!   with their own channels. Its AMQP form *is* amiquip's receiver (a delivery is converted
//!   where it is read: no thread and no copy of the body in between), so the AMQP path costs
//!   what it did.
//!
//! The data that crosses the seam is AMQP's own (properties, field tables, values, confirms,
//! returns, the protocol's errors with their reply codes: [`wire`]); only amiquip's behaviour
//! (its connection, channel, consumer and delivery) stays behind [`amqp`]. Nothing above this
//! layer names amiquip.
//!
//! Implementations: [`amqp`] (amiquip, `amqp://` and `amqps://`) and, with the `memory`
//! feature, `memory` (an in-process broker, `memory://name`).

mod amqp;
mod capabilities;
mod channel;
#[cfg(feature = "memory")]
pub(crate) mod memory;
mod wire;

pub use capabilities::Capabilities;
pub(crate) use channel::{Channel, Consumer, ConsumerMessage, Deliveries, Delivery, Transport};
#[cfg(feature = "memory")]
pub(crate) use channel::{ChannelApi, ConsumerApi, Get, QueueState, Shell};
#[cfg(feature = "memory")]
pub(crate) use wire::ConfirmPayload;
pub(crate) use wire::{
    AmqpError, AmqpProperties, AmqpValue, Blocked, Confirm, ConsumerOptions,
    ExchangeDeclareOptions, ExchangeType, FieldTable, Publish, QueueDeclareOptions,
    QueueDeleteOptions, Return,
};

/// Opens a connection to `address` with the transport its scheme names — the one place a
/// transport is chosen: `memory://` the in-process broker (feature `memory`), else AMQP
/// (`amqp://`, `amqps://`). A new transport is a folder here and a line in this function.
pub(crate) fn connect(
    options: &crate::connection::ConnectionOptions,
    address: &crate::connection::Address,
) -> std::result::Result<
    (Box<dyn Transport>, crossbeam_channel::Receiver<Blocked>),
    crate::error::BoxError,
> {
    #[cfg(feature = "memory")]
    if address.memory {
        return Ok(memory::connect(&address.host, options.name.as_deref())?);
    }
    amqp::connect(options, address)
}
