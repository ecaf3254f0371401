//! The seam on the memory broker: [`MemoryTransport`] (a connection), its channels and
//! consumers. Each call takes the broker's lock once; dropping a handle does what amiquip's
//! drop does (a connection or channel closes, a consumer is cancelled without waiting).

use std::sync::Arc;

use super::reply::{closed, not_emulated};
use super::state::{Broker, Chan, End, State};
use crate::transport::{
    AmqpError, Channel, ChannelApi, Confirm, Consumer, ConsumerApi, ConsumerMessage,
    ConsumerOptions, Deliveries, Delivery, ExchangeDeclareOptions, ExchangeType, Feed, FieldTable,
    Get, Publish, QueueDeclareOptions, QueueDeleteOptions, QueueState, Return, Transport,
};

type R<T> = std::result::Result<T, AmqpError>;

/// One connection to a memory broker.
pub(super) struct MemoryTransport {
    broker: Arc<Broker>,
    conn: u64,
}

impl MemoryTransport {
    pub(super) fn new(broker: Arc<Broker>, conn: u64) -> MemoryTransport {
        MemoryTransport { broker, conn }
    }
}

impl Transport for MemoryTransport {
    fn open_channel(&mut self) -> R<Channel> {
        let conn = self.conn;
        let chan = self.broker.with(|st| {
            let c = st.conns.get_mut(&conn).ok_or_else(closed)?;
            let id = c.next_channel;
            c.next_channel = c
                .next_channel
                .checked_add(1)
                .ok_or_else(|| AmqpError::Other {
                    message: "no more channel ids are available".into(),
                })?;
            c.channels.insert(id, Chan::default());
            Ok(id)
        })?;
        Ok(Channel::new(Box::new(MemoryChannel {
            broker: self.broker.clone(),
            conn,
            chan,
        })))
    }

    fn close(self: Box<Self>) -> R<()> {
        let conn = self.conn;
        self.broker.with(|st| {
            if !st.conns.contains_key(&conn) {
                return Err(closed());
            }
            st.close_connection(conn, End::ConnectionClosed);
            Ok(())
        })
    }

    /// Everything but streams, which the in-process broker refuses.
    fn capabilities(&self) -> crate::transport::Capabilities {
        crate::transport::Capabilities {
            streams: false,
            ..crate::transport::Capabilities::ALL
        }
    }

    /// The RabbitMQ version the broker follows: its major's tested release (4.0.5 or 3.10.8).
    fn broker_version(&self) -> Option<String> {
        Some(match self.broker.major() {
            3 => "3.10.8".to_string(),
            _ => "4.0.5".to_string(),
        })
    }
}

impl Drop for MemoryTransport {
    fn drop(&mut self) {
        let conn = self.conn;
        self.broker
            .with(|st| st.close_connection(conn, End::ConnectionClosed));
    }
}

struct MemoryChannel {
    broker: Arc<Broker>,
    conn: u64,
    chan: u16,
}

impl MemoryChannel {
    /// A channel method under the lock: a refusal closes the channel.
    fn method<T>(&self, f: impl FnOnce(&mut State, u64, u16) -> super::reply::Refused<T>) -> R<T> {
        let (conn, chan) = (self.conn, self.chan);
        self.broker
            .with(|st| st.method(conn, chan, |st| f(st, conn, chan)))
    }

    /// Sets something on this channel's own state, under the broker's lock; on a closed channel
    /// the error any call gets there.
    fn on_chan<T>(&self, f: impl FnOnce(&mut super::state::Chan) -> T) -> R<T> {
        let (conn, chan) = (self.conn, self.chan);
        self.broker.with(|st| st.chan(conn, chan).map(f))
    }

    /// ack / nack / reject: no answer in AMQP, so a refusal (an unknown tag) closes the
    /// channel after the call returned, as on RabbitMQ; the next call fails with it.
    fn settle(&self, delivery: Delivery, multiple: bool, requeue: Option<bool>) -> R<()> {
        self.settle_tag(delivery.delivery_tag(), multiple, requeue)
    }

    fn settle_tag(&self, tag: u64, multiple: bool, requeue: Option<bool>) -> R<()> {
        let (conn, chan) = (self.conn, self.chan);
        self.broker.with(|st| {
            st.check(conn, chan)?;
            if let Err(r) = st.settle_tags(conn, chan, tag, multiple, requeue) {
                st.close_channel(conn, chan, End::Server(r));
            }
            Ok(())
        })
    }
}

impl ChannelApi for MemoryChannel {
    fn qos(&self, prefetch_size: u32, prefetch_count: u16, global: bool) -> R<()> {
        if prefetch_size != 0 {
            // A connection error on RabbitMQ, with its own text.
            let r = super::reply::refusal(
                540,
                format!("NOT_IMPLEMENTED - prefetch_size!=0 ({prefetch_size})"),
            );
            let (conn, chan) = (self.conn, self.chan);
            return self.broker.with(|st| {
                st.check(conn, chan)?;
                st.close_connection(conn, End::ServerConnection(r));
                Err(st.chan(conn, chan).map(drop).unwrap_err())
            });
        }
        if global {
            return self.method(|_, _, _| Err(not_emulated("basic.qos with global=true")));
        }
        self.on_chan(|c| c.prefetch = prefetch_count)
    }
    fn basic_publish(&self, exchange: &str, publish: Publish<'_>) -> R<()> {
        let (conn, chan) = (self.conn, self.chan);
        self.broker
            .with(|st| st.publish(conn, chan, exchange, publish))
    }
    /// Answers at once, unless a memory alarm holds publishes of this connection: RabbitMQ has
    /// then stopped reading the connection's socket, so nothing sent after them is answered
    /// until the alarm ends (or the connection does).
    fn round_trip(&self) -> R<()> {
        let (conn, chan) = (self.conn, self.chan);
        let mut st = self.broker.state.lock();
        loop {
            st.check(conn, chan)?;
            if st.conns.get(&conn).is_none_or(|c| c.held.is_empty()) {
                return Ok(());
            }
            self.broker.changed.wait(&mut st);
        }
    }
    fn enable_publisher_confirms(&self) -> R<()> {
        self.on_chan(|c| c.confirms = true)
    }
    fn listen_for_publisher_confirms(&self) -> R<Feed<Confirm>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.on_chan(|c| c.confirm_tx = Some(tx))?;
        Ok(Feed::new(rx))
    }
    fn listen_for_returns(&self) -> R<Feed<Return>> {
        let (tx, rx) = crossbeam_channel::unbounded();
        self.on_chan(|c| c.return_tx = Some(tx))?;
        Ok(Feed::new(rx))
    }
    fn queue_declare(&self, queue: &str, options: QueueDeclareOptions) -> R<QueueState> {
        self.method(|st, conn, _| st.queue_declare(conn, queue, &options))
    }
    fn queue_declare_passive(&self, queue: &str) -> R<QueueState> {
        self.method(|st, conn, _| st.queue_passive(conn, queue))
    }
    fn queue_bind(&self, queue: &str, exchange: &str, key: &str, arguments: FieldTable) -> R<()> {
        self.method(|st, conn, _| st.queue_bind(conn, queue, exchange, key, arguments))
    }
    fn queue_unbind(&self, queue: &str, exchange: &str, key: &str, arguments: FieldTable) -> R<()> {
        self.method(|st, conn, _| st.queue_unbind(conn, queue, exchange, key, &arguments))
    }
    fn queue_purge(&self, queue: &str) -> R<u32> {
        self.method(|st, conn, _| st.queue_purge(conn, queue))
    }
    fn queue_delete(&self, queue: &str, options: QueueDeleteOptions) -> R<u32> {
        self.method(|st, conn, _| st.queue_delete(conn, queue, &options))
    }
    fn exchange_declare(
        &self,
        kind: ExchangeType,
        exchange: &str,
        options: ExchangeDeclareOptions,
    ) -> R<()> {
        self.method(|st, _, _| st.exchange_declare(&kind, exchange, &options))
    }
    fn exchange_declare_passive(&self, exchange: &str) -> R<()> {
        self.method(|st, _, _| st.exchange_passive(exchange))
    }
    fn exchange_delete(&self, exchange: &str, if_unused: bool) -> R<()> {
        self.method(|st, _, _| st.exchange_delete(exchange, if_unused))
    }
    fn basic_consume<'a>(&'a self, queue: &str, options: ConsumerOptions) -> R<Consumer<'a>> {
        let (tag, rx) = self.method(|st, conn, chan| st.consume(conn, chan, queue, &options))?;
        let api = MemoryConsumer {
            broker: self.broker.clone(),
            conn: self.conn,
            chan: self.chan,
            tag,
        };
        Ok(Consumer::new(Box::new(api), Deliveries::new(rx)))
    }
    fn basic_get(&self, queue: &str, no_ack: bool) -> R<Option<Get>> {
        self.method(|st, conn, chan| st.get(conn, chan, queue, no_ack))
    }
    fn ack(&self, delivery: Delivery, multiple: bool) -> R<()> {
        self.settle(delivery, multiple, None)
    }
    fn nack(&self, delivery: Delivery, multiple: bool, requeue: bool) -> R<()> {
        self.settle(delivery, multiple, Some(requeue))
    }
    fn nack_all(&self, requeue: bool) -> R<()> {
        self.settle_tag(0, true, Some(requeue))
    }
    fn close(self: Box<Self>) -> R<()> {
        let (conn, chan) = (self.conn, self.chan);
        self.broker.with(|st| {
            st.check(conn, chan)?;
            st.close_channel(conn, chan, End::Client);
            Ok(())
        })
    }
}

impl Drop for MemoryChannel {
    fn drop(&mut self) {
        let (conn, chan) = (self.conn, self.chan);
        self.broker
            .with(|st| st.close_channel(conn, chan, End::Client));
    }
}

struct MemoryConsumer {
    broker: Arc<Broker>,
    conn: u64,
    chan: u16,
    tag: String,
}

impl ConsumerApi for MemoryConsumer {
    fn cancel(&self) -> R<()> {
        let (conn, chan) = (self.conn, self.chan);
        self.broker.with(|st| {
            st.check(conn, chan)?;
            st.remove_consumer(
                conn,
                chan,
                &self.tag,
                Some(ConsumerMessage::ClientCancelled),
            );
            Ok(())
        })
    }
}

impl Drop for MemoryConsumer {
    fn drop(&mut self) {
        let (conn, chan) = (self.conn, self.chan);
        self.broker.with(|st| {
            st.remove_consumer(
                conn,
                chan,
                &self.tag,
                Some(ConsumerMessage::ClientCancelled),
            )
        });
    }
}
