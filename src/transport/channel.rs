//! The seam itself: [`Transport`] (a live connection), [`ChannelApi`] (a channel),
//! [`ConsumerApi`] (a subscription), and the owned wrappers the engine holds ([`Channel`],
//! [`Consumer`]) with the AMQP methods' names; a [`Delivery`], what settles it ([`Settle`]),
//! and the [`Deliveries`] buffer.

use std::any::Any;

use crate::envelope::{Message, Received};

use super::feed::Feed;

use super::wire::{
    AmqpError, AmqpProperties, Confirm, ConsumerOptions, ExchangeDeclareOptions, ExchangeType,
    FieldTable, Publish, QueueDeclareOptions, QueueDeleteOptions, Return,
};

type R<T> = std::result::Result<T, AmqpError>;

/// One live broker connection.
pub(crate) trait Transport: Send {
    /// Opens a channel (a round trip; the caller bounds it, `connection/link.rs`).
    fn open_channel(&mut self) -> R<Channel>;
    /// Closes the connection: its channels and subscriptions end.
    fn close(self: Box<Self>) -> R<()>;
    /// The broker's version as it announced it at connect (RabbitMQ's `version` server
    /// property, e.g. `4.0.5`), when it did.
    fn broker_version(&self) -> Option<String> {
        None
    }
    /// What it can do (`/acemq-info`'s `transport`).
    fn capabilities(&self) -> super::Capabilities;
}

/// One channel. Delivery tags are per channel, from 1, shared by consumed and got deliveries.
pub(crate) trait ChannelApi: Send {
    /// `basic.qos` with a per-consumer count (`global` false, as the engine asks).
    fn qos(&self, prefetch_size: u32, prefetch_count: u16, global: bool) -> R<()>;
    fn basic_publish(&self, exchange: &str, publish: Publish<'_>) -> R<()>;
    /// A synchronous no-op: answers once the broker has read and handled everything sent on
    /// this channel before it (a channel's frames are handled in order), so every
    /// `basic.return` for those publishes is already queued. An unconfirmed publisher's proof
    /// that what it handed over has left the process. Waits as long as the broker does not
    /// read (a memory alarm): call it where that cannot hold up a caller with a deadline.
    fn round_trip(&self) -> R<()>;
    /// `confirm.select`.
    fn enable_publisher_confirms(&self) -> R<()>;
    /// The channel's confirms (acks and nacks, by publish sequence number).
    fn listen_for_publisher_confirms(&self) -> R<Feed<Confirm>>;
    /// The channel's returned (unroutable mandatory) messages, each sent before its confirm.
    fn listen_for_returns(&self) -> R<Feed<Return>>;
    fn queue_declare(&self, queue: &str, options: QueueDeclareOptions) -> R<QueueState>;
    fn queue_declare_passive(&self, queue: &str) -> R<QueueState>;
    fn queue_bind(&self, queue: &str, exchange: &str, key: &str, arguments: FieldTable) -> R<()>;
    fn queue_unbind(&self, queue: &str, exchange: &str, key: &str, arguments: FieldTable) -> R<()>;
    fn queue_purge(&self, queue: &str) -> R<u32>;
    fn queue_delete(&self, queue: &str, options: QueueDeleteOptions) -> R<u32>;
    fn exchange_declare(
        &self,
        kind: ExchangeType,
        exchange: &str,
        options: ExchangeDeclareOptions,
    ) -> R<()>;
    fn exchange_declare_passive(&self, exchange: &str) -> R<()>;
    fn exchange_delete(&self, exchange: &str, if_unused: bool) -> R<()>;
    fn basic_consume<'a>(&'a self, queue: &str, options: ConsumerOptions) -> R<Consumer<'a>>;
    fn basic_get(&self, queue: &str, no_ack: bool) -> R<Option<Get>>;
    fn ack(&self, delivery: Delivery, multiple: bool) -> R<()>;
    fn nack(&self, delivery: Delivery, multiple: bool, requeue: bool) -> R<()>;
    /// Rejects every unacknowledged delivery on the channel (`multiple` with tag 0).
    fn nack_all(&self, requeue: bool) -> R<()>;
    fn close(self: Box<Self>) -> R<()>;
}

/// One subscription (`basic.consume`); its deliveries are read from [`Consumer::receiver`].
pub(crate) trait ConsumerApi {
    /// `basic.cancel`; the buffer then ends with [`ConsumerMessage::ClientCancelled`].
    fn cancel(&self) -> R<()>;
}

/// A channel, whichever transport it is on.
pub(crate) struct Channel {
    api: Box<dyn ChannelApi>,
}

impl Channel {
    pub(crate) fn new(api: Box<dyn ChannelApi>) -> Channel {
        Channel { api }
    }

    pub(crate) fn qos(&self, prefetch_size: u32, prefetch_count: u16, global: bool) -> R<()> {
        self.api.qos(prefetch_size, prefetch_count, global)
    }
    pub(crate) fn basic_publish<S: AsRef<str>>(&self, exchange: S, publish: Publish<'_>) -> R<()> {
        self.api.basic_publish(exchange.as_ref(), publish)
    }
    pub(crate) fn round_trip(&self) -> R<()> {
        self.api.round_trip()
    }
    pub(crate) fn enable_publisher_confirms(&self) -> R<()> {
        self.api.enable_publisher_confirms()
    }
    pub(crate) fn listen_for_publisher_confirms(&self) -> R<Feed<Confirm>> {
        self.api.listen_for_publisher_confirms()
    }
    pub(crate) fn listen_for_returns(&self) -> R<Feed<Return>> {
        self.api.listen_for_returns()
    }
    pub(crate) fn queue_declare<S: AsRef<str>>(
        &self,
        queue: S,
        options: QueueDeclareOptions,
    ) -> R<QueueState> {
        self.api.queue_declare(queue.as_ref(), options)
    }
    pub(crate) fn queue_declare_passive<S: AsRef<str>>(&self, queue: S) -> R<QueueState> {
        self.api.queue_declare_passive(queue.as_ref())
    }
    pub(crate) fn queue_bind<A: AsRef<str>, B: AsRef<str>, C: AsRef<str>>(
        &self,
        queue: A,
        exchange: B,
        key: C,
        arguments: FieldTable,
    ) -> R<()> {
        self.api
            .queue_bind(queue.as_ref(), exchange.as_ref(), key.as_ref(), arguments)
    }
    pub(crate) fn queue_unbind<A: AsRef<str>, B: AsRef<str>, C: AsRef<str>>(
        &self,
        queue: A,
        exchange: B,
        key: C,
        arguments: FieldTable,
    ) -> R<()> {
        self.api
            .queue_unbind(queue.as_ref(), exchange.as_ref(), key.as_ref(), arguments)
    }
    pub(crate) fn queue_purge<S: AsRef<str>>(&self, queue: S) -> R<u32> {
        self.api.queue_purge(queue.as_ref())
    }
    pub(crate) fn queue_delete<S: AsRef<str>>(
        &self,
        queue: S,
        options: QueueDeleteOptions,
    ) -> R<u32> {
        self.api.queue_delete(queue.as_ref(), options)
    }
    pub(crate) fn exchange_declare<S: AsRef<str>>(
        &self,
        kind: ExchangeType,
        exchange: S,
        options: ExchangeDeclareOptions,
    ) -> R<()> {
        self.api.exchange_declare(kind, exchange.as_ref(), options)
    }
    pub(crate) fn exchange_declare_passive<S: AsRef<str>>(&self, exchange: S) -> R<()> {
        self.api.exchange_declare_passive(exchange.as_ref())
    }
    pub(crate) fn exchange_delete<S: AsRef<str>>(&self, exchange: S, if_unused: bool) -> R<()> {
        self.api.exchange_delete(exchange.as_ref(), if_unused)
    }
    pub(crate) fn basic_consume<S: AsRef<str>>(
        &self,
        queue: S,
        options: ConsumerOptions,
    ) -> R<Consumer<'_>> {
        self.api.basic_consume(queue.as_ref(), options)
    }
    pub(crate) fn basic_get<S: AsRef<str>>(&self, queue: S, no_ack: bool) -> R<Option<Get>> {
        self.api.basic_get(queue.as_ref(), no_ack)
    }
    pub(crate) fn nack_all(&self, requeue: bool) -> R<()> {
        self.api.nack_all(requeue)
    }
    pub(crate) fn close(self) -> R<()> {
        self.api.close()
    }
}

/// A queue as a declare answered it.
#[derive(Clone, Debug)]
pub(crate) struct QueueState {
    pub(crate) name: String,
    pub(crate) message_count: u32,
    pub(crate) consumer_count: u32,
}

impl QueueState {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }
    pub(crate) fn message_count(&self) -> u32 {
        self.message_count
    }
    pub(crate) fn consumer_count(&self) -> u32 {
        self.consumer_count
    }
}

/// A subscription, whichever transport it is on. Dropping it without
/// `consume::subscribe::cancel_and_drain` cancels without waiting (amiquip's behaviour).
pub(crate) struct Consumer<'a> {
    api: Box<dyn ConsumerApi + 'a>,
    receiver: Deliveries,
}

impl<'a> Consumer<'a> {
    pub(crate) fn new(api: Box<dyn ConsumerApi + 'a>, receiver: Deliveries) -> Consumer<'a> {
        Consumer { api, receiver }
    }
    pub(crate) fn receiver(&self) -> &Deliveries {
        &self.receiver
    }
    pub(crate) fn cancel(&self) -> R<()> {
        self.api.cancel()
    }
}

/// What a transport needs, besides the delivery's tag, to settle it: nothing on `memory://`;
/// on AMQP what is left of amiquip's own delivery (its channel and tag), which amiquip acks
/// with. Opaque to everything but the transport that made it.
pub(crate) struct Settle(Option<Box<dyn Token>>);

/// A transport's settle value: anything sendable and cloneable.
trait Token: Send {
    fn clone_box(&self) -> Box<dyn Token>;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Any + Send + Clone> Token for T {
    fn clone_box(&self) -> Box<dyn Token> {
        Box::new(self.clone())
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

impl Settle {
    /// Nothing beyond the tag.
    #[cfg(feature = "memory")]
    pub(crate) fn tag_only() -> Settle {
        Settle(None)
    }
    /// The transport's own value.
    pub(crate) fn with<T: Any + Send + Clone>(value: T) -> Settle {
        Settle(Some(Box::new(value)))
    }
    /// The transport's value back, if it is a `T` (a delivery of another transport is not).
    pub(crate) fn take<T: Any>(self) -> Option<T> {
        self.0?.into_any().downcast::<T>().ok().map(|b| *b)
    }
}

impl Clone for Settle {
    fn clone(&self) -> Settle {
        Settle(self.0.as_ref().map(|t| t.clone_box()))
    }
}

impl std::fmt::Debug for Settle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Settle")
    }
}

/// A message delivered to a consumer or got, and what settles it.
#[derive(Clone, Debug)]
pub(crate) struct Delivery {
    /// Set when the message was delivered before (requeued).
    pub(crate) redelivered: bool,
    pub(crate) exchange: String,
    pub(crate) routing_key: String,
    pub(crate) body: Vec<u8>,
    pub(crate) properties: AmqpProperties,
    delivery_tag: u64,
    settle: Settle,
}

impl Delivery {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        delivery_tag: u64,
        redelivered: bool,
        exchange: String,
        routing_key: String,
        body: Vec<u8>,
        properties: AmqpProperties,
        settle: Settle,
    ) -> Delivery {
        Delivery {
            redelivered,
            exchange,
            routing_key,
            body,
            properties,
            delivery_tag,
            settle,
        }
    }

    /// The delivery's tag on its channel.
    pub(crate) fn delivery_tag(&self) -> u64 {
        self.delivery_tag
    }

    /// Moves the body, properties, exchange and routing key out into a received message; what
    /// is left (its tag and its [`Settle`]) is enough to settle it.
    pub(crate) fn take_message(&mut self) -> Message {
        let received = Received {
            exchange: std::mem::take(&mut self.exchange),
            routing_key: std::mem::take(&mut self.routing_key),
            redelivered: self.redelivered,
            delivery_tag: self.delivery_tag,
        };
        let body = std::mem::take(&mut self.body);
        let properties = std::mem::take(&mut self.properties);
        Message::from_delivery(body, properties, received)
    }

    /// What settles it, for its transport.
    pub(crate) fn into_settle(self) -> Settle {
        self.settle
    }

    pub(crate) fn ack(self, channel: &Channel) -> R<()> {
        channel.api.ack(self, false)
    }
    pub(crate) fn ack_multiple(self, channel: &Channel) -> R<()> {
        channel.api.ack(self, true)
    }
    pub(crate) fn nack(self, channel: &Channel, requeue: bool) -> R<()> {
        channel.api.nack(self, false, requeue)
    }
}

/// A `basic.get` answer.
#[derive(Debug)]
pub(crate) struct Get {
    pub(crate) delivery: Delivery,
    /// Messages left in the queue. The engine does not read it; the memory broker's contract
    /// tests compare it with RabbitMQ's (hence unread in a build without them).
    #[allow(dead_code)]
    pub(crate) message_count: u32,
}

/// What a subscription's buffer yields: a delivery, or how the subscription ended.
#[allow(clippy::large_enum_variant)] // as amiquip's own ConsumerMessage: nearly all are deliveries
#[derive(Debug)]
pub(crate) enum ConsumerMessage {
    Delivery(Delivery),
    ClientCancelled,
    ServerCancelled,
    ClientClosedChannel,
    ServerClosedChannel(AmqpError),
    ClientClosedConnection,
    ServerClosedConnection(AmqpError),
}

/// A subscription's buffer of deliveries: cloneable, read by several threads, and waited on in
/// a `Select` beside other channels ([`Feed::register`], [`Feed::read`]).
pub(crate) type Deliveries = Feed<ConsumerMessage>;
