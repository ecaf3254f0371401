//! An AMQP consumer and its end. amiquip's I/O thread answers a cancel in two steps: the
//! caller's `cancel-ok` first, then "cancelled" to the consumer's own receiver. Were every
//! receiver of that consumer gone between the two, the I/O thread would stop the whole
//! connection ("i/o loop thread tried to communicate with a nonexistent client"). So a dropped
//! consumer leaves one receiver with its channel ([`Ended`]) until the channel's next answered
//! call, which the I/O thread can only have read after it finished with that cancel.

use std::cell::RefCell;

use amiquip::ConsumerMessage;
use crossbeam_channel::Receiver;

use super::convert::error_in;
use crate::transport::channel::ConsumerApi;
use crate::transport::wire::AmqpError;

/// The receivers of a channel's dropped consumers, kept until the channel's next answered call
/// (each consume, qos, get and close releases them). A channel's consumers are dropped only after
/// they were consumed, and each consume releases, so this holds at most as many receivers as the
/// channel had consumers at once. A receiver kept here may still hold deliveries nobody reads:
/// unacked, they go back to the queue when the channel closes, as they would have without it.
#[derive(Default)]
pub(super) struct Ended(RefCell<Vec<Receiver<ConsumerMessage>>>);

impl Ended {
    /// After a call the broker answered: every cancel answered before it is finished.
    pub(super) fn release(&self) {
        self.0.borrow_mut().clear();
    }
}

/// One amiquip consumer on a channel whose [`Ended`] keeps its receiver once it is dropped.
pub(super) struct AmqpConsumer<'a> {
    consumer: amiquip::Consumer<'a>,
    receiver: Option<Receiver<ConsumerMessage>>,
    ended: &'a Ended,
}

impl<'a> AmqpConsumer<'a> {
    pub(super) fn new(consumer: amiquip::Consumer<'a>, ended: &'a Ended) -> AmqpConsumer<'a> {
        let receiver = Some(consumer.receiver().clone());
        AmqpConsumer {
            consumer,
            receiver,
            ended,
        }
    }
}

impl ConsumerApi for AmqpConsumer<'_> {
    fn cancel(&self) -> Result<(), AmqpError> {
        self.consumer.cancel().map_err(error_in)
    }
}

impl Drop for AmqpConsumer<'_> {
    fn drop(&mut self) {
        // amiquip's own drop would cancel too, but only after this receiver had gone.
        let _ = self.consumer.cancel();
        if let Some(receiver) = self.receiver.take() {
            self.ended.0.borrow_mut().push(receiver);
        }
    }
}
