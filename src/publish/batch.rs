//! Publishing a batch (the family's `send_all` / `SendAll`): every message checked first, all
//! handed over through the publisher's one window, the confirms awaited once, and a report per
//! message in input order.

use super::frame::check_message_fits;
use super::publisher::Publisher;
use crate::envelope::{check_name, Message};
use crate::error::{Error, Result};
use crate::observe::batch_report::{BatchItem, BatchOutcome, BatchReport};
use crate::ticket::Ticket;

impl Publisher {
    /// Publishes a batch of `(exchange, routing key, message)` — each as
    /// [`publish_deferred`](Self::publish_deferred) takes them — and waits once for all their
    /// confirms; returns what became of each, in the order given.
    ///
    /// Every message is checked first (names, headers, the header frame against the
    /// connection's frame limit): one invalid message refuses the whole batch before anything
    /// is sent, so a caller's mistake never leaves a batch half published. (So the batch is
    /// collected first, and held whole with its report: call this per chunk of an unbounded
    /// stream.) Then all are handed over without waiting for any confirm, through this
    /// publisher's window and the connection's byte budget like any publish: a batch larger
    /// than the window waits for room as confirms come back, it never exceeds either bound.
    /// Then each confirm is awaited, up to the publisher's
    /// [timeout](crate::PublisherOptions::timeout) counted from that message's hand-over, as
    /// [`Ticket::wait`] does. Each message's outcome reaches the connection's observer and the
    /// publish interceptors as a single publish's would (one never tried reaches neither).
    ///
    /// A message that could not be handed over is reported [`NotSent`](BatchOutcome::NotSent).
    /// When that failure is its own (a publish interceptor's refusal, a missing exchange) or
    /// the connection dropped under it, the batch goes on (the next publish waits for the
    /// connection to recover, up to its timeout); when it waited out its timeout (no room in
    /// the window or byte budget, no channel, a blocked broker) or the publisher was closed,
    /// the hand-over stops there: the messages after it are reported `NotSent` without being
    /// tried, while the ones already sent are still awaited. Not atomic: what was confirmed
    /// stays published whatever happened to the others, and after a partial failure the
    /// messages confirmed are not necessarily a prefix of the batch.
    ///
    /// ```no_run
    /// use acemq_amqp::{BatchOutcome, Connection, Error, Message};
    /// # fn main() -> acemq_amqp::Result<()> {
    /// let connection = Connection::open("amqp://127.0.0.1")?;
    /// let publisher = connection.publisher()?;
    /// let batch = (0..100).map(|i| ("", "orders", Message::new(format!("order {i}"))));
    /// match publisher.publish_all(batch) {
    ///     Ok(report) => assert_eq!(report.confirmed(), 100),
    ///     Err(Error::Batch { report }) => {
    ///         for item in report.unconfirmed() {
    ///             // Resend these (a `Lost` one may have arrived: the consumer deduplicates).
    ///             eprintln!("message {} ({}): {}", item.index, item.message_id, item.outcome);
    ///         }
    ///     }
    ///     Err(e) => return Err(e), // refused before sending: a bad message (InvalidBatch)
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// A publisher without [confirms](crate::PublisherOptions::confirms) refuses it: a report of
    /// what the broker confirmed is what it is for.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] on a publisher without confirms (nothing was sent);
    /// [`Error::InvalidBatch`] naming the first invalid message's index (nothing was sent);
    /// [`Error::Batch`] with the whole report when any message was not confirmed.
    pub fn publish_all<I, E, R>(&self, messages: I) -> Result<BatchReport>
    where
        I: IntoIterator<Item = (E, R, Message)>,
        E: AsRef<str>,
        R: AsRef<str>,
    {
        self.confirmed_for("publish_all (a report of what the broker confirmed)")?;
        let batch: Vec<(E, R, Message)> = messages.into_iter().collect();
        for (index, (exchange, routing_key, message)) in batch.iter().enumerate() {
            self.check_batch_item(exchange.as_ref(), routing_key.as_ref(), message)
                .map_err(|e| Error::InvalidBatch {
                    index,
                    source: Box::new(e),
                })?;
        }
        let mut sent: Vec<Sent> = Vec::with_capacity(batch.len());
        let mut stopped: Option<(usize, Error)> = None;
        for (index, (exchange, routing_key, message)) in batch.into_iter().enumerate() {
            let message_id = message.envelope.id.clone();
            if let Some((at, e)) = &stopped {
                sent.push(Sent::Not(
                    message_id,
                    BatchOutcome::NotSent {
                        reason: format!(
                            "not tried: the batch stopped handing over at message {at}: {e}"
                        ),
                        retriable: e.is_retriable(),
                    },
                ));
                continue;
            }
            match self.publish_deferred(exchange.as_ref(), routing_key.as_ref(), message) {
                Ok(ticket) => sent.push(Sent::Ticket(ticket)),
                Err(e) => {
                    sent.push(Sent::Not(
                        message_id,
                        BatchOutcome::NotSent {
                            reason: e.to_string(),
                            retriable: e.is_retriable(),
                        },
                    ));
                    // A message's own fault stops only it; a lost connection is waited out
                    // by the next publish (up to its timeout). Anything else — a timeout, a
                    // blocked broker, a closed publisher — would cost every later message the
                    // same wait for nothing: the hand-over stops there.
                    if !e.is_message_fault() && !e.is_connection_lost() {
                        stopped = Some((index, e));
                    }
                }
            }
        }
        let items = sent
            .into_iter()
            .enumerate()
            .map(|(index, s)| {
                let (message_id, outcome) = match s {
                    Sent::Ticket(ticket) => {
                        let id = ticket.message_id().to_string();
                        (id, outcome_of(ticket.wait()))
                    }
                    Sent::Not(id, outcome) => (id, outcome),
                };
                BatchItem {
                    index,
                    message_id,
                    outcome,
                }
            })
            .collect();
        let report = BatchReport::new(items);
        if report.all_confirmed() {
            Ok(report)
        } else {
            Err(Error::Batch {
                report: Box::new(report),
            })
        }
    }

    /// The checks a publish makes before anything is sent, made for every message of a batch
    /// before the first is sent.
    fn check_batch_item(&self, exchange: &str, routing_key: &str, message: &Message) -> Result<()> {
        check_name("exchange", exchange, true)?;
        check_name("routing key", routing_key, true)?;
        message.validate()?;
        let connection = &self.inner.connection;
        check_message_fits(
            message,
            routing_key,
            connection.origin(),
            connection.frame_max(),
        )
    }
}

/// A message of a batch after the hand-over: its ticket, or (its id and) why it was not sent.
enum Sent {
    Ticket(Ticket),
    Not(String, BatchOutcome),
}

/// A ticket's answer as a batch reports it.
fn outcome_of(answer: Result<()>) -> BatchOutcome {
    match answer {
        Ok(()) => BatchOutcome::Confirmed,
        Err(Error::Nacked { .. }) => BatchOutcome::Nacked,
        Err(Error::Unroutable {
            reply_code,
            reply_text,
            ..
        }) => BatchOutcome::Unroutable {
            reply_code,
            reply_text,
        },
        Err(e) => BatchOutcome::Lost {
            reason: e.to_string(),
            retriable: e.is_retriable(),
        },
    }
}
