//! [`MemoryBroker`]: the in-process broker behind `memory://name`, and its faults on demand.

use std::sync::Arc;
use std::time::Duration;

use crate::transport::memory::{self, Broker};

/// The in-process broker named `name`, as `memory://name` URLs reach it (feature `testing`):
/// an AMQP 0-9-1 broker in the test's process, shared by every connection to that name for the
/// life of the process, deliberately not more forgiving than RabbitMQ 3.x (what it does not
/// emulate — streams, quorum-only arguments, priorities, `x-expires`, alternate exchanges and the
/// like — it refuses with 540 NOT_IMPLEMENTED rather than accepting and ignoring). Parallel
/// tests use distinct names and need no coordination.
///
/// Its methods are the faults a test asks for (a cut, refused connections, nacked publishes, a
/// memory alarm, held deliveries, time moving on) and what it reads back (depth, unacked
/// messages, consumers, connections).
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
