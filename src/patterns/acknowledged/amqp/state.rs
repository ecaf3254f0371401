//! What an [`AmqpQueue`](super::AmqpQueue) keeps for its sources and acknowledgers: its
//! channel, its unsettled deliveries, the rolled-back ones waiting for their requeue, the dead
//! letters' publisher; and the token of one delivery.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::transport::Channel;

use super::options::IdentifierFn;
use crate::connection::Connection;
use crate::error::Result;

/// The most message identities whose consecutive failures are remembered.
const MAX_TRACKED_FAILURES: usize = 4096;

/// A rolled-back delivery waiting for its requeue.
pub(super) struct Held {
    pub(super) due: Instant,
    /// The delivery as the source handed it out (message and token), handed out again when due:
    /// held in the run, never requeued, since RabbitMQ 4.x counts every return to a quorum
    /// queue and drops a message past its delivery limit.
    pub(super) delivery: crate::patterns::acknowledged::delivery::Delivery<AmqpToken>,
}

/// Consecutive failures of one message identity.
pub(super) struct Failures {
    pub(super) count: u32,
    /// Of those, failures through its own fault ([`Acknowledge::rejected`]).
    pub(super) own: u32,
    pub(super) last: Instant,
}

/// The rolled-back deliveries of a queue and what their backoff grows with.
pub(super) struct Requeues {
    pub(super) first: Duration,
    pub(super) max: Duration,
    /// Held deliveries (at most the prefetch), each with its requeue time.
    pub(super) held: Vec<Held>,
    /// Failures per identity since it was last committed (bounded by `MAX_TRACKED_FAILURES`).
    pub(super) failures: HashMap<String, Failures>,
    /// Failed batches since the last committed one.
    pub(super) failed_batches: u32,
}

impl Requeues {
    /// Counts a failure of `identifier` (`own`: through its own fault) and returns its
    /// consecutive failures, and how many of them were its own.
    pub(super) fn count_failure(
        &mut self,
        identifier: &str,
        own: bool,
        now: Instant,
    ) -> (u32, u32) {
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
    pub(super) fn backoff(&self, failures: u32) -> Duration {
        crate::connection::backoff(self.first, self.max, failures)
    }

    /// The deliveries due by `now`, taken out of the held ones.
    /// The held delivery due first, if it is due at `now`.
    pub(super) fn take_due(&mut self, now: Instant) -> Option<Held> {
        let first = (0..self.held.len())
            .filter(|&i| self.held[i].due <= now)
            .min_by_key(|&i| self.held[i].due)?;
        Some(self.held.swap_remove(first))
    }
}

/// The state of one queue, shared by its sources and acknowledgers (on one thread).
pub(super) struct QueueState {
    pub(super) channel: Channel,
    /// For the dead letters: their topology and their publisher.
    pub(super) connection: Connection,
    pub(super) queue: String,
    pub(super) identifier: Option<IdentifierFn>,
    /// Tags handed out by a source of this queue and neither acknowledged nor given back.
    pub(super) unsettled: RefCell<BTreeSet<u64>>,
    /// Whether a source is open (consuming) on the channel.
    pub(super) source_open: Cell<bool>,
    /// Rolled-back deliveries waiting for their requeue, and the backoff's counts.
    pub(super) requeues: RefCell<Requeues>,
    /// Own failures after which a delivery is dead-lettered.
    pub(super) dead_letter_after: u32,
    /// The dead letters' confirmed publisher, made with the first dead letter (which declares
    /// the queue's failure topology first).
    pub(super) dead_letters: RefCell<Option<crate::Publisher>>,
    /// Deliveries dead-lettered so far.
    pub(super) dead_lettered: Cell<u64>,
}

impl QueueState {
    /// The dead letters' publisher; the first call declares the failure topology.
    pub(super) fn dead_letter_publisher(&self) -> Result<crate::Publisher> {
        if let Some(p) = self.dead_letters.borrow().as_ref() {
            return Ok(p.clone());
        }
        crate::consume::declare_failure_topology(
            &self.connection,
            &self.queue,
            &crate::RetryPolicy::none(),
        )?;
        let p = self.connection.publisher()?;
        *self.dead_letters.borrow_mut() = Some(p.clone());
        Ok(p)
    }

    pub(super) fn identify(&self, m: &crate::Message) -> String {
        if let Some(f) = &self.identifier {
            return f(&self.queue, m);
        }
        format!("{}/{}", self.queue, m.envelope.id)
    }
}

/// The token of one delivery: the delivery on its channel, and the message as received (its
/// body is the [`Message`](crate::patterns::acknowledged::Message)'s payload), for a dead-letter copy.
#[derive(Debug, Clone)]
pub struct AmqpToken {
    pub(super) delivery: crate::transport::Delivery,
    pub(super) received: Box<crate::Message>,
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
