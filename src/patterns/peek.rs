//! Peek: read the first messages of a queue without consuming them.
//!
//! ```no_run
//! use acemq_amqp::{dead_letter_queue, Connection};
//! use acemq_amqp::patterns::peek::peek;
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
//! * **Classic queues only.** On a quorum queue a returned message goes back **behind** the
//!   others on RabbitMQ 3.x (checked here: peek the head twice and the second peek shows the
//!   next message), and on both 3.x and 4.x the return is counted (`x-delivery-count` rises):
//!   RabbitMQ 4.x dead-letters, or **drops**, a message returned more than its delivery limit
//!   (20 by default) allows. A stream cannot be read with `basic.get`. So [`peek`] first asks
//!   the broker the queue's type (as [`Connection::compare_queue`] does: a declaration the
//!   broker refuses or accepts, never a change) and refuses anything but a classic queue with
//!   [`Error::InvalidArgument`]. [`peek_unordered`] reads a quorum queue anyway, for an
//!   operator who accepts that its order may change.
//! * **Never spent by a delivery limit**, however often it is run: a message whose
//!   `x-delivery-count` shows the broker counted a return of it before is not returned again;
//!   a fresh copy of it (same id, body, properties and headers, without the count) is put on
//!   the queue, confirmed, and only then is the one read acknowledged. The copy goes to the
//!   back of the queue with no count. So a peek adds at most one to any message's count, and a
//!   `.dlq` inspected every few seconds loses nothing.
//! * **Bounded.** At most `limit` messages are read and held here (`limit` at most
//!   [`PEEK_MAX`]); a message another consumer takes meanwhile is simply not seen.
//! * Messages are returned as [`Message`]s read forgivingly (the envelope with the family's
//!   defaults, every application header as received, [`Message::received`] with the exchange and
//!   routing key it was published with).

use crate::connection::Connection;
use crate::consume::replace_counted;
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
    check(queue, limit)?;
    let kind = queue_type(connection, queue)?;
    if kind != "classic" {
        return Err(Error::invalid(format!(
            "{queue:?} is a {kind} queue: a peek cannot put its messages back in their order \
             (they would go to its tail, their x-delivery-count raised); peek_unordered reads \
             it anyway"
        )));
    }
    read_and_return(connection, queue, limit)
}

/// As [`peek`], on any queue `basic.get` can read, without the check that it is classic: on a
/// quorum queue the messages read go back **behind the others** and their `x-delivery-count`
/// rises (see the [module docs](self)).
///
/// # Errors
///
/// As [`peek`], less the refusal of a queue that is not classic.
pub fn peek_unordered(connection: &Connection, queue: &str, limit: usize) -> Result<Vec<Message>> {
    check(queue, limit)?;
    read_and_return(connection, queue, limit)
}

fn check(queue: &str, limit: usize) -> Result<()> {
    check_name("queue", queue, false)?;
    if limit == 0 || limit > PEEK_MAX {
        return Err(Error::invalid(format!(
            "a peek reads between 1 and {PEEK_MAX} messages, not {limit}"
        )));
    }
    Ok(())
}

/// `classic`, `quorum` or `stream`, as the broker has it (a [`NotFound`](Error::NotFound) for a
/// missing queue).
fn queue_type(connection: &Connection, queue: &str) -> Result<String> {
    connection.queue_info(queue)?;
    // Compared with a classic declaration (no `x-queue-type`), a queue of another type differs
    // in `x-queue-type`; the other differences (durable, arguments) do not matter here.
    let spec = crate::connection::QueueSpec::new(queue).classic();
    let differences = connection.compare_queue(&spec)?;
    Ok(differences
        .into_iter()
        .find(|d| d.what == "x-queue-type")
        .map(|d| d.actual)
        .filter(|t| t != "none")
        .unwrap_or_else(|| "classic".to_string()))
}

fn read_and_return(connection: &Connection, queue: &str, limit: usize) -> Result<Vec<Message>> {
    let (channel, _link) = connection.open_channel()?;
    channel
        .queue_declare_passive(queue)
        .map_err(|e| Error::from_amqp_on("queue", queue, "checking", e))?;
    let mut messages = Vec::with_capacity(limit.min(256));
    // The deliveries of messages the broker has counted a return of before: replaced by fresh
    // copies rather than returned again (see the module docs).
    let mut counted = Vec::new();
    let mut read = || -> Result<()> {
        while messages.len() < limit {
            let got = channel
                .basic_get(queue, false)
                .map_err(|e| Error::from_amqp_on("queue", queue, "reading from", e))?;
            let Some(got) = got else { break };
            let mut delivery = got.delivery;
            let message = delivery.take_message();
            if message.returns_counted() > 0 {
                counted.push((delivery, message.clone()));
            }
            messages.push(message);
        }
        Ok(())
    };
    let result = read();
    let replaced = if result.is_ok() {
        replace_counted(connection, &channel, queue, counted)
    } else {
        Ok(())
    };
    // Everything else read goes back at once, in order: nack `multiple` with tag 0 covers every
    // unacknowledged delivery on this channel.
    let returned = if messages.is_empty() {
        Ok(())
    } else {
        channel.nack_all(true)
    };
    let _ = channel.close();
    result?;
    replaced?;
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
