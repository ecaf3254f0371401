//! A consumer group: `n` consumers of one queue sharing one handler, started together, closed
//! together, reported as one.
//!
//! ```no_run
//! use acemq_amqp::patterns::consumer_group::{ConsumerGroup, ConsumerGroupOptions};
//! use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome};
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let options = ConsumerGroupOptions::new()
//!     .members(4)
//!     .consumer(ConsumerOptions::new().prefetch(16));
//! let group = ConsumerGroup::new(&connection, "orders", options)?
//!     .start(|_: &Message| Ok(Outcome::Accept))?;
//! // … later:
//! let report = group.close()?; // the members' reports, summed
//! println!("{} handled, {} requeued", report.handled, report.requeued);
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
//! The group follows the crate's life cycle: [`ConsumerGroup::new`] checks the options (nothing
//! starts), [`ConsumerGroup::start`] starts the members one after the other and returns a
//! [`RunningConsumerGroup`] once all of them are subscribed. If member `k` fails
//! to start, members `1 … k−1` are closed (their deliveries settled or requeued) **before** the
//! error is returned: a half-started group would hold messages that nobody finishes.
//! [`RunningConsumerGroup::close`] stops every member at once, then joins them one by one (so the
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
use crate::consume::{CloseReport, ConsumerOptions, DeliveryHook, Handler, RunningConsumer};
use crate::error::{Error, Result};

/// How a [`ConsumerGroup`] runs: given to [`ConsumerGroup::new`], checked there.
#[derive(Clone, Debug)]
#[must_use]
pub struct ConsumerGroupOptions {
    members: usize,
    consumer: ConsumerOptions,
}

impl Default for ConsumerGroupOptions {
    fn default() -> Self {
        ConsumerGroupOptions {
            members: 1,
            consumer: ConsumerOptions::default(),
        }
    }
}

impl ConsumerGroupOptions {
    /// Every check of these options, in one place (run by [`ConsumerGroup::new`]): the
    /// members' number, then their consumer options.
    fn validate(&self, queue: &str) -> Result<()> {
        if self.members == 0 {
            return Err(Error::invalid(
                "a consumer group needs at least 1 consumer (ConsumerGroupOptions::members, got 0)",
            ));
        }
        self.consumer.validate(queue)
    }

    /// The defaults (as [`Default`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// How many consumers the group runs (at least 1). Defaults to 1.
    pub fn members(mut self, members: usize) -> Self {
        self.members = members;
        self
    }

    /// Each member's options (its own channel, prefetch and workers). Defaults to
    /// [`ConsumerOptions::default`].
    pub fn consumer(mut self, consumer: ConsumerOptions) -> Self {
        self.consumer = consumer;
        self
    }
}

/// A consumer group configured and checked, not started: see [`ConsumerGroup::start`].
#[derive(Debug)]
pub struct ConsumerGroup {
    connection: Connection,
    queue: String,
    options: ConsumerGroupOptions,
}

impl ConsumerGroup {
    /// A group of `options.members` consumers of `queue`; nothing starts yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the group has 0 members or the consumer options are bad.
    pub fn new(
        connection: &Connection,
        queue: &str,
        options: ConsumerGroupOptions,
    ) -> Result<Self> {
        options.validate(queue)?;
        Ok(ConsumerGroup {
            connection: connection.clone(),
            queue: queue.to_string(),
            options,
        })
    }

    /// Starts the members, each with the group's consumer options, sharing `handler`, and
    /// returns once all of them are subscribed.
    ///
    /// # Errors
    ///
    /// The error of the first member that failed to start ([`Error::NotFound`] when the queue
    /// does not exist, a refusal when another consumer holds it exclusively, …), returned after
    /// the members already running have been closed.
    pub fn start<H>(self, handler: H) -> Result<RunningConsumerGroup>
    where
        H: Handler + Send + Sync + 'static,
    {
        let ConsumerGroup {
            connection,
            queue,
            options,
        } = self;
        let queue = queue.as_str();
        let n = options.members;
        let options = options.consumer;
        let declare = options.declares();
        let handler = Arc::new(handler);
        let mut members = Vec::with_capacity(n);
        for k in 1..=n {
            let member_options = options
                .clone()
                .hook(Arc::new(Member(k)))
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
        Ok(RunningConsumerGroup {
            queue: queue.to_string(),
            members,
        })
    }
}

/// `n` running consumers of one queue sharing one handler, made by [`ConsumerGroup::start`];
/// [`close`](Self::close) closes all members and sums their reports. Dropping it closes it too
/// (blocking, see the module docs).
pub struct RunningConsumerGroup {
    queue: String,
    members: Vec<RunningConsumer>,
}

impl std::fmt::Debug for RunningConsumerGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningConsumerGroup")
            .field("queue", &self.queue)
            .field("size", &self.members.len())
            .finish()
    }
}

impl RunningConsumerGroup {
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
    /// (`handled`, `finished_in_time`, `requeued` and `abandoned` each added up).
    ///
    /// # Errors
    ///
    /// The first error a member ended with ([`Error::Cancelled`] when the queue was deleted, …),
    /// after every member has been closed; further errors are logged.
    pub fn close(self) -> Result<CloseReport> {
        self.close_within(None)
    }

    /// Closes every member together, each waiting `timeout` (else its own shutdown timeout).
    fn close_within(mut self, timeout: Option<std::time::Duration>) -> Result<CloseReport> {
        let members = std::mem::take(&mut self.members);
        if let Some(timeout) = timeout {
            for member in &members {
                member.set_shutdown_timeout(timeout);
            }
        }
        let (report, result) = close_all(&self.queue, members);
        result.map(|()| report)
    }
}

impl RunningConsumerGroup {
    /// Closes as [`close`](Self::close) does, waiting up to `timeout` (instead of the members'
    /// shutdown timeout) for running handlers — every member's clock starts together, so the
    /// whole group is closed within about `timeout`: what is still running then is given back
    /// and counted `abandoned` in the summed report. What a service host's drain calls.
    ///
    /// # Errors
    ///
    /// As [`close`](Self::close).
    pub fn drain(self, timeout: std::time::Duration) -> Result<CloseReport> {
        self.close_within(Some(timeout))
    }
}

impl Drop for RunningConsumerGroup {
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
                total.finished_in_time += r.finished_in_time;
                total.handled += r.handled;
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

/// A group member's part in its consumer's deliveries: its number names its threads
/// (`acemq-consumer-3`) and tags its log lines.
#[derive(Debug)]
struct Member(usize);

impl DeliveryHook for Member {
    fn label(&self) -> Option<String> {
        Some(self.0.to_string())
    }
}
