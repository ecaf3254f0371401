//! The acknowledged consumer over RabbitMQ: a [`Source`] over one of our queues and an
//! [`Acknowledge`] that acknowledges each delivery's own tag.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> acemq_amqp::Result<()> {
//! use acemq_amqp::patterns::acknowledged::{
//!     consume, AmqpQueue, ConsumeOptions, CounterStore, CounterStoreOptions,
//! };
//! use acemq_amqp::Connection;
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let store = CounterStore::new("counters.db", CounterStoreOptions::new())?;
//! store.create_tables()?;
//! let queue = AmqpQueue::open(&connection, "page-views", 64)?;
//! let options = ConsumeOptions::new().batch_size(32).max_pending(64);
//! let report = consume(queue.source()?, &store, queue.acknowledger(), options)?;
//! println!("{report:?}");
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```
//!
//! # How it maps
//!
//! * Identity: `{queue}/{message id}`: the `x-acemq-id`, else the AMQP `message_id`, else the
//!   id the crate derives from the delivery (see [`Envelope::id`](crate::Envelope::id)) — the
//!   same on every redelivery.
//!   [`AmqpQueue::identifier`] sets another scope.
//! * Token: the delivery itself (its tag, on this queue's channel). A redelivery has a new tag.
//! * A committed batch is acknowledged with one `basic.ack` `multiple` when every unsettled
//!   delivery at or below its highest tag on the channel belongs to it; otherwise each delivery
//!   on its own, so a `multiple` never covers a delivery whose effect was not committed.
//! * A rolled-back batch's deliveries are **requeued after a backoff** (below): held
//!   unacknowledged for a while, then given back one by one with `basic.nack` (`requeue`, not
//!   `multiple`), so the broker redelivers them and they are applied then, or found done.
//! * A delivery **rejected** ([`Acknowledge::rejected`]: it failed through its own fault)
//!   [`AmqpQueue::dead_letter_after`] times is **dead-lettered**: a confirmed copy to
//!   `{queue}.dlq` with `x-acemq-error`, then the ack (see the public module docs).
//! * The source does not recover a dropped connection: it reports it as an error, the recipe
//!   stops (draining and closing), and the caller starts again — the receipts make that safe.
//!
//! Prefetch bounds what the broker sends ahead; set it at least to `max_pending + 1` so that
//! the batcher is never starved. Rolled-back deliveries count against it while they wait for
//! their requeue, never longer.
//!
//! # Rolled-back deliveries: requeued after a backoff
//!
//! Described in the public module docs (`acknowledged`, "Rolled-back deliveries over AMQP"):
//! [`AmqpAcknowledge`]'s [`failed`](Acknowledge::failed) holds each delivery of a rolled-back
//! batch for a backoff that grows with consecutive failures (of its identity, and of the
//! queue's batches), jittered between ½ and 1 of it; the source's `poll` requeues the due
//! ones, each with a `basic.nack` of its own tag, and never waits past the next one. Until
//! then they stay in the queue's unsettled set, so no `multiple` covers them.
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
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use amiquip::{Channel, ConsumerMessage, ConsumerOptions as AmqpConsumerOptions};

use super::{Acknowledge, Delivery, Message, Polled, Source};
use crate::connection::Connection;
use crate::envelope::check_name;
use crate::error::{Error, Result};

type IdentifierFn = Box<dyn Fn(&str, &crate::Message) -> String + Send + Sync>;

/// The first requeue backoff of a rolled-back delivery, by default.
const DEFAULT_REQUEUE_FIRST: Duration = Duration::from_millis(200);
/// The longest requeue backoff, by default.
const DEFAULT_REQUEUE_MAX: Duration = Duration::from_secs(30);
/// The longest requeue backoff accepted: a held delivery takes a prefetch slot meanwhile.
const LONGEST_REQUEUE_MAX: Duration = Duration::from_secs(3600);
/// The most message identities whose consecutive failures are remembered.
const MAX_TRACKED_FAILURES: usize = 4096;
/// Failures through a message's own fault after which it is dead-lettered, by default.
const DEFAULT_DEAD_LETTER_AFTER: u32 = 5;

/// A rolled-back delivery waiting for its requeue.
struct Held {
    due: Instant,
    delivery: amiquip::Delivery,
}

/// Consecutive failures of one message identity.
struct Failures {
    count: u32,
    /// Of those, failures through its own fault ([`Acknowledge::rejected`]).
    own: u32,
    last: Instant,
}

/// The rolled-back deliveries of a queue and what their backoff grows with.
struct Requeues {
    first: Duration,
    max: Duration,
    /// Held deliveries (at most the prefetch), each with its requeue time.
    held: Vec<Held>,
    /// Failures per identity since it was last committed (bounded by `MAX_TRACKED_FAILURES`).
    failures: HashMap<String, Failures>,
    /// Failed batches since the last committed one.
    failed_batches: u32,
}

impl Requeues {
    /// Counts a failure of `identifier` (`own`: through its own fault) and returns its
    /// consecutive failures, and how many of them were its own.
    fn count_failure(&mut self, identifier: &str, own: bool, now: Instant) -> (u32, u32) {
        if let Some(f) = self.failures.get_mut(identifier) {
            f.count = f.count.saturating_add(1);
            f.own = f.own.saturating_add(u32::from(own));
            f.last = now;
            return (f.count, f.own);
        }
        if self.failures.len() >= MAX_TRACKED_FAILURES {
            let oldest = self
                .failures
                .iter()
                .min_by_key(|(_, f)| f.last)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.failures.remove(&oldest);
            }
        }
        self.failures.insert(
            identifier.to_string(),
            Failures {
                count: 1,
                own: u32::from(own),
                last: now,
            },
        );
        (1, u32::from(own))
    }

    /// The backoff after `failures` consecutive failures: `first × 2^(failures-1)`, capped at
    /// `max`, times a random factor in [½, 1).
    fn backoff(&self, failures: u32) -> Duration {
        crate::connection::backoff(self.first, self.max, failures)
    }

    /// The deliveries due by `now`, taken out of the held ones.
    fn take_due(&mut self, now: Instant) -> Vec<Held> {
        let (due, waiting) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.due <= now);
        self.held = waiting;
        due
    }
}

/// One of our queues, on a channel of its own with a prefetch, for the acknowledged consumer.
///
/// Delivery tags and what a `multiple` acknowledgement covers belong to the channel, so the
/// queue, not an acknowledger, keeps the deliveries its sources handed out and nobody has
/// settled yet, across runs: every acknowledger of the queue sends a `multiple` only when all
/// of them up to its tag are its batch's. A rolled-back delivery is requeued after a backoff
/// ([`requeue_backoff`](Self::requeue_backoff)), so failed batches never fill the prefetch for
/// good. One [`source`](Self::source) is open at a time, and closing it requeues whatever its
/// run left unacknowledged (rolled back, prefetched but not taken), so a later run can never
/// acknowledge it without its effect. `Send`, not `Sync`: its
/// sources and acknowledgers borrow it on one thread.
pub struct AmqpQueue {
    channel: Channel,
    /// For the dead letters: their topology and their publisher.
    connection: Connection,
    queue: String,
    identifier: Option<IdentifierFn>,
    /// Tags handed out by a source of this queue and neither acknowledged nor given back.
    unsettled: RefCell<BTreeSet<u64>>,
    /// Whether a source is open (consuming) on the channel.
    source_open: Cell<bool>,
    /// Rolled-back deliveries waiting for their requeue, and the backoff's counts.
    requeues: RefCell<Requeues>,
    /// Own failures after which a delivery is dead-lettered.
    dead_letter_after: u32,
    /// The dead letters' confirmed publisher, made with the first dead letter (which declares
    /// the queue's failure topology first).
    dead_letters: RefCell<Option<crate::Publisher>>,
    /// Deliveries dead-lettered so far.
    dead_lettered: Cell<u64>,
}

impl std::fmt::Debug for AmqpQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpQueue")
            .field("queue", &self.queue)
            .field("unsettled", &self.unsettled.borrow().len())
            .field("source_open", &self.source_open.get())
            .field("held", &self.requeues.borrow().held.len())
            .field("dead_lettered", &self.dead_lettered.get())
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
            connection: connection.clone(),
            queue: queue.to_string(),
            identifier: None,
            unsettled: RefCell::new(BTreeSet::new()),
            source_open: Cell::new(false),
            requeues: RefCell::new(Requeues {
                first: DEFAULT_REQUEUE_FIRST,
                max: DEFAULT_REQUEUE_MAX,
                held: Vec::new(),
                failures: HashMap::new(),
                failed_batches: 0,
            }),
            dead_letter_after: DEFAULT_DEAD_LETTER_AFTER,
            dead_letters: RefCell::new(None),
            dead_lettered: Cell::new(0),
        })
    }

    /// Dead-letters a delivery once it has failed `attempts` times **through its own fault**
    /// ([`Acknowledge::rejected`]: the store refused it, or it failed alone while its batchmates
    /// committed): a copy goes to `{queue}.dlq` with `x-acemq-error: exhausted N attempts:
    /// <the error>`, confirmed, and then the delivery is acknowledged. The first dead letter
    /// declares the family's failure topology beside the queue (`acemq.dlx`, `{queue}.dlq`,
    /// `{queue}.parked`), as the family's consumers do. Failures that are nobody's fault in
    /// particular (a whole batch rolled back by a database outage) never count: those
    /// deliveries only back off. Defaults to 5.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0.
    pub fn dead_letter_after(mut self, attempts: u32) -> Result<Self> {
        if attempts == 0 {
            return Err(Error::invalid(
                "a delivery is dead-lettered after at least 1 attempt",
            ));
        }
        self.dead_letter_after = attempts;
        Ok(self)
    }

    /// Deliveries of this queue dead-lettered so far (see
    /// [`dead_letter_after`](Self::dead_letter_after)).
    pub fn dead_lettered(&self) -> u64 {
        self.dead_lettered.get()
    }

    /// The dead letters' publisher; the first call declares the failure topology.
    fn dead_letter_publisher(&self) -> Result<crate::Publisher> {
        if let Some(p) = self.dead_letters.borrow().as_ref() {
            return Ok(p.clone());
        }
        crate::consume::retry::declare_failure_topology(
            &self.connection,
            &self.queue,
            &crate::RetryPolicy::none(),
        )?;
        let p = self.connection.publisher()?;
        *self.dead_letters.borrow_mut() = Some(p.clone());
        Ok(p)
    }

    /// Sets how long a rolled-back delivery is held before it is requeued: `first` after one
    /// consecutive failure, doubling with each further one up to `max`, each wait multiplied
    /// by a random factor between ½ and 1 (see the [module docs](super)). Defaults to 200 ms
    /// and 30 s.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `first` is shorter than 1 ms, `max` shorter than `first`,
    /// or `max` longer than an hour (a held delivery takes a prefetch slot meanwhile).
    pub fn requeue_backoff(self, first: Duration, max: Duration) -> Result<Self> {
        if first < Duration::from_millis(1) {
            return Err(Error::invalid(
                "the first requeue backoff must be at least 1 ms",
            ));
        }
        if max > LONGEST_REQUEUE_MAX {
            return Err(Error::invalid(
                "the longest requeue backoff must be at most 1 h",
            ));
        }
        if max < first {
            return Err(Error::invalid(
                "the longest requeue backoff must not be shorter than the first",
            ));
        }
        {
            let mut requeues = self.requeues.borrow_mut();
            requeues.first = first;
            requeues.max = max;
        }
        Ok(self)
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
        if let Some(p) = self.dead_letters.borrow_mut().take() {
            if let Err(e) = p.close() {
                log::warn!(
                    "acemq: closing the dead-letter publisher of {:?}: {e}",
                    self.queue
                );
            }
        }
        self.channel
            .close()
            .map_err(|e| Error::amqp(format!("closing the channel of {:?}", self.queue), e))
    }

    fn identify(&self, m: &crate::Message) -> String {
        if let Some(f) = &self.identifier {
            return f(&self.queue, m);
        }
        format!("{}/{}", self.queue, m.envelope.id)
    }
}

/// The token of one delivery: the delivery on its channel, and the message as received (its
/// body is the [`Message`]'s payload), for a dead-letter copy.
#[derive(Debug, Clone)]
pub struct AmqpToken {
    delivery: amiquip::Delivery,
    received: Box<crate::Message>,
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
        // Requeue the rolled-back deliveries whose backoff is over, and wait no longer than
        // until the next one is due.
        let now = Instant::now();
        self.requeue_due(now)?;
        let next_due = self
            .queue
            .requeues
            .borrow()
            .held
            .iter()
            .map(|h| h.due)
            .min();
        let timeout = match next_due {
            Some(due) => timeout.min(due.saturating_duration_since(now)),
            None => timeout,
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
                let mut received = crate::Message::take_delivery(&mut d);
                let identifier = self.queue.identify(&received);
                let body = std::mem::take(&mut received.body);
                Ok(Polled::Item(Delivery::new(
                    Message::new(identifier, body),
                    AmqpToken {
                        delivery: d,
                        received: Box::new(received),
                    },
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
        // The held deliveries are unsettled too: the requeue below gives them back.
        queue.requeues.borrow_mut().held.clear();
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
    /// Requeues, each with its own `basic.nack`, the held deliveries due by `now`.
    fn requeue_due(&self, now: Instant) -> Result<()> {
        let queue = self.queue;
        let mut due = queue.requeues.borrow_mut().take_due(now).into_iter();
        while let Some(held) = due.next() {
            let tag = held.delivery.delivery_tag();
            if let Err(e) = held.delivery.nack(&queue.channel, true) {
                // Still unsettled: closing the source gives them back with the rest.
                queue.requeues.borrow_mut().held.extend(due);
                return Err(Error::amqp(
                    format!("requeueing a rolled-back delivery of {:?}", queue.queue),
                    e,
                ));
            }
            queue.unsettled.borrow_mut().remove(&tag);
        }
        Ok(())
    }

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
        // Committed: its failures, and the queue's run of failed batches, are over.
        let mut requeues = self.queue.requeues.borrow_mut();
        requeues.failed_batches = 0;
        if !requeues.failures.is_empty() {
            requeues.failures.remove(&d.message.identifier);
        }
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

    /// Holds the deliveries for a backoff that grows with consecutive failures; the source
    /// requeues each when its backoff is over (see the [module docs](super)). They stay
    /// unsettled until then, so no `multiple` acknowledgement covers them.
    fn failed(&mut self, deliveries: &[Delivery<AmqpToken>], error: &Error) -> Result<()> {
        {
            let mut requeues = self.queue.requeues.borrow_mut();
            requeues.failed_batches = requeues.failed_batches.saturating_add(1);
        }
        self.hold(deliveries, false, error);
        Ok(())
    }

    /// Counts a failure of the delivery's own; after [`AmqpQueue::dead_letter_after`] of them
    /// dead-letters it (a confirmed copy to `{queue}.dlq`, then the ack), else holds it like a
    /// rolled-back one. A dead letter that cannot be sent is logged and the delivery held: it
    /// is tried again after its next failure.
    fn rejected(&mut self, delivery: &Delivery<AmqpToken>, error: &Error) -> Result<()> {
        let own = self.hold(std::slice::from_ref(delivery), true, error);
        if own < self.queue.dead_letter_after {
            return Ok(());
        }
        let tag = delivery.acknowledgement_token.delivery_tag();
        let reason = {
            let plural = if own == 1 { "" } else { "s" };
            format!("exhausted {own} attempt{plural}: {error}")
        };
        match self.dead_letter(delivery, &reason) {
            Ok(()) => {
                // The copy is out: now the original goes. An ack that fails means the channel
                // is gone; the error stops the run, and the broker has the delivery again.
                self.ack(delivery, false)?;
                // No longer held: its copy is out and it is acknowledged.
                self.queue
                    .requeues
                    .borrow_mut()
                    .held
                    .retain(|h| h.delivery.delivery_tag() != tag);
                self.settled(delivery);
                let dead = self.queue.dead_lettered.get() + 1;
                self.queue.dead_lettered.set(dead);
                log::error!(
                    "acemq: message {:?} of {:?} dead-lettered to {:?}: {reason}",
                    delivery.message.identifier,
                    self.queue.queue,
                    crate::names::dead_letter_queue(&self.queue.queue)
                );
                Ok(())
            }
            Err(e) => {
                log::warn!(
                    "acemq: message {:?} of {:?} could not be dead-lettered ({e}); it is \
                     requeued after its backoff",
                    delivery.message.identifier,
                    self.queue.queue
                );
                Ok(())
            }
        }
    }
}

impl AmqpAcknowledge<'_> {
    /// Holds each unsettled delivery for its backoff and counts its failure (`own`: its own
    /// fault); returns the last one's count of own failures.
    fn hold(&self, deliveries: &[Delivery<AmqpToken>], own: bool, error: &Error) -> u32 {
        let now = Instant::now();
        let unsettled = self.queue.unsettled.borrow();
        let mut requeues = self.queue.requeues.borrow_mut();
        let mut longest = Duration::ZERO;
        let mut own_failures = 0;
        for d in deliveries {
            let delivery = &d.acknowledgement_token.delivery;
            // Already settled (given back when a source closed): nothing to hold.
            if !unsettled.contains(&delivery.delivery_tag()) {
                continue;
            }
            let (failures, own) = requeues.count_failure(&d.message.identifier, own, now);
            own_failures = own;
            let wait = requeues.backoff(failures.max(requeues.failed_batches));
            longest = longest.max(wait);
            requeues.held.push(Held {
                due: now + wait,
                delivery: delivery.clone(),
            });
        }
        log::warn!(
            "acemq: {} deliveries of {:?} were rolled back ({error}); they are requeued within \
             {longest:?}",
            deliveries.len(),
            self.queue.queue
        );
        own_failures
    }

    /// Sends the dead-letter copy of `delivery` (confirmed, mandatory); the caller then
    /// acknowledges it.
    fn dead_letter(&self, delivery: &Delivery<AmqpToken>, reason: &str) -> Result<()> {
        let queue = self.queue;
        let publisher = queue.dead_letter_publisher()?;
        let mut received = (*delivery.acknowledgement_token.received).clone();
        received.body.clone_from(&delivery.message.payload);
        let copy =
            crate::consume::worker::dead_letter_copy(&received, &queue.queue, reason.to_string());
        crate::consume::worker::publish_copy(
            &publisher,
            &crate::names::dead_letter_queue(&queue.queue),
            copy,
        )
    }
}
