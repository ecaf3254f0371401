//! Not for applications (feature `internals`): the decoders of bytes from the wire and the
//! database, reachable by this crate's fuzz targets (`fuzz/`) and property tests. No stability
//! promise.

use crate::wire::AmqpProperties;

pub use crate::transport::internals::{
    from_amiquip_properties, message_from_amiquip_delivery, to_amiquip_properties,
};

use crate::envelope::{Message, Received};
use crate::Result;

/// Reads a delivery as a consumer does: envelope (with every default), engine headers,
/// application headers, the AMQP properties.
pub fn read_delivery(
    body: Vec<u8>,
    properties: AmqpProperties,
    exchange: &str,
    routing_key: &str,
) -> Message {
    Message::from_delivery(
        body,
        properties,
        Received {
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
            redelivered: false,
            delivery_tag: 1,
        },
    )
}

/// The properties a copy of `message` (retry, dead letter, replay) is published with: what
/// cannot be re-sent is dropped first, as the consumer's worker does, and the copy must then
/// validate.
///
/// # Errors
///
/// The validation error, which a copy never should have after the headers it cannot carry
/// are dropped (a fuzz target asserts it never happens).
pub fn copy_properties(message: &Message, routing_key: &str) -> Result<AmqpProperties> {
    let mut copy = message.clone();
    if copy.validate().is_err() {
        copy.drop_invalid_headers();
    }
    copy.validate()?;
    Ok(copy.to_properties(routing_key, Some("fuzz@localhost")))
}

/// The message an outbox row read back from the database stands for (columns as the SQL
/// store selects them: id, exchange, routing key, body, content type, headers JSON, created,
/// attempts, last error).
///
/// # Errors
///
/// What the store returns for a row it cannot read (a column of the wrong type, headers that
/// are not a JSON object).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub fn outbox_row(row: &[crate::sql::Value]) -> Result<Message> {
    let mut record = crate::patterns::outbox::record_from_row(row)?;
    Ok(crate::patterns::outbox::take_message(&mut record))
}

/// The encoded size, in bytes, of the content header frame (framing, properties and header
/// table) a publish of `message` with `routing_key` through a connection whose origin is
/// `origin` sends — the size checked against the frame limit before it is sent.
pub fn header_frame_size(message: &Message, routing_key: &str, origin: &str) -> usize {
    crate::publish::header_frame_size(&message.to_properties(routing_key, Some(origin)))
}

/// The encoded size, in bytes, of the content header frame a publish with exactly these
/// properties sends (framing included).
pub fn properties_frame_size(properties: &AmqpProperties) -> usize {
    crate::publish::header_frame_size(properties)
}
