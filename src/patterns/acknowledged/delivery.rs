//! One delivery attempt of a message, and what acknowledges it with the broker.

use super::Message;
use crate::error::{Error, Result};

/// One delivery attempt of a [`Message`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Delivery<T> {
    /// The message.
    pub message: Message,
    /// What acknowledges this attempt (an AMQP delivery tag, an offset, …). May change on
    /// redelivery.
    pub acknowledgement_token: T,
}

impl<T> Delivery<T> {
    /// A delivery of `message` acknowledged by `acknowledgement_token`.
    pub fn new(message: Message, acknowledgement_token: T) -> Delivery<T> {
        Delivery {
            message,
            acknowledgement_token,
        }
    }
}

/// Acknowledges deliveries with the broker, after their batch committed.
///
/// Implemented for closures `FnMut(&Delivery<T>) -> Result<()>`. Runs on the caller's thread
/// (the one running [`consume`](super::consume)); it need not be `Send`.
pub trait Acknowledge<T> {
    /// Acknowledges this delivery with its own token.
    ///
    /// # Errors
    ///
    /// An error stops the consumer (see the module docs, case 4) and is returned from
    /// [`consume`](super::consume).
    fn acknowledge(&mut self, delivery: &Delivery<T>) -> Result<()>;

    /// Acknowledges the acknowledged deliveries of one committed batch, in the order they were
    /// taken from the source.
    ///
    /// Defaults to calling [`acknowledge`](Self::acknowledge) for each in turn, stopping at the
    /// first error. A broker adapter may acknowledge them at once (AMQP: `basic.ack` with
    /// `multiple`). Beware that the deliveries of a failed batch stay unacknowledged: a
    /// `multiple` acknowledgement must not cover their tags (nor those of deliveries still
    /// being applied, nor those an earlier run on the same channel left unacknowledged), so use
    /// it only up to a tag below which nothing else is outstanding on that channel, and
    /// acknowledge the rest singly.
    ///
    /// # Errors
    ///
    /// As for [`acknowledge`](Self::acknowledge).
    fn acknowledge_batch(&mut self, deliveries: &[Delivery<T>]) -> Result<()> {
        deliveries.iter().try_for_each(|d| self.acknowledge(d))
    }

    /// Told about the deliveries of a batch that was rolled back, with the reason.
    ///
    /// Defaults to doing nothing: the deliveries stay unacknowledged and the broker redelivers
    /// them when the consumer's channel closes. A broker adapter should give them back before
    /// that, after a backoff: held unacknowledged, they count against the consumer's prefetch,
    /// and a few failed batches can fill it and starve the run. [`AmqpQueue`](super::AmqpQueue)'s acknowledger
    /// requeues them after a growing backoff (see the [module docs](super)).
    ///
    /// # Errors
    ///
    /// An error stops the consumer like an acknowledgement failure.
    fn failed(&mut self, deliveries: &[Delivery<T>], error: &Error) -> Result<()> {
        let _ = (deliveries, error);
        Ok(())
    }

    /// Told about one delivery that failed **through its own fault**: it failed alone (in a
    /// batch of one, or when the recipe applied its rolled-back batch's messages again one at
    /// a time) and the store refused it (an invalid or unauthorised item, an identity reused
    /// with another payload, an overflow: [`Error::InvalidArgument`](crate::Error::InvalidArgument), [`Error::InvalidName`](crate::Error::InvalidName),
    /// [`Error::InvalidHeader`](crate::Error::InvalidHeader), [`Error::Codec`](crate::Error::Codec)), or another message of its batch committed,
    /// or the store says it is up ([`ApplyBatch::check_up`](super::ApplyBatch::check_up)). A message that keeps being
    /// rejected can never be applied; one that is only ever [`failed`](Self::failed) may be
    /// waiting out a database outage.
    ///
    /// Defaults to [`failed`](Self::failed) with this delivery alone. [`AmqpQueue`](super::AmqpQueue)'s
    /// acknowledger counts these and dead-letters the delivery to `{queue}.dlq` after
    /// [`AmqpQueueOptions::dead_letter_after`](super::AmqpQueueOptions::dead_letter_after) of them.
    ///
    /// # Errors
    ///
    /// An error stops the consumer like an acknowledgement failure.
    fn rejected(&mut self, delivery: &Delivery<T>, error: &Error) -> Result<()> {
        self.failed(std::slice::from_ref(delivery), error)
    }
}

impl<T, F> Acknowledge<T> for F
where
    F: FnMut(&Delivery<T>) -> Result<()>,
{
    fn acknowledge(&mut self, delivery: &Delivery<T>) -> Result<()> {
        self(delivery)
    }
}
