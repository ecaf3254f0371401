//! The AMQP transport: amiquip behind the seam. Each call is amiquip's own, once; a delivery
//! is converted where it is read ([`Deliveries::Amqp`]).

mod connect;

use crossbeam_channel::Receiver;

use super::channel::{
    Channel, ChannelApi, Consumer, ConsumerApi, ConsumerMessage, Deliveries, Delivery, Get,
    QueueState, Shell, Transport,
};
use super::wire::{
    AmqpError, Confirm, ConsumerOptions, ExchangeDeclareOptions, ExchangeType, FieldTable, Publish,
    QueueDeclareOptions, QueueDeleteOptions, Return,
};

type R<T> = std::result::Result<T, AmqpError>;

/// Connects to `address` (`amqp://` or `amqps://`) with `options` (`connect.rs`).
pub(crate) fn connect(
    options: &crate::connection::ConnectionOptions,
    address: &crate::connection::Address,
) -> std::result::Result<(Box<dyn Transport>, Receiver<super::Blocked>), crate::error::BoxError> {
    let (conn, blocked) = connect::open(options, address)?;
    Ok((Box::new(AmqpTransport(conn)), blocked))
}

/// One amiquip connection.
pub(crate) struct AmqpTransport(pub(crate) amiquip::Connection);

impl Transport for AmqpTransport {
    fn open_channel(&mut self) -> R<Channel> {
        let channel = self.0.open_channel(None)?;
        Ok(Channel::new(Box::new(AmqpChannel(channel))))
    }

    fn close(self: Box<Self>) -> R<()> {
        self.0.close()
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

struct AmqpChannel(amiquip::Channel);

/// What is left of amiquip's delivery (its channel and tag), which its ack needs.
fn shell(d: Delivery) -> amiquip::Delivery {
    match d.shell() {
        Shell::Amqp(d) => d,
        #[cfg(feature = "memory")]
        Shell::Memory => unreachable!("a memory:// delivery settled on an AMQP channel"),
    }
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
        self.0.qos(prefetch_size, prefetch_count, global)
    }
    fn basic_publish(&self, exchange: &str, publish: Publish<'_>) -> R<()> {
        self.0.basic_publish(exchange, publish)
    }
    fn enable_publisher_confirms(&self) -> R<()> {
        self.0.enable_publisher_confirms()
    }
    fn listen_for_publisher_confirms(&self) -> R<Receiver<Confirm>> {
        self.0.listen_for_publisher_confirms()
    }
    fn listen_for_returns(&self) -> R<Receiver<Return>> {
        self.0.listen_for_returns()
    }
    fn queue_declare(&self, queue: &str, options: QueueDeclareOptions) -> R<QueueState> {
        self.0
            .queue_declare(queue, options)
            .map(|q| queue_state(&q))
    }
    fn queue_declare_passive(&self, queue: &str) -> R<QueueState> {
        self.0.queue_declare_passive(queue).map(|q| queue_state(&q))
    }
    fn queue_bind(&self, queue: &str, exchange: &str, key: &str, arguments: FieldTable) -> R<()> {
        self.0.queue_bind(queue, exchange, key, arguments)
    }
    fn queue_unbind(&self, queue: &str, exchange: &str, key: &str, arguments: FieldTable) -> R<()> {
        self.0.queue_unbind(queue, exchange, key, arguments)
    }
    fn queue_purge(&self, queue: &str) -> R<u32> {
        self.0.queue_purge(queue)
    }
    fn queue_delete(&self, queue: &str, options: QueueDeleteOptions) -> R<u32> {
        self.0.queue_delete(queue, options)
    }
    fn exchange_declare(
        &self,
        kind: ExchangeType,
        exchange: &str,
        options: ExchangeDeclareOptions,
    ) -> R<()> {
        self.0.exchange_declare(kind, exchange, options).map(drop)
    }
    fn exchange_declare_passive(&self, exchange: &str) -> R<()> {
        self.0.exchange_declare_passive(exchange).map(drop)
    }
    fn exchange_delete(&self, exchange: &str, if_unused: bool) -> R<()> {
        self.0.exchange_delete(exchange, if_unused)
    }
    fn basic_consume<'a>(&'a self, queue: &str, options: ConsumerOptions) -> R<Consumer<'a>> {
        let consumer = self.0.basic_consume(queue, options)?;
        let receiver = Deliveries::Amqp(consumer.receiver().clone());
        Ok(Consumer::new(Box::new(AmqpConsumer(consumer)), receiver))
    }
    fn basic_get(&self, queue: &str, no_ack: bool) -> R<Option<Get>> {
        Ok(self.0.basic_get(queue, no_ack)?.map(|g| Get {
            message_count: g.message_count,
            delivery: ConsumerMessage::amqp_delivery(g.delivery),
        }))
    }
    fn ack(&self, delivery: Delivery, multiple: bool) -> R<()> {
        let d = shell(delivery);
        if multiple {
            d.ack_multiple(&self.0)
        } else {
            d.ack(&self.0)
        }
    }
    fn nack(&self, delivery: Delivery, multiple: bool, requeue: bool) -> R<()> {
        let d = shell(delivery);
        if multiple {
            d.nack_multiple(&self.0, requeue)
        } else {
            d.nack(&self.0, requeue)
        }
    }
    fn nack_all(&self, requeue: bool) -> R<()> {
        self.0.nack_all(requeue)
    }
    fn close(self: Box<Self>) -> R<()> {
        self.0.close()
    }
}

struct AmqpConsumer<'a>(amiquip::Consumer<'a>);

impl ConsumerApi for AmqpConsumer<'_> {
    fn cancel(&self) -> R<()> {
        self.0.cancel()
    }
}
