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
//! * A committed batch is acknowledged with one `basic.ack` `multiple` when every unsettled
//!   delivery at or below its highest tag on the channel belongs to it; otherwise each delivery
//!   on its own, so a `multiple` never covers a delivery whose effect was not committed.
//! * A rolled-back batch's deliveries stay unacknowledged while the run goes on (as the recipe
//!   says; requeueing them at once would spin a message that always fails). They go back to the
//!   queue when the run's source closes (below).
//! * The source does not recover a dropped connection: it reports it as an error, the recipe
//!   stops (draining and closing), and the caller starts again — the receipts make that safe.
//!
//! Prefetch bounds what the broker sends ahead; set it at least to `max_pending + 1` so that
//! the batcher is never starved. Rolled-back deliveries count against it until the run ends.
//!
//! # Runs: what is unsettled belongs to the queue
//!
//! Delivery tags, and so what a `basic.ack` `multiple` covers, belong to the channel, and the
//! channel belongs to the [`AmqpQueue`]; [`AmqpQueue::source`] and [`AmqpQueue::acknowledger`]
//! are views borrowed from it, and one queue may serve one run after another. So the queue,
//! not the acknowledger, keeps the set of *unsettled* deliveries: those its sources handed out
//! and nobody has acknowledged or given back. Every run's acknowledger consults that one set
//! before it sends a `multiple`, and a run's end gives back what it leaves:
//!
//! * At most one source is open on a queue at a time ([`AmqpQueue::source`] refuses a second):
//!   with two consumers on one channel, a `multiple` could cover a delivery of the other one
//!   that has not even been taken yet.
//! * Closing the source (which [`consume`](super::consume) always does, and which `Drop` does
//!   too) cancels the consumer, waits for the deliveries already on their way, and then
//!   requeues every delivery still unsettled on the channel with one `basic.nack` (`requeue`,
//!   `multiple`, delivery tag 0): rolled-back batches, deliveries prefetched but not taken,
//!   and those the recipe dropped without applying after a failed acknowledgement. The broker
//!   redelivers them to the next run (or to any other consumer of the queue), where they are
//!   applied, or found done and acknowledged as replays.
//!
//! The alternative, a single-use source that owns the channel and closes it at the end of a
//! run, would give the same guarantee at the price of a new channel per run and an API that
//! no longer lets the source and the acknowledger borrow one queue; and the floor would still
//! have to be kept per channel, not per acknowledger.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::time::Duration;

use amiquip::{Channel, ConsumerMessage, ConsumerOptions as AmqpConsumerOptions};
use sha2::{Digest, Sha256};

use super::{Acknowledge, Delivery, Message, Polled, Source};
use crate::connection::Connection;
use crate::envelope::check_name;
use crate::error::{Error, Result};

type IdentifierFn = Box<dyn Fn(&str, &crate::Message) -> String + Send + Sync>;

/// One of our queues, on a channel of its own with a prefetch, for the acknowledged consumer.
///
/// Delivery tags and what a `multiple` acknowledgement covers belong to the channel, so the
/// queue, not an acknowledger, keeps the deliveries its sources handed out and nobody has
/// settled yet, across runs: every acknowledger of the queue sends a `multiple` only when all
/// of them up to its tag are its batch's. One [`source`](Self::source) is open at a time, and
/// closing it requeues whatever its run left unacknowledged (rolled back, prefetched but not
/// taken), so a later run can never acknowledge it without its effect. `Send`, not `Sync`: its
/// sources and acknowledgers borrow it on one thread.
pub struct AmqpQueue {
    channel: Channel,
    queue: String,
    identifier: Option<IdentifierFn>,
    /// Tags handed out by a source of this queue and neither acknowledged nor given back.
    unsettled: RefCell<BTreeSet<u64>>,
    /// Whether a source is open (consuming) on the channel.
    source_open: Cell<bool>,
}

impl std::fmt::Debug for AmqpQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpQueue")
            .field("queue", &self.queue)
            .field("unsettled", &self.unsettled.borrow().len())
            .field("source_open", &self.source_open.get())
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
            unsettled: RefCell::new(BTreeSet::new()),
            source_open: Cell::new(false),
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

    /// Subscribes and returns the source of deliveries for one run.
    ///
    /// Closing the source (or dropping it) requeues every delivery of the run that was not
    /// acknowledged; then the queue can give another source for the next run.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] while another source of this queue is open;
    /// [`Error::NotFound`] when the queue is gone; other AMQP errors.
    pub fn source(&self) -> Result<AmqpSource<'_>> {
        if self.source_open.get() {
            return Err(Error::invalid(format!(
                "a source of {:?} is already open on this channel; close it before taking \
                 another",
                self.queue
            )));
        }
        let consumer = self
            .channel
            .basic_consume(self.queue.clone(), AmqpConsumerOptions::default())
            .map_err(|e| Error::amqp(format!("consuming from {:?}", self.queue), e))?;
        self.source_open.set(true);
        Ok(AmqpSource {
            queue: self,
            consumer: Some(consumer),
        })
    }

    /// The acknowledgements, on this queue's channel. Any number may exist; they share the
    /// queue's record of unsettled deliveries.
    pub fn acknowledger(&self) -> AmqpAcknowledge<'_> {
        AmqpAcknowledge { queue: self }
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
                self.queue.unsettled.borrow_mut().insert(d.delivery_tag());
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
        let Some(consumer) = self.consumer.take() else {
            return Ok(());
        };
        // After the cancel, wait for the deliveries already on their way: none may arrive
        // after the requeue below, or it would stay unsettled on the channel.
        let mut drained = 0_u64;
        crate::consume::owner::cancel_and_drain(&self.queue.queue, &consumer, |_| drained += 1);
        drop(consumer);
        let queue = self.queue;
        let left = std::mem::take(&mut *queue.unsettled.borrow_mut()).len();
        queue.source_open.set(false);
        if left == 0 && drained == 0 {
            return Ok(());
        }
        // The run is over: whatever it did not acknowledge (rolled back, prefetched but not
        // taken, dropped after a failed acknowledgement) is the broker's again, so that no
        // `multiple` of a later run can cover it.
        log::debug!(
            "acemq: requeueing {left} unacknowledged and {drained} untaken deliveries of {:?}",
            queue.queue
        );
        queue.channel.nack_all(true).map_err(|e| {
            Error::amqp(
                format!(
                    "requeueing the unacknowledged deliveries of {:?}",
                    queue.queue
                ),
                e,
            )
        })
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
    /// The queue: its channel, and its record of unsettled deliveries (shared by every run).
    queue: &'a AmqpQueue,
}

impl std::fmt::Debug for AmqpAcknowledge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpAcknowledge")
            .field("queue", &self.queue.queue)
            .field("unsettled", &self.queue.unsettled.borrow().len())
            .finish()
    }
}

impl AmqpAcknowledge<'_> {
    fn ack(&self, d: &Delivery<AmqpToken>, multiple: bool) -> Result<()> {
        let delivery = d.acknowledgement_token.delivery.clone();
        let r = if multiple {
            delivery.ack_multiple(&self.queue.channel)
        } else {
            delivery.ack(&self.queue.channel)
        };
        r.map_err(|e| Error::amqp("acknowledging a delivery", e))
    }

    fn settled(&self, d: &Delivery<AmqpToken>) {
        let tag = d.acknowledgement_token.delivery_tag();
        self.queue.unsettled.borrow_mut().remove(&tag);
    }
}

impl Acknowledge<AmqpToken> for AmqpAcknowledge<'_> {
    fn acknowledge(&mut self, delivery: &Delivery<AmqpToken>) -> Result<()> {
        self.ack(delivery, false)?;
        self.settled(delivery);
        Ok(())
    }

    fn acknowledge_batch(&mut self, deliveries: &[Delivery<AmqpToken>]) -> Result<()> {
        let tags: BTreeSet<u64> = deliveries
            .iter()
            .map(|d| d.acknowledgement_token.delivery_tag())
            .collect();
        let Some(&highest) = tags.last() else {
            return Ok(());
        };
        // A `multiple` up to `highest` covers every unsettled delivery below it on the
        // channel, from this run or an earlier one: only when all of them are this batch's.
        let covers_only_this_batch = self
            .queue
            .unsettled
            .borrow()
            .range(..=highest)
            .all(|t| tags.contains(t));
        match deliveries
            .iter()
            .find(|d| d.acknowledgement_token.delivery_tag() == highest)
        {
            Some(top) if covers_only_this_batch => {
                self.ack(top, true)?;
                deliveries.iter().for_each(|d| self.settled(d));
                Ok(())
            }
            _ => deliveries.iter().try_for_each(|d| self.acknowledge(d)),
        }
    }

    fn failed(&mut self, deliveries: &[Delivery<AmqpToken>], error: &Error) -> Result<()> {
        // They stay unsettled on the queue, so no `multiple` reaches them, until the run's
        // source closes and requeues them.
        log::warn!(
            "acemq: a batch of {} deliveries was rolled back ({error}); they stay \
             unacknowledged until the source closes and requeues them",
            deliveries.len()
        );
        Ok(())
    }
}
