//! The acknowledged consumer over RabbitMQ: a [`Source`] over one of our queues and an
//! [`Acknowledge`] that acknowledges each delivery's own tag.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> acemq_amqp::Result<()> {
//! use acemq_amqp::patterns::acknowledged::{
//!     consume, AmqpQueue, AmqpQueueOptions, Batcher, BatcherOptions, CounterStore,
//!     CounterStoreOptions,
//! };
//! use acemq_amqp::Connection;
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let store = CounterStore::new("counters.db", CounterStoreOptions::new())?;
//! store.create_tables()?;
//! let queue = AmqpQueue::open(&connection, "page-views", AmqpQueueOptions::new().prefetch(65))?;
//! let batcher = Batcher::new(BatcherOptions::new().batch_size(32).max_pending(64))?;
//! let report = consume(queue.source()?, &store, queue.acknowledger(), &batcher)?;
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
//!   [`AmqpQueueOptions::identifier`] sets another scope.
//! * Token: the delivery itself (its tag, on this queue's channel). A redelivery has a new tag.
//! * A committed batch is acknowledged with one `basic.ack` `multiple` when every unsettled
//!   delivery at or below its highest tag on the channel belongs to it; otherwise each delivery
//!   on its own, so a `multiple` never covers a delivery whose effect was not committed.
//! * A rolled-back batch's deliveries are **requeued after a backoff** (below): held
//!   unacknowledged for a while, then given back one by one with `basic.nack` (`requeue`, not
//!   `multiple`), so the broker redelivers them and they are applied then, or found done.
//! * A delivery **rejected** ([`Acknowledge::rejected`]: it failed through its own fault)
//!   [`AmqpQueueOptions::dead_letter_after`] times is **dead-lettered**: a confirmed copy to
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

mod options;
mod settle;
mod source;
mod state;

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};

use crate::transport::ConsumerOptions as AmqpConsumerOptions;

pub use options::AmqpQueueOptions;
pub use settle::AmqpAcknowledge;
pub use source::AmqpSource;
pub use state::AmqpToken;

use crate::connection::Connection;
use crate::envelope::check_name;
use crate::error::{Error, Result};
use state::{QueueState, Requeues};

/// One of our queues, on a channel of its own with a prefetch, for the acknowledged consumer.
///
/// Delivery tags and what a `multiple` acknowledgement covers belong to the channel, so the
/// queue, not an acknowledger, keeps the deliveries its sources handed out and nobody has
/// settled yet, across runs: every acknowledger of the queue sends a `multiple` only when all
/// of them up to its tag are its batch's. A rolled-back delivery is requeued after a backoff
/// ([`AmqpQueueOptions::requeue_backoff_first`]), so failed batches never fill the prefetch for
/// good. One [`source`](Self::source) is open at a time, and closing it requeues whatever its
/// run left unacknowledged (rolled back, prefetched but not taken), so a later run can never
/// acknowledge it without its effect. `Send`, not `Sync`: its
/// sources and acknowledgers borrow it on one thread.
pub struct AmqpQueue {
    state: QueueState,
}

impl std::fmt::Debug for AmqpQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.state;
        f.debug_struct("AmqpQueue")
            .field("queue", &s.queue)
            .field("unsettled", &s.unsettled.borrow().len())
            .field("source_open", &s.source_open.get())
            .field("held", &s.requeues.borrow().held.len())
            .field("dead_lettered", &s.dead_lettered.get())
            .finish()
    }
}

impl AmqpQueue {
    /// Opens a channel on `connection` with the options' prefetch for consuming `queue`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`]; [`Error::InvalidArgument`] for an invalid option (a zero
    /// prefetch or `dead_letter_after`, a requeue backoff out of bounds), before anything is
    /// asked of the broker; [`Error::NotFound`] when the queue does not exist,
    /// [`Error::ConnectionLost`].
    pub fn open(
        connection: &Connection,
        queue: &str,
        options: AmqpQueueOptions,
    ) -> Result<AmqpQueue> {
        check_name("queue", queue, false)?;
        options.validate()?;
        connection.queue_info(queue)?;
        let (channel, _link) = connection.open_channel()?;
        channel
            .qos(0, options.prefetch, false)
            .map_err(|e| Error::amqp(format!("setting prefetch on {queue:?}"), e))?;
        Ok(AmqpQueue {
            state: QueueState {
                channel,
                connection: connection.clone(),
                queue: queue.to_string(),
                identifier: options.identifier,
                unsettled: RefCell::new(BTreeSet::new()),
                source_open: Cell::new(false),
                requeues: RefCell::new(Requeues {
                    first: options.requeue_first,
                    max: options.requeue_max,
                    held: Vec::new(),
                    failures: HashMap::new(),
                    failed_batches: 0,
                }),
                dead_letter_after: options.dead_letter_after,
                dead_letters: RefCell::new(None),
                dead_lettered: Cell::new(0),
            },
        })
    }

    /// Deliveries of this queue dead-lettered so far (see
    /// [`AmqpQueueOptions::dead_letter_after`]).
    pub fn dead_lettered(&self) -> u64 {
        self.state.dead_lettered.get()
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
        let state = &self.state;
        if state.source_open.get() {
            return Err(Error::invalid(format!(
                "a source of {:?} is already open on this channel; close it before taking \
                 another",
                state.queue
            )));
        }
        let consumer = state
            .channel
            .basic_consume(state.queue.clone(), AmqpConsumerOptions::default())
            .map_err(|e| Error::amqp(format!("consuming from {:?}", state.queue), e))?;
        state.source_open.set(true);
        Ok(AmqpSource::new(state, consumer))
    }

    /// The acknowledgements, on this queue's channel. Any number may exist; they share the
    /// queue's record of unsettled deliveries.
    pub fn acknowledger(&self) -> AmqpAcknowledge<'_> {
        AmqpAcknowledge::new(&self.state)
    }

    /// Closes the channel; unacknowledged deliveries go back to the queue.
    ///
    /// # Errors
    ///
    /// The channel's close error.
    pub fn close(self) -> Result<()> {
        let state = self.state;
        if let Some(p) = state.dead_letters.borrow_mut().take() {
            if let Err(e) = p.close() {
                log::warn!(
                    "acemq: closing the dead-letter publisher of {:?}: {e}",
                    state.queue
                );
            }
        }
        state
            .channel
            .close()
            .map_err(|e| Error::amqp(format!("closing the channel of {:?}", state.queue), e))
    }
}
