//! Not for applications (feature `internals`, reached through `acemq_amqp::fuzzing`): amiquip's
//! side of the crate's own types, for this crate's benchmarks and tests that drive raw amiquip
//! beside the library.

use crate::envelope::{Message, Received};
use crate::wire::AmqpProperties;

/// `properties` as amiquip's, for a raw amiquip publish carrying what the library writes.
pub fn to_amiquip_properties(properties: AmqpProperties) -> amiquip::AmqpProperties {
    super::convert::properties_out(properties)
}

/// Reads a raw amiquip delivery as a consumer of this crate would.
pub fn message_from_amiquip_delivery(d: &amiquip::Delivery) -> Message {
    Message::from_delivery(
        d.body.clone(),
        super::convert::properties_in(&d.properties),
        Received {
            exchange: d.exchange.clone(),
            routing_key: d.routing_key.clone(),
            redelivered: d.redelivered,
            delivery_tag: d.delivery_tag(),
        },
    )
}

/// amiquip's `properties` as the crate's, for a test that measures what raw amiquip sends.
pub fn from_amiquip_properties(properties: &amiquip::AmqpProperties) -> AmqpProperties {
    super::convert::properties_in(properties)
}
