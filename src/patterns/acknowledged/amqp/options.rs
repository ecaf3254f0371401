//! How an [`AmqpQueue`](super::AmqpQueue) is opened: its prefetch, when a delivery is
//! dead-lettered, the requeue backoff of rolled-back deliveries, and how identities are scoped.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

/// Makes a message's identifier from its queue and the message as received.
pub(super) type IdentifierFn = Arc<dyn Fn(&str, &crate::Message) -> String + Send + Sync>;

/// The prefetch, by default: [`BatcherOptions`](super::super::BatcherOptions)' default
/// `max_pending` (64) plus one.
const DEFAULT_PREFETCH: u16 = 65;
/// The first requeue backoff of a rolled-back delivery, by default.
const DEFAULT_REQUEUE_FIRST: Duration = Duration::from_millis(200);
/// The longest requeue backoff, by default.
const DEFAULT_REQUEUE_MAX: Duration = Duration::from_secs(30);
/// The longest requeue backoff accepted: a held delivery takes a prefetch slot meanwhile.
const LONGEST_REQUEUE_MAX: Duration = Duration::from_secs(3600);
/// Failures through a message's own fault after which it is dead-lettered, by default.
const DEFAULT_DEAD_LETTER_AFTER: u32 = 5;

/// How [`AmqpQueue::open`](super::AmqpQueue::open) opens a queue for the acknowledged consumer.
/// Validated when the queue is opened.
///
/// ```
/// use acemq_amqp::patterns::acknowledged::AmqpQueueOptions;
/// use std::time::Duration;
/// let options = AmqpQueueOptions::new()
///     .prefetch(65)
///     .dead_letter_after(5)
///     .requeue_backoff_first(Duration::from_millis(200))
///     .requeue_backoff_max(Duration::from_secs(30));
/// # let _ = options;
/// ```
#[derive(Clone)]
pub struct AmqpQueueOptions {
    pub(super) prefetch: u16,
    pub(super) dead_letter_after: u32,
    pub(super) requeue_first: Duration,
    pub(super) requeue_max: Duration,
    pub(super) identifier: Option<IdentifierFn>,
}

impl Default for AmqpQueueOptions {
    fn default() -> Self {
        AmqpQueueOptions {
            prefetch: DEFAULT_PREFETCH,
            dead_letter_after: DEFAULT_DEAD_LETTER_AFTER,
            requeue_first: DEFAULT_REQUEUE_FIRST,
            requeue_max: DEFAULT_REQUEUE_MAX,
            identifier: None,
        }
    }
}

impl fmt::Debug for AmqpQueueOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpQueueOptions")
            .field("prefetch", &self.prefetch)
            .field("dead_letter_after", &self.dead_letter_after)
            .field("requeue_backoff_first", &self.requeue_first)
            .field("requeue_backoff_max", &self.requeue_max)
            .field("identifier", &self.identifier.as_ref().map(|_| "custom"))
            .finish()
    }
}

impl AmqpQueueOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many deliveries the broker sends ahead on the queue's channel, 1 to 65535. Set it
    /// at least to the consumer's `max_pending` plus one, so that the batcher is never starved.
    /// Defaults to 65 ([`BatcherOptions`](super::super::BatcherOptions)' default `max_pending`
    /// of 64, plus one).
    #[must_use]
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Dead-letters a delivery once it has failed `attempts` times **through its own fault**
    /// ([`Acknowledge::rejected`](super::super::Acknowledge::rejected): the store refused it,
    /// or it failed alone while its batchmates committed): a copy goes to `{queue}.dlq` with
    /// `x-acemq-error: exhausted N attempts: <the error>`, confirmed, and then the delivery is
    /// acknowledged. The first dead letter declares the family's failure topology beside the
    /// queue (`acemq.dlx`, `{queue}.dlq`, `{queue}.parked`), as the family's consumers do.
    /// Failures that are nobody's fault in particular (a whole batch rolled back by a database
    /// outage) never count: those deliveries only back off. Defaults to 5; must be at least 1.
    #[must_use]
    pub fn dead_letter_after(mut self, attempts: u32) -> Self {
        self.dead_letter_after = attempts;
        self
    }

    /// How long a rolled-back delivery is held before it is requeued after one consecutive
    /// failure; the wait doubles with each further one up to
    /// [`requeue_backoff_max`](Self::requeue_backoff_max), each wait multiplied by a random
    /// factor between ½ and 1 (see the [module docs](super::super)). Defaults to 200 ms; must
    /// be at least 1 ms and not longer than the longest.
    #[must_use]
    pub fn requeue_backoff_first(mut self, first: Duration) -> Self {
        self.requeue_first = first;
        self
    }

    /// The longest a rolled-back delivery is held before it is requeued. Defaults to 30 s; must
    /// be at most an hour (a held delivery takes a prefetch slot meanwhile).
    #[must_use]
    pub fn requeue_backoff_max(mut self, max: Duration) -> Self {
        self.requeue_max = max;
        self
    }

    /// Scopes identities another way: `f(queue, message)` must give the same string for every
    /// delivery of one message. Defaults to `{queue}/{x-acemq-id}`.
    #[must_use]
    pub fn identifier(
        mut self,
        f: impl Fn(&str, &crate::Message) -> String + Send + Sync + 'static,
    ) -> Self {
        self.identifier = Some(Arc::new(f));
        self
    }

    /// Checks the options.
    pub(super) fn validate(&self) -> Result<()> {
        if self.prefetch == 0 {
            return Err(Error::invalid("prefetch must be at least 1 (got 0)"));
        }
        if self.dead_letter_after == 0 {
            return Err(Error::invalid(
                "dead_letter_after must be at least 1 attempt (got 0)",
            ));
        }
        if self.requeue_first < Duration::from_millis(1) {
            return Err(Error::invalid(format!(
                "requeue_backoff_first must be at least 1 ms (got {:?})",
                self.requeue_first
            )));
        }
        if self.requeue_max > LONGEST_REQUEUE_MAX {
            return Err(Error::invalid(format!(
                "requeue_backoff_max must be at most 1 h (got {:?})",
                self.requeue_max
            )));
        }
        if self.requeue_max < self.requeue_first {
            return Err(Error::invalid(format!(
                "requeue_backoff_max ({:?}) must not be shorter than requeue_backoff_first ({:?})",
                self.requeue_max, self.requeue_first
            )));
        }
        Ok(())
    }
}
