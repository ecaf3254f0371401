//! The AMQP data that crosses the seam: the protocol's own types (as amiquip re-exports them
//! from `amq-protocol`), plain values every implementation builds and reads. Errors are the
//! protocol's too ([`AmqpError`]): a refusal carries its reply code (404, 405, 406, 540) as
//! RabbitMQ sends it, so `Error::from_amqp_on` reads one form whichever transport answered.

#[cfg(feature = "memory")]
pub(crate) use amiquip::ConfirmPayload;
pub(crate) use amiquip::{
    AmqpProperties, AmqpValue, Confirm, ConnectionBlockedNotification as Blocked, ConsumerOptions,
    Error as AmqpError, ExchangeDeclareOptions, ExchangeType, FieldTable, Publish,
    QueueDeclareOptions, QueueDeleteOptions, Return,
};
