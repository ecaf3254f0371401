//! Peek: read the first messages of a queue without consuming them.
//!
//! ```no_run
//! use acemq_amqp::{dead_letter_queue, Connection};
//! use acemq_amqp::patterns::peek;
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! for message in peek(&connection, &dead_letter_queue("orders"), 20)? {
//!     println!("{} {:?}", message.envelope.id, message.envelope.error);
//! }
//! # Ok(()) }
//! ```
//!
//! # What is promised
//!
//! * **Nothing is consumed or changed.** Up to `limit` messages are read with `basic.get`
//!   (unacknowledged) on a channel of its own, then all of them are returned at once with one
//!   `basic.nack` (`multiple`, requeue). The broker puts them back as they were: body,
//!   properties and headers untouched, and on a classic queue (every `.dlq` and `.parked` the
//!   family declares is one) **in their order, at the head of the queue**. The one trace a peek
//!   leaves is the broker's own `redelivered` flag on the next delivery of those messages.
//!   A crash between the read and the return loses nothing either: the broker requeues what an
//!   ended channel held.
//! * **On a quorum queue** a requeue counts as a delivery: the broker raises `x-delivery-count`,
//!   and a queue with a `delivery-limit` dead-letters a message that reaches it. Peek such a
//!   queue knowingly.
//! * **Bounded.** At most `limit` messages are read and held here (`limit` at most
//!   [`PEEK_MAX`]); a message another consumer takes meanwhile is simply not seen.
//! * Messages are returned as [`Message`]s read forgivingly (the envelope with the family's
//!   defaults, every application header as received, [`Message::received`] with the exchange and
//!   routing key it was published with).

use crate::connection::Connection;
use crate::envelope::{check_name, Message};
use crate::error::{Error, Result};

/// The most messages one [`peek`] reads.
pub const PEEK_MAX: usize = 10_000;

/// The first `limit` messages of `queue`, in queue order, left on the queue unchanged (see the
/// [module docs](self)). Fewer when the queue holds fewer.
///
/// # Errors
///
/// [`Error::InvalidName`] for a bad queue name, [`Error::InvalidArgument`] for a `limit` of 0 or
/// over [`PEEK_MAX`], [`Error::NotFound`] when there is no such queue,
/// [`Error::ConnectionLost`] / [`Error::Amqp`] when the broker cannot be reached; in every case
/// what was read goes back to the queue.
pub fn peek(connection: &Connection, queue: &str, limit: usize) -> Result<Vec<Message>> {
    check_name("queue", queue, false)?;
    if limit == 0 || limit > PEEK_MAX {
        return Err(Error::invalid(format!(
            "a peek reads between 1 and {PEEK_MAX} messages, not {limit}"
        )));
    }
    let (channel, _link) = connection.open_channel()?;
    channel
        .queue_declare_passive(queue)
        .map_err(|e| Error::from_amqp_on("queue", queue, "checking", e))?;
    let mut messages = Vec::with_capacity(limit.min(256));
    let mut read = || -> Result<()> {
        while messages.len() < limit {
            let got = channel
                .basic_get(queue, false)
                .map_err(|e| Error::from_amqp_on("queue", queue, "reading from", e))?;
            let Some(got) = got else { break };
            let mut delivery = got.delivery;
            messages.push(Message::take_delivery(&mut delivery));
        }
        Ok(())
    };
    let result = read();
    // Everything read goes back at once, in order: nack `multiple` with tag 0 covers every
    // unacknowledged delivery on this channel.
    let returned = if messages.is_empty() {
        Ok(())
    } else {
        channel.nack_all(true)
    };
    let _ = channel.close();
    result?;
    returned.map_err(|e| {
        Error::amqp(
            format!(
                "returning {} peeked message(s) to {queue:?} (the broker returns them as the \
                 channel closes)",
                messages.len()
            ),
            e,
        )
    })?;
    Ok(messages)
}
