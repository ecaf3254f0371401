//! [`MemoryBroker`]: the in-process broker behind `memory://name`, and its faults on demand.

use std::sync::Arc;
use std::time::Duration;

use crate::transport::memory::{self, Broker};

/// The in-process broker named `name`, as `memory://name` URLs reach it (feature `testing`):
/// an AMQP 0-9-1 broker in the test's process, shared by every connection to that name for the
/// life of the process, deliberately not more forgiving than the RabbitMQ it follows (what it
/// does not emulate — streams, `x-dead-letter-strategy`, priorities, `x-expires`, alternate
/// exchanges and the like — it refuses with 540 NOT_IMPLEMENTED rather than accepting and
/// ignoring). Parallel tests use distinct names and need no coordination.
///
/// It follows **RabbitMQ 4.x** by default, where the majors differ in what a test can see:
///
/// * a quorum queue has a delivery limit of 20 (`x-delivery-limit` overrides it; a negative
///   one means none): each return of a delivered message — nack or reject with requeue, or its
///   channel or connection ending while it is unacknowledged — counts, the redelivery carries
///   the count in `x-delivery-count` (the first delivery carries none), and a message returned
///   more often than the limit is dead-lettered with reason `delivery_limit` (dropped when the
///   queue has no dead-letter exchange); a returned message goes back to the head;
/// * dead-lettering writes `x-last-death-exchange`, `-queue` and `-reason` beside `x-death`
///   and `x-first-death-*`, and counts only the deaths the broker recorded itself: a client
///   that republishes a message carrying `x-death` does not raise its counts;
/// * a queue declared without `x-queue-type` keeps `x-queue-type: classic` among its
///   arguments (a redeclaration's refusal names it).
///
/// [`rabbitmq_major(3)`](Self::rabbitmq_major) makes it follow RabbitMQ 3.10 instead: no
/// delivery limit unless `x-delivery-limit` sets one, `x-delivery-count` from the first
/// delivery (0) and a returned message at the tail of a quorum queue, `x-death` counted in the
/// header the message carries, no `x-last-death-*`, no `x-queue-type` kept. A classic queue
/// puts a returned message back in its place on both.
///
/// Its other methods are the faults a test asks for (a cut, refused connections, nacked
/// publishes, a memory alarm, held deliveries, time moving on) and what it reads back (depth,
/// unacked messages, consumers, connections).
///
/// ```
/// use acemq_amqp::testing::MemoryBroker;
/// use acemq_amqp::{Connection, QueueSpec};
///
/// # fn main() -> acemq_amqp::Result<()> {
/// let broker = MemoryBroker::named("doc-example");
/// let connection = Connection::open(&broker.url())?;
/// connection.declare_queue(&QueueSpec::new("orders").classic())?;
/// assert_eq!(broker.queue_depth("orders"), Some(0));
/// assert_eq!(broker.cut_connections(), 1); // the connection reconnects and re-declares
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryBroker {
    name: String,
    broker: Arc<Broker>,
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("name", &self.name)
            .finish()
    }
}

impl MemoryBroker {
    /// The broker named `name` (created on first use, kept for the life of the process).
    pub fn named(name: &str) -> MemoryBroker {
        MemoryBroker {
            name: name.to_string(),
            broker: memory::broker(name),
        }
    }

    /// Makes it follow RabbitMQ `major`: 4 (the default) or 3 (RabbitMQ 3.10), as the type's
    /// docs list, and returns it. Everything on the broker `name` follows it from this call
    /// on, for every connection to it: what is declared, delivered, returned and dead-lettered
    /// after it (a queue keeps the delivery limit it was declared with). Call it before the
    /// first connection, on a name of the test's own.
    ///
    /// ```
    /// use acemq_amqp::testing::MemoryBroker;
    ///
    /// let broker = MemoryBroker::named("doc-rabbitmq-3").rabbitmq_major(3);
    /// assert_eq!(broker.rabbitmq(), 3);
    /// assert_eq!(MemoryBroker::named("doc-rabbitmq-4").rabbitmq(), 4);
    /// ```
    ///
    /// # Panics
    ///
    /// When `major` is neither 3 nor 4.
    pub fn rabbitmq_major(self, major: u8) -> MemoryBroker {
        assert!(
            matches!(major, 3 | 4),
            "the memory broker follows RabbitMQ 3 or 4, not {major}"
        );
        self.broker.set_major(major);
        self
    }

    /// The RabbitMQ major it follows: 4 unless [`rabbitmq_major`](Self::rabbitmq_major) said 3.
    pub fn rabbitmq(&self) -> u8 {
        self.broker.major()
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL that connects to it: `memory://name`.
    pub fn url(&self) -> String {
        format!("memory://{}", self.name)
    }

    /// Drops every live connection as a lost socket: their consumers' buffers and blocked
    /// notifications disconnect (so a supervisor reconnects and re-declares), their unacked
    /// messages are requeued, their exclusive queues deleted, publishes an alarm held on them
    /// lost (never confirmed). Returns how many connections were cut.
    pub fn cut_connections(&self) -> usize {
        self.broker.cut_connections()
    }

    /// While `on`, connecting fails (connection refused), as against a stopped broker.
    pub fn refuse_connections(&self, on: bool) {
        self.broker.refuse_connections(on)
    }

    /// The next `n` publishes (on any connection) are nacked and not enqueued.
    pub fn nack_next_publishes(&self, n: u32) {
        self.broker.nack_next_publishes(n)
    }

    /// A memory alarm: every connection, and any that connects while it holds, is told
    /// `connection.blocked` with `reason`; publishes are held, unrouted and unconfirmed, in
    /// order, until [`unblock`](Self::unblock).
    pub fn block(&self, reason: &str) {
        self.broker.block(reason)
    }

    /// Ends the alarm: `connection.unblocked` to every connection, then the held publishes are
    /// routed and confirmed in order.
    pub fn unblock(&self) {
        self.broker.unblock()
    }

    /// No deliveries to `queue`'s consumers until [`release_deliveries`](Self::release_deliveries)
    /// (messages wait ready; `basic.get` still takes them).
    pub fn hold_deliveries(&self, queue: &str) {
        self.broker.hold_deliveries(queue)
    }

    /// Undoes [`hold_deliveries`](Self::hold_deliveries): what waited is delivered.
    pub fn release_deliveries(&self, queue: &str) {
        self.broker.release_deliveries(queue)
    }

    /// Moves the broker's clock on by `by`: queue TTLs and message expirations are measured on
    /// it, so a 30 s retry rung expires at once.
    pub fn advance_clock(&self, by: Duration) {
        self.broker.advance_clock(by)
    }

    /// Ready messages in `queue` (`None`: no such queue).
    pub fn queue_depth(&self, queue: &str) -> Option<u32> {
        self.broker.queue_depth(queue)
    }

    /// Messages of `queue` delivered and not yet settled (`None`: no such queue).
    pub fn unacked(&self, queue: &str) -> Option<u32> {
        self.broker.unacked(queue)
    }

    /// Consumers on `queue` (`None`: no such queue).
    pub fn consumer_count(&self, queue: &str) -> Option<u32> {
        self.broker.consumer_count(queue)
    }

    /// Live connections to this broker.
    pub fn connection_count(&self) -> usize {
        self.broker.connection_count()
    }
}
