//! The AMQP transport: amiquip behind the seam. Each call is amiquip's own, once; what crosses
//! is converted where it is sent or read (`convert.rs`): no thread and no copy of a body is
//! added. The only folder that names amiquip.

mod connect;
mod consumer;
pub(crate) mod convert;
#[cfg(feature = "internals")]
pub(crate) mod internals;

use super::channel::{
    Channel, ChannelApi, Consumer, Deliveries, Delivery, Get, QueueState, Transport,
};
use super::feed::Feed;
use super::wire::{
    AmqpError, Blocked, Confirm, ConsumerOptions, ExchangeDeclareOptions, ExchangeType, FieldTable,
    Publish, QueueDeclareOptions, QueueDeleteOptions, Return,
};
use consumer::{AmqpConsumer, Ended};
use convert::error_in;

type R<T> = std::result::Result<T, AmqpError>;

/// Connects to `address` (`amqp://` or `amqps://`) with `options` (`connect.rs`).
pub(crate) fn connect(
    options: &crate::connection::ConnectionOptions,
    address: &crate::connection::Address,
) -> std::result::Result<(Box<dyn Transport>, Feed<Blocked>), crate::error::BoxError> {
    let (conn, blocked) = connect::open(options, address)?;
    Ok((
        Box::new(AmqpTransport(conn)),
        Feed::mapped(blocked, convert::blocked_in),
    ))
}

/// One amiquip connection.
pub(crate) struct AmqpTransport(pub(crate) amiquip::Connection);

impl Transport for AmqpTransport {
    fn open_channel(&mut self) -> R<Channel> {
        let channel = self.0.open_channel(None).map_err(error_in)?;
        Ok(Channel::new(Box::new(AmqpChannel(
            channel,
            Ended::default(),
        ))))
    }

    fn close(self: Box<Self>) -> R<()> {
        self.0.close().map_err(error_in)
    }

    fn capabilities(&self) -> super::Capabilities {
        super::Capabilities::ALL
    }

    fn broker_version(&self) -> Option<String> {
        match self.0.server_properties().get("version")? {
            amiquip::AmqpValue::LongString(v) => Some(v.clone()),
            _ => None,
        }
    }
}

/// One amiquip channel, and the receivers of its dropped consumers (`consumer.rs`). The
/// channel drops (and closes) first.
struct AmqpChannel(amiquip::Channel, Ended);

/// What is left of amiquip's delivery (its channel and tag), which its ack needs; a delivery
/// another transport made is refused, not settled.
fn amiquip_delivery(d: Delivery) -> R<amiquip::Delivery> {
    d.into_settle()
        .take::<amiquip::Delivery>()
        .ok_or_else(|| AmqpError::Other {
            message: "a delivery of another transport settled on an AMQP channel".into(),
        })
}

fn queue_state(q: &amiquip::Queue<'_>) -> QueueState {
    QueueState {
        name: q.name().to_string(),
        message_count: q.declared_message_count().unwrap_or(0),
        consumer_count: q.declared_consumer_count().unwrap_or(0),
    }
}

impl ChannelApi for AmqpChannel {
    fn qos(&self, prefetch_size: u32, prefetch_count: u16, global: bool) -> R<()> {
        self.0
            .qos(prefetch_size, prefetch_count, global)
            .map_err(error_in)?;
        self.1.release();
        Ok(())
    }
    fn basic_publish(&self, exchange: &str, publish: Publish<'_>) -> R<()> {
        self.0
            .basic_publish(exchange, convert::publish_out(publish))
            .map_err(error_in)
    }
    /// `basic.qos` asking for nothing (no prefetch limit; a publishing channel has no
    /// consumers): its `qos-ok` comes back after every earlier frame on the channel was handled.
    fn round_trip(&self) -> R<()> {
        self.0.qos(0, 0, false).map_err(error_in)?;
        self.1.release();
        Ok(())
    }
    fn enable_publisher_confirms(&self) -> R<()> {
        self.0.enable_publisher_confirms().map_err(error_in)
    }
    fn listen_for_publisher_confirms(&self) -> R<Feed<Confirm>> {
        let rx = self.0.listen_for_publisher_confirms().map_err(error_in)?;
        Ok(Feed::mapped(rx, convert::confirm_in))
    }
    fn listen_for_returns(&self) -> R<Feed<Return>> {
        let rx = self.0.listen_for_returns().map_err(error_in)?;
        Ok(Feed::mapped(rx, convert::return_in))
    }
    fn queue_declare(&self, queue: &str, options: QueueDeclareOptions) -> R<QueueState> {
        self.0
            .queue_declare(queue, convert::queue_declare_out(options))
            .map(|q| queue_state(&q))
            .map_err(error_in)
    }
    fn queue_declare_passive(&self, queue: &str) -> R<QueueState> {
        self.0
            .queue_declare_passive(queue)
            .map(|q| queue_state(&q))
            .map_err(error_in)
    }
    fn queue_bind(&self, queue: &str, exchange: &str, key: &str, arguments: FieldTable) -> R<()> {
        self.0
            .queue_bind(queue, exchange, key, convert::table_out(arguments))
            .map_err(error_in)
    }
    fn queue_unbind(&self, queue: &str, exchange: &str, key: &str, arguments: FieldTable) -> R<()> {
        self.0
            .queue_unbind(queue, exchange, key, convert::table_out(arguments))
            .map_err(error_in)
    }
    fn queue_purge(&self, queue: &str) -> R<u32> {
        self.0.queue_purge(queue).map_err(error_in)
    }
    fn queue_delete(&self, queue: &str, options: QueueDeleteOptions) -> R<u32> {
        self.0
            .queue_delete(queue, convert::queue_delete_out(options))
            .map_err(error_in)
    }
    fn exchange_declare(
        &self,
        kind: ExchangeType,
        exchange: &str,
        options: ExchangeDeclareOptions,
    ) -> R<()> {
        self.0
            .exchange_declare(
                convert::exchange_type_out(kind),
                exchange,
                convert::exchange_declare_out(options),
            )
            .map(drop)
            .map_err(error_in)
    }
    fn exchange_declare_passive(&self, exchange: &str) -> R<()> {
        self.0
            .exchange_declare_passive(exchange)
            .map(drop)
            .map_err(error_in)
    }
    fn exchange_delete(&self, exchange: &str, if_unused: bool) -> R<()> {
        self.0
            .exchange_delete(exchange, if_unused)
            .map_err(error_in)
    }
    fn basic_consume<'a>(&'a self, queue: &str, options: ConsumerOptions) -> R<Consumer<'a>> {
        let consumer = self
            .0
            .basic_consume(queue, convert::consumer_out(options))
            .map_err(error_in)?;
        self.1.release();
        let receiver: Deliveries =
            Feed::mapped(consumer.receiver().clone(), convert::consumer_message_in);
        Ok(Consumer::new(
            Box::new(AmqpConsumer::new(consumer, &self.1)),
            receiver,
        ))
    }
    fn basic_get(&self, queue: &str, no_ack: bool) -> R<Option<Get>> {
        let got = self.0.basic_get(queue, no_ack).map_err(error_in)?;
        self.1.release();
        Ok(got.map(|g| Get {
            message_count: g.message_count,
            delivery: convert::delivery_in(g.delivery),
        }))
    }
    fn ack(&self, delivery: Delivery, multiple: bool) -> R<()> {
        let d = amiquip_delivery(delivery)?;
        if multiple {
            d.ack_multiple(&self.0)
        } else {
            d.ack(&self.0)
        }
        .map_err(error_in)
    }
    fn nack(&self, delivery: Delivery, multiple: bool, requeue: bool) -> R<()> {
        let d = amiquip_delivery(delivery)?;
        if multiple {
            d.nack_multiple(&self.0, requeue)
        } else {
            d.nack(&self.0, requeue)
        }
        .map_err(error_in)
    }
    fn nack_all(&self, requeue: bool) -> R<()> {
        self.0.nack_all(requeue).map_err(error_in)
    }
    fn close(self: Box<Self>) -> R<()> {
        self.0.close().map_err(error_in)
    }
}
