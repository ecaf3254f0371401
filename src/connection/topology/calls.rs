//! The AMQP calls that declare one exchange, queue or binding on a given channel, with the
//! broker's refusals mapped to this crate's errors.

use crate::transport::{Channel, ExchangeDeclareOptions, ExchangeType};

use super::spec::{to_table, Binding, ExchangeKind, ExchangeSpec, QueueInfo, QueueSpec};
use crate::error::{Error, Result};

pub(super) fn map_err(
    kind: &'static str,
    name: &str,
    doing: &str,
    e: crate::transport::AmqpError,
) -> Error {
    Error::from_amqp_on(kind, name, doing, e)
}

pub(super) fn declare_exchange_on(channel: &Channel, spec: &ExchangeSpec) -> Result<()> {
    let kind = match &spec.kind {
        ExchangeKind::Direct => ExchangeType::Direct,
        ExchangeKind::Fanout => ExchangeType::Fanout,
        ExchangeKind::Topic => ExchangeType::Topic,
        ExchangeKind::Headers => ExchangeType::Headers,
        ExchangeKind::Custom(s) => ExchangeType::Custom(s.clone()),
    };
    let options = ExchangeDeclareOptions {
        durable: spec.durable,
        auto_delete: spec.auto_delete,
        internal: spec.internal,
        arguments: to_table(&spec.arguments),
    };
    channel
        .exchange_declare(kind, spec.name.clone(), options)
        .map(|_| ())
        .map_err(|e| map_err("exchange", &spec.name, "declaring", e))
}

pub(crate) fn declare_queue_on(channel: &Channel, spec: &QueueSpec) -> Result<QueueInfo> {
    let q = channel
        .queue_declare(spec.name.clone(), spec.options())
        .map_err(|e| map_err("queue", &spec.name, "declaring", e))?;
    Ok(QueueInfo {
        name: q.name().to_string(),
        message_count: q.message_count(),
        consumer_count: q.consumer_count(),
    })
}

pub(super) fn bind_on(channel: &Channel, b: &Binding) -> Result<()> {
    channel
        .queue_bind(
            b.queue.clone(),
            b.exchange.clone(),
            b.routing_key.clone(),
            to_table(&b.arguments),
        )
        .map_err(|e| map_err("queue", &b.queue, "binding", e))
}
