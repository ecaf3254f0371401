//! A consumer group: `n` consumers of one queue sharing one handler, started together, closed
//! together, reported as one.
//!
//! ```no_run
//! use acemq_amqp::patterns::consumer_group::ConsumerGroup;
//! use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome};
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let group = ConsumerGroup::start_with(
//!     &connection,
//!     "orders",
//!     4,
//!     ConsumerOptions::new().prefetch(16),
//!     |_: &Message| Ok(Outcome::Accept),
//! )?;
//! // … later:
//! let report = group.close()?; // the members' reports, summed
//! println!("{} finished, {} requeued", report.finished, report.requeued);
//! # Ok(()) }
//! ```
//!
//! # What a member is
//!
//! Each member is a [`Consumer`](crate::Consumer) started on threads of its own, with its own
//! channel and its own prefetch (the options' prefetch applies to each member, so the group holds
//! at most `n × prefetch` unsettled deliveries) and its own retry bookkeeping. The broker spreads
//! the queue's messages over the members round-robin, among those with prefetch room. The
//! handler is shared by all members through an [`Arc`]: it needs `Send + Sync`, not `Clone`.
//! Only the first member declares the failure topology (when the options ask for it); the
//! others would declare the same thing again. With [`ConsumerOptions::exclusive`] the second
//! member is refused by the broker on a classic queue, so such a group never starts (RabbitMQ
//! 3.10 ignores an exclusive consume on a quorum queue).
//!
//! # Threads
//!
//! Members are numbered from 1. Member `k` runs `acemq-consumer-k` (its owner thread),
//! `acemq-worker-k-0` … (its workers) and `acemq-retry-timer-k`; its log lines name it
//! `"queue" (consumer k)`. The group itself starts no thread.
//!
//! # Life cycle
//!
//! The group follows the crate's life cycle, with the configuring step folded into the call:
//! [`ConsumerGroup::start`] / [`ConsumerGroup::start_with`] check the options, then start the
//! members one after the other and return once all of them are subscribed. If member `k` fails
//! to start, members `1 … k−1` are closed (their deliveries settled or requeued) **before** the
//! error is returned: a half-started group would hold messages that nobody finishes.
//! [`ConsumerGroup::close`] stops every member at once, then joins them one by one (so the
//! shutdown timeouts run side by side, not end to end), and returns their [`CloseReport`]s
//! summed. Dropping a group does the same best-effort: it **blocks** until the members are
//! closed (up to the options' shutdown timeout) and logs errors instead of returning them.
//!
//! # Consumer tags
//!
//! amiquip 0.4 sends no consumer tag: the broker chooses each member's (`amq.ctag-…`), so the
//! members cannot be told apart by tag in the management UI. Their connection and channel
//! numbers, and this crate's thread names and log lines, tell them apart.

use std::sync::Arc;

use crate::connection::Connection;
use crate::consume::{CloseReport, ConsumerOptions, Handler, RunningConsumer};
use crate::error::{Error, Result};

/// `n` running consumers of one queue sharing one handler. Made running by
/// [`start`](Self::start) / [`start_with`](Self::start_with); [`close`](Self::close) closes all
/// members and sums their reports. Dropping it closes it too (blocking, see the module docs).
pub struct ConsumerGroup {
    queue: String,
    members: Vec<RunningConsumer>,
}

impl std::fmt::Debug for ConsumerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerGroup")
            .field("queue", &self.queue)
            .field("size", &self.members.len())
            .finish()
    }
}

impl ConsumerGroup {
    /// Starts `n` consumers of `queue` with default [`ConsumerOptions`], sharing `handler`, and
    /// returns once all of them are subscribed.
    ///
    /// # Errors
    ///
    /// As [`start_with`](Self::start_with).
    pub fn start<H>(connection: &Connection, queue: &str, n: usize, handler: H) -> Result<Self>
    where
        H: Handler + Send + Sync + 'static,
    {
        Self::start_with(connection, queue, n, ConsumerOptions::default(), handler)
    }

    /// Starts `n` consumers of `queue`, each with `options` (its own channel, prefetch and
    /// workers), sharing `handler`, and returns once all of them are subscribed.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when `n` is 0 or the options are bad (nothing is started);
    /// otherwise the error of the first member that failed to start
    /// ([`Error::NotFound`] when the queue does not exist, a refusal when another consumer holds
    /// it exclusively, …), returned after the members already running have been closed.
    pub fn start_with<H>(
        connection: &Connection,
        queue: &str,
        n: usize,
        options: ConsumerOptions,
        handler: H,
    ) -> Result<Self>
    where
        H: Handler + Send + Sync + 'static,
    {
        if n == 0 {
            return Err(Error::invalid("a consumer group needs at least 1 consumer"));
        }
        options.validate(queue)?;
        let declare = options.declares();
        let handler = Arc::new(handler);
        let mut members = Vec::with_capacity(n);
        for k in 1..=n {
            let member_options = options
                .clone()
                .label(k.to_string())
                .declare(declare && k == 1);
            let shared = handler.clone();
            let started = connection
                .consumer(queue, member_options)
                .and_then(|c| c.start(shared));
            match started {
                Ok(member) => members.push(member),
                Err(e) => {
                    log::warn!(
                        "acemq: consumer {k} of the group on {queue:?} could not start ({e}); \
                         closing the {} already running",
                        members.len()
                    );
                    if let Err(close_error) = close_all(queue, std::mem::take(&mut members)).1 {
                        log::warn!(
                            "acemq: closing the half-started group on {queue:?}: {close_error}"
                        );
                    }
                    return Err(e);
                }
            }
        }
        log::info!("acemq: consumer group of {n} on {queue:?} started");
        Ok(ConsumerGroup {
            queue: queue.to_string(),
            members,
        })
    }

    /// The queue the group consumes.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// How many consumers the group runs.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Deliveries received and not yet settled, summed over the members.
    pub fn in_flight(&self) -> usize {
        self.members.iter().map(RunningConsumer::in_flight).sum()
    }

    /// Stops every member at once, then joins them and returns their [`CloseReport`]s summed
    /// (`finished`, `requeued` and `abandoned` each added up).
    ///
    /// # Errors
    ///
    /// The first error a member ended with ([`Error::Cancelled`] when the queue was deleted, …),
    /// after every member has been closed; further errors are logged.
    pub fn close(mut self) -> Result<CloseReport> {
        let members = std::mem::take(&mut self.members);
        let (report, result) = close_all(&self.queue, members);
        result.map(|()| report)
    }
}

impl Drop for ConsumerGroup {
    fn drop(&mut self) {
        if self.members.is_empty() {
            return;
        }
        let members = std::mem::take(&mut self.members);
        if let Err(e) = close_all(&self.queue, members).1 {
            log::warn!(
                "acemq: the consumer group on {:?} ended with: {e}",
                self.queue
            );
        }
    }
}

/// Stops all members first (their shutdowns overlap), then closes them in order. Returns the
/// summed report and the first error; later errors are logged.
fn close_all(queue: &str, members: Vec<RunningConsumer>) -> (CloseReport, Result<()>) {
    for member in &members {
        member.stop_handle().stop();
    }
    let mut total = CloseReport::default();
    let mut first_error = None;
    for (i, member) in members.into_iter().enumerate() {
        match member.close() {
            Ok(r) => {
                total.finished += r.finished;
                total.requeued += r.requeued;
                total.abandoned += r.abandoned;
            }
            Err(e) => {
                if first_error.is_none() {
                    first_error = Some(e);
                } else {
                    log::warn!(
                        "acemq: consumer {} of the group on {queue:?} ended with: {e}",
                        i + 1
                    );
                }
            }
        }
    }
    (total, first_error.map_or(Ok(()), Err))
}
