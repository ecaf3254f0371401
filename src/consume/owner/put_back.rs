//! Giving a delivery back to its queue without spending the broker's delivery limit
//! ([`put_back`]).
//!
//! RabbitMQ 4.x counts every return of a message to a quorum queue — a `basic.nack` or
//! `basic.reject` with requeue, or its channel closing while it is unacknowledged — in
//! `x-delivery-count`, and past the queue's delivery limit (20 by default since 4.0) dead-letters
//! it through the queue's own dead-letter exchange, or **drops** it when the queue has none. A
//! consumer closing with messages it received but never started would so spend one of their
//! returns at every restart, and lose them after about twenty.
//!
//! So what the consumer puts back without having failed it goes back one of two ways:
//! * **never counted before** (no `x-delivery-count`, or 0: a classic queue, or a quorum
//!   queue's first return): `basic.nack` with requeue. The message keeps its place (the head
//!   of a quorum queue, its old position in a classic one), so a restart keeps the order of
//!   what was prefetched; the broker's count becomes 1;
//! * **counted before**: a fresh copy of it (same id, attempt, headers and body; without
//!   `x-delivery-count`) is published to the queue, confirmed, and only then is the original
//!   acknowledged. The copy starts with no count; it goes to the back of the queue.
//!
//! The library thus adds at most one to any message's count, whatever the number of restarts.
//! Should the copy not be published (the connection is going), the original is requeued the
//! plain way: counted, but never lost.

use super::acks::Acks;
use crate::consume::ladder::copies::{copy_of, publish};
use crate::consume::threads::context::Context;
use crate::envelope::Message;
use crate::transport::{AmqpError, Channel, Delivery};

/// How a delivery went back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PutBack {
    /// `basic.nack` with requeue.
    Requeued,
    /// A fresh copy confirmed on the queue, the original acknowledged.
    Replaced,
}

/// Puts `delivery` (whose message, as received, is `message`) back on this consumer's queue
/// without the broker counting a second return of it (see the module docs). `Err` only when the
/// channel failed.
pub(in crate::consume) fn put_back(
    ctx: &Context,
    channel: &Channel,
    acks: &mut Acks,
    delivery: Delivery,
    message: &Message,
) -> Result<PutBack, AmqpError> {
    let tag = delivery.delivery_tag();
    if message.returns_counted() > 0
        && copied_back(message, &ctx.who(), |copy| publish(ctx, &ctx.queue, copy))
    {
        delivery.ack(channel)?;
        acks.settled(tag);
        return Ok(PutBack::Replaced);
    }
    delivery.nack(channel, true)?;
    acks.settled(tag);
    Ok(PutBack::Requeued)
}

/// For a `basic.get` reader that returns what it read with one `nack` of everything at the end
/// (`peek`, a replay's held messages): replaces each of `counted` — deliveries on `channel` of
/// messages the broker counted a return of, with the messages — by a fresh copy on `queue`,
/// confirmed, then acknowledges it, so the `nack` that follows does not count it again. A copy
/// that cannot be published leaves its delivery to the `nack` (counted once more), logged.
///
/// # Errors
///
/// A publisher that cannot be opened, or an acknowledgement the channel refuses.
pub(crate) fn replace_counted(
    connection: &crate::Connection,
    channel: &Channel,
    queue: &str,
    counted: Vec<(Delivery, Message)>,
) -> crate::Result<()> {
    if counted.is_empty() {
        return Ok(());
    }
    let publisher = connection.publisher()?;
    for (delivery, message) in counted {
        let on = format!("{queue:?}");
        if !copied_back(&message, &on, |copy| {
            crate::consume::ladder::copies::publish_copy(&publisher, queue, copy)
        }) {
            continue;
        }
        delivery.ack(channel).map_err(|e| {
            crate::Error::amqp(
                format!("{queue:?}: acknowledging a message put back as a copy"),
                e,
            )
        })?;
    }
    let _ = publisher.close();
    Ok(())
}

/// The step both ways of putting back share: a fresh copy of `message` published (confirmed) by
/// `publish`; true when it went out. A copy that did not is logged (`on`: where), and the caller
/// returns the original the counted way instead.
fn copied_back(
    message: &Message,
    on: &str,
    publish: impl FnOnce(Message) -> crate::Result<()>,
) -> bool {
    match publish(copy_of(message)) {
        Ok(()) => true,
        Err(e) => {
            log::warn!(
                "acemq: message {} on {on}: could not put a fresh copy of it back ({e}); it is \
                 returned instead, and the broker counts one more return of it",
                message.id()
            );
            false
        }
    }
}
