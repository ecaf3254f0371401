//! The acknowledged consumer over RabbitMQ: a [`Source`] over one of our queues and an
//! [`Acknowledge`] that acknowledges each delivery's own tag.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> acemq_amqp::Result<()> {
//! use acemq_amqp::patterns::acknowledged::{consume, AmqpQueue, CounterStore};
//! use acemq_amqp::Connection;
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let store = CounterStore::builder("counters.db").build()?;
//! store.create_tables()?;
//! let queue = AmqpQueue::open(&connection, "page-views", 64)?;
//! let report = consume(queue.source()?, &store, queue.acknowledger(), 32, 64)?;
//! println!("{report:?}");
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! # How it maps
//!
//! * Identity: `{queue}/{x-acemq-id}` (the AMQP `message_id` when the header is absent), the
//!   same on every redelivery; a message with neither gets `{queue}/sha256:{hex of the body}`.
//!   [`AmqpQueue::identifier`] sets another scope.
//! * Token: the delivery itself (its tag, on this queue's channel). A redelivery has a new tag.
//! * A committed batch is acknowledged with one `basic.ack` `multiple` when no delivery of a
//!   failed batch lies below it on the channel; otherwise each delivery on its own, so a
//!   `multiple` never covers a delivery that was rolled back.
//! * A rolled-back batch's deliveries stay unacknowledged (as the recipe says); they go back to
//!   the queue when the source closes its channel.
//! * The source does not recover a dropped connection: it reports it as an error, the recipe
//!   stops (draining and closing), and the caller starts again — the receipts make that safe.
//!
//! Prefetch bounds what the broker sends ahead; set it at least to `max_pending + 1` so that
//! the batcher is never starved.

use std::time::Duration;

use amiquip::{Channel, ConsumerMessage, ConsumerOptions as AmqpConsumerOptions};
use sha2::{Digest, Sha256};

use super::{Acknowledge, Delivery, Message, Polled, Source};
use crate::connection::Connection;
use crate::envelope::check_name;
use crate::error::{Error, Result};

type IdentifierFn = Box<dyn Fn(&str, &crate::Message) -> String + Send + Sync>;

/// One of our queues, on a channel of its own with a prefetch, for the acknowledged consumer.
pub struct AmqpQueue {
    channel: Channel,
    queue: String,
    identifier: Option<IdentifierFn>,
}

impl std::fmt::Debug for AmqpQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpQueue")
            .field("queue", &self.queue)
            .finish()
    }
}

impl AmqpQueue {
    /// Opens a channel on `connection` with `prefetch` (1 to 65535) for consuming `queue`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`], [`Error::InvalidArgument`] for a zero prefetch,
    /// [`Error::NotFound`] when the queue does not exist, [`Error::ConnectionLost`].
    pub fn open(connection: &Connection, queue: &str, prefetch: u16) -> Result<AmqpQueue> {
        check_name("queue", queue, false)?;
        if prefetch == 0 {
            return Err(Error::invalid("prefetch must be at least 1"));
        }
        connection.queue_info(queue)?;
        let (channel, _link) = connection.open_channel()?;
        channel
            .qos(0, prefetch, false)
            .map_err(|e| Error::amqp(format!("setting prefetch on {queue:?}"), e))?;
        Ok(AmqpQueue {
            channel,
            queue: queue.to_string(),
            identifier: None,
        })
    }

    /// Scopes identities another way: `f(queue, message)` must give the same string for every
    /// delivery of one message. Defaults to `{queue}/{x-acemq-id}`.
    pub fn identifier(
        mut self,
        f: impl Fn(&str, &crate::Message) -> String + Send + Sync + 'static,
    ) -> Self {
        self.identifier = Some(Box::new(f));
        self
    }

    /// Subscribes and returns the source of deliveries.
    ///
    /// # Errors
    ///
    /// [`Error::NotFound`] when the queue is gone; other AMQP errors.
    pub fn source(&self) -> Result<AmqpSource<'_>> {
        let consumer = self
            .channel
            .basic_consume(self.queue.clone(), AmqpConsumerOptions::default())
            .map_err(|e| Error::amqp(format!("consuming from {:?}", self.queue), e))?;
        Ok(AmqpSource {
            queue: self,
            consumer: Some(consumer),
        })
    }

    /// The acknowledgements, on this queue's channel.
    pub fn acknowledger(&self) -> AmqpAcknowledge<'_> {
        AmqpAcknowledge {
            channel: &self.channel,
            lowest_failed: None,
        }
    }

    /// Closes the channel; unacknowledged deliveries go back to the queue.
    ///
    /// # Errors
    ///
    /// The channel's close error.
    pub fn close(self) -> Result<()> {
        self.channel
            .close()
            .map_err(|e| Error::amqp(format!("closing the channel of {:?}", self.queue), e))
    }

    fn identify(&self, m: &crate::Message) -> String {
        if let Some(f) = &self.identifier {
            return f(&self.queue, m);
        }
        let id = Some(m.envelope.id.clone()).filter(|_| !m.id_assigned);
        match id {
            Some(id) => format!("{}/{id}", self.queue),
            None => {
                let hash = Sha256::digest(&m.body);
                let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
                format!("{}/sha256:{hex}", self.queue)
            }
        }
    }
}

/// The token of one delivery: the delivery on its channel.
#[derive(Debug, Clone)]
pub struct AmqpToken {
    delivery: amiquip::Delivery,
}

impl AmqpToken {
    /// The delivery tag (this attempt's; a redelivery has another).
    pub fn delivery_tag(&self) -> u64 {
        self.delivery.delivery_tag()
    }

    /// True when the broker delivered it before.
    pub fn redelivered(&self) -> bool {
        self.delivery.redelivered
    }
}

/// Deliveries from an [`AmqpQueue`].
pub struct AmqpSource<'a> {
    queue: &'a AmqpQueue,
    consumer: Option<amiquip::Consumer<'a>>,
}

impl std::fmt::Debug for AmqpSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSource")
            .field("queue", &self.queue.queue)
            .finish()
    }
}

impl Source for AmqpSource<'_> {
    type Item = Delivery<AmqpToken>;

    fn poll(&mut self, timeout: Duration) -> Result<Polled<Self::Item>> {
        let Some(consumer) = &self.consumer else {
            return Ok(Polled::End);
        };
        let msg = if timeout.is_zero() {
            match consumer.receiver().try_recv() {
                Ok(m) => m,
                Err(crossbeam_channel::TryRecvError::Empty) => return Ok(Polled::Idle),
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    return Err(self.lost("the connection dropped"))
                }
            }
        } else {
            match consumer.receiver().recv_timeout(timeout) {
                Ok(m) => m,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => return Ok(Polled::Idle),
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    return Err(self.lost("the connection dropped"))
                }
            }
        };
        match msg {
            ConsumerMessage::Delivery(mut d) => {
                let message = crate::Message::take_delivery(&mut d);
                let identifier = self.queue.identify(&message);
                Ok(Polled::Item(Delivery::new(
                    Message::new(identifier, message.body),
                    AmqpToken { delivery: d },
                )))
            }
            ConsumerMessage::ServerCancelled => Err(Error::Cancelled {
                queue: self.queue.queue.clone(),
            }),
            ConsumerMessage::ClientCancelled | ConsumerMessage::ClientClosedChannel => {
                Ok(Polled::End)
            }
            other => Err(self.lost(&format!("{other:?}"))),
        }
    }

    fn close(&mut self) -> Result<()> {
        if let Some(consumer) = self.consumer.take() {
            // Deliveries still on their way stay unacknowledged: they return to the queue when
            // the channel closes.
            crate::consume::owner::cancel_and_drain(&self.queue.queue, &consumer, drop);
        }
        Ok(())
    }
}

impl AmqpSource<'_> {
    fn lost(&self, why: &str) -> Error {
        Error::ConnectionLost {
            context: format!("consuming from {:?} ({why})", self.queue.queue),
        }
    }
}

impl Drop for AmqpSource<'_> {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Acknowledges deliveries of an [`AmqpQueue`] on its channel.
pub struct AmqpAcknowledge<'a> {
    channel: &'a Channel,
    /// The lowest tag of a rolled-back delivery left unacknowledged: no `multiple` reaches it.
    lowest_failed: Option<u64>,
}

impl std::fmt::Debug for AmqpAcknowledge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpAcknowledge")
            .field("lowest_failed", &self.lowest_failed)
            .finish()
    }
}

impl AmqpAcknowledge<'_> {
    fn ack(&self, d: &Delivery<AmqpToken>, multiple: bool) -> Result<()> {
        let delivery = d.acknowledgement_token.delivery.clone();
        let r = if multiple {
            delivery.ack_multiple(self.channel)
        } else {
            delivery.ack(self.channel)
        };
        r.map_err(|e| Error::amqp("acknowledging a delivery", e))
    }
}

impl Acknowledge<AmqpToken> for AmqpAcknowledge<'_> {
    fn acknowledge(&mut self, delivery: &Delivery<AmqpToken>) -> Result<()> {
        self.ack(delivery, false)
    }

    fn acknowledge_batch(&mut self, deliveries: &[Delivery<AmqpToken>]) -> Result<()> {
        let Some(last) = deliveries.last() else {
            return Ok(());
        };
        // Batches are acknowledged in the order their deliveries were taken, so everything
        // below this batch on the channel is settled, except rolled-back deliveries.
        if self.lowest_failed.is_none() {
            return self.ack(last, true);
        }
        deliveries.iter().try_for_each(|d| self.ack(d, false))
    }

    fn failed(&mut self, deliveries: &[Delivery<AmqpToken>], error: &Error) -> Result<()> {
        if let Some(lowest) = deliveries
            .iter()
            .map(|d| d.acknowledgement_token.delivery_tag())
            .min()
        {
            self.lowest_failed = Some(self.lowest_failed.map_or(lowest, |l| l.min(lowest)));
        }
        log::warn!(
            "acemq: a batch of {} deliveries was rolled back ({error}); they stay \
             unacknowledged until the channel closes",
            deliveries.len()
        );
        Ok(())
    }
}
