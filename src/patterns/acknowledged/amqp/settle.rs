//! Settling: acknowledging committed deliveries (one `multiple` where it covers only them),
//! holding rolled-back ones for their backoff, and dead-lettering those that keep failing
//! through their own fault.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::state::{AmqpToken, Held, QueueState};
use crate::error::{Error, Result};
use crate::patterns::acknowledged::delivery::{Acknowledge, Delivery};

/// Acknowledges deliveries of an [`AmqpQueue`](super::AmqpQueue) on its channel.
pub struct AmqpAcknowledge<'a> {
    /// The queue: its channel, and its record of unsettled deliveries (shared by every run).
    queue: &'a QueueState,
}

impl std::fmt::Debug for AmqpAcknowledge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpAcknowledge")
            .field("queue", &self.queue.queue)
            .field("unsettled", &self.queue.unsettled.borrow().len())
            .finish()
    }
}

impl<'a> AmqpAcknowledge<'a> {
    /// The acknowledgements on `queue`'s channel.
    pub(super) fn new(queue: &'a QueueState) -> AmqpAcknowledge<'a> {
        AmqpAcknowledge { queue }
    }

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
    /// requeues each when its backoff is over (see the [module docs](super::super)). They stay
    /// unsettled until then, so no `multiple` acknowledgement covers them.
    fn failed(&mut self, deliveries: &[Delivery<AmqpToken>], error: &Error) -> Result<()> {
        {
            let mut requeues = self.queue.requeues.borrow_mut();
            requeues.failed_batches = requeues.failed_batches.saturating_add(1);
        }
        self.hold(deliveries, false, error);
        Ok(())
    }

    /// Counts a failure of the delivery's own; after [`AmqpQueueOptions::dead_letter_after`](super::AmqpQueueOptions::dead_letter_after) of them
    /// dead-letters it (a confirmed copy to `{queue}.dlq`, then the ack), else holds it like a
    /// rolled-back one. A dead letter that cannot be sent is logged and the delivery held: it
    /// is tried again after its next failure.
    fn rejected(&mut self, delivery: &Delivery<AmqpToken>, error: &Error) -> Result<()> {
        let own = self.hold(std::slice::from_ref(delivery), true, error);
        if own < self.queue.dead_letter_after {
            return Ok(());
        }
        let tag = delivery.acknowledgement_token.delivery_tag();
        let reason = crate::consume::exhausted(own, error);
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
                    .retain(|h| h.delivery.acknowledgement_token.delivery_tag() != tag);
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
                delivery: d.clone(),
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
        let copy = crate::consume::dead_letter_copy(&received, &queue.queue, reason.to_string());
        crate::consume::publish_copy(
            &publisher,
            &crate::names::dead_letter_queue(&queue.queue),
            copy,
        )
    }
}
