//! Receiving: the [`Source`] of one run over an [`AmqpQueue`](super::AmqpQueue), which also
//! requeues the rolled-back deliveries whose backoff is over, and gives back what its run left
//! when it closes.

use std::time::{Duration, Instant};

use crate::consume::replace_counted;
use crate::transport::ConsumerMessage;

use super::state::{AmqpToken, QueueState};
use crate::error::{Error, Result};
use crate::patterns::acknowledged::delivery::Delivery;
use crate::patterns::acknowledged::source::{Polled, Source};
use crate::patterns::acknowledged::store_apply::Message;

/// Deliveries from an [`AmqpQueue`](super::AmqpQueue).
pub struct AmqpSource<'a> {
    queue: &'a QueueState,
    consumer: Option<crate::transport::Consumer<'a>>,
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
        if let Some(held) = self.queue.requeues.borrow_mut().take_due(now) {
            // A rolled-back delivery whose backoff is over: handed out again from here, still
            // unacknowledged on the channel (never requeued: see `Held`).
            return Ok(Polled::Item(held.delivery));
        }
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
                let mut received = d.take_message();
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
        // What the broker counted a return of before goes back as a fresh copy, not counted
        // again (RabbitMQ 4.x drops a quorum queue's message past its delivery limit); the rest
        // with the one nack below.
        let mut counted = Vec::new();
        crate::consume::cancel_and_drain(&self.queue.queue, &consumer, |mut d| {
            drained += 1;
            let message = d.take_message();
            if message.returns_counted() > 0 {
                counted.push((d, message));
            }
        });
        drop(consumer);
        let queue = self.queue;
        // The held deliveries are unsettled too: the requeue below gives them back.
        let held = std::mem::take(&mut queue.requeues.borrow_mut().held);
        for held in held {
            let token = held.delivery.acknowledgement_token;
            if token.received.returns_counted() > 0 {
                let mut message = *token.received;
                message.body = held.delivery.message.payload;
                counted.push((token.delivery, message));
            }
        }
        if let Err(e) = replace_counted(&queue.connection, &queue.channel, &queue.queue, counted) {
            log::warn!("acemq: closing the source of {:?}: {e}", queue.queue);
        }
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

impl<'a> AmqpSource<'a> {
    /// The source of one run, consuming with `consumer` on the queue's channel.
    pub(super) fn new(
        queue: &'a QueueState,
        consumer: crate::transport::Consumer<'a>,
    ) -> AmqpSource<'a> {
        AmqpSource {
            queue,
            consumer: Some(consumer),
        }
    }

    /// Requeues, each with its own `basic.nack`, the held deliveries due by `now`.
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
