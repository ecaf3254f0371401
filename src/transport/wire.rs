//! What crosses the seam besides a message's data (`crate::wire`): a publish, its confirm, a
//! returned message, the broker's blocked notice, and the options of a declaration, a delete
//! and a subscription — the crate's own small types, which each transport reads and answers
//! (`amqp/convert.rs` turns them into amiquip's).

pub(crate) use crate::wire::{AmqpError, AmqpProperties, AmqpValue, FieldTable};

/// A message to publish: its body (borrowed: the transport writes it into frames), where it
/// goes and its properties.
#[derive(Debug)]
pub(crate) struct Publish<'a> {
    pub(crate) body: &'a [u8],
    pub(crate) routing_key: String,
    /// Returned (`basic.return`) when no queue takes it, rather than dropped.
    pub(crate) mandatory: bool,
    pub(crate) properties: AmqpProperties,
}

#[cfg(test)]
impl<'a> Publish<'a> {
    /// A publish with no properties, not mandatory.
    pub(crate) fn new(body: &'a [u8], routing_key: impl Into<String>) -> Publish<'a> {
        Publish::with_properties(body, routing_key, AmqpProperties::default())
    }
    /// A publish with these properties, not mandatory.
    pub(crate) fn with_properties(
        body: &'a [u8],
        routing_key: impl Into<String>,
        properties: AmqpProperties,
    ) -> Publish<'a> {
        Publish {
            body,
            routing_key: routing_key.into(),
            mandatory: false,
            properties,
        }
    }
}

/// The broker's answer to a publish on a confirming channel, by publish sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Confirm {
    Ack(ConfirmPayload),
    Nack(ConfirmPayload),
}

/// Which publishes a confirm answers: `delivery_tag`, and with `multiple` every one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConfirmPayload {
    pub(crate) delivery_tag: u64,
    pub(crate) multiple: bool,
}

/// A mandatory message no queue took, sent back before its confirm: why, where it went and its
/// properties (the engine matches it to its publish by its id); its body is not kept.
#[derive(Clone, Debug)]
pub(crate) struct Return {
    pub(crate) reply_code: u16,
    pub(crate) reply_text: String,
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) properties: AmqpProperties,
}

/// The broker's notice that it blocks or unblocks the connection's publishers (a resource
/// alarm).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Blocked {
    Blocked(String),
    Unblocked,
}

/// An exchange's type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ExchangeType {
    Direct,
    Fanout,
    Topic,
    Headers,
    /// A plugin's type, e.g. `x-delayed-message`.
    Custom(String),
}

/// `queue.declare`'s options.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct QueueDeclareOptions {
    pub(crate) durable: bool,
    pub(crate) exclusive: bool,
    pub(crate) auto_delete: bool,
    pub(crate) arguments: FieldTable,
}

/// `exchange.declare`'s options.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ExchangeDeclareOptions {
    pub(crate) durable: bool,
    pub(crate) auto_delete: bool,
    pub(crate) internal: bool,
    pub(crate) arguments: FieldTable,
}

/// `queue.delete`'s options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct QueueDeleteOptions {
    pub(crate) if_unused: bool,
    pub(crate) if_empty: bool,
}

/// `basic.consume`'s options.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ConsumerOptions {
    pub(crate) no_local: bool,
    pub(crate) no_ack: bool,
    pub(crate) exclusive: bool,
    pub(crate) arguments: FieldTable,
}
