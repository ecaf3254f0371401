//! The idempotent wrappers' options: [`IdempotentOptions`] (both wrappers: key, wait, report)
//! and [`IdempotentTxBatchOptions`] (the batched transactional form).

use std::fmt;
use std::time::Duration;

use super::duplicates::{Duplicates, KeyFn};
use crate::envelope::Message;
use crate::error::BoxError;
use crate::observe::Observer;

/// How an idempotent wrapper ([`idempotent`](fn@crate::patterns::idempotent::idempotent) or
/// [`idempotent_tx`](crate::patterns::idempotent::idempotent_tx)) is set up.
#[must_use]
pub struct IdempotentOptions {
    pub(super) key: Option<KeyFn>,
    pub(super) in_progress_delay: Duration,
    pub(super) duplicates: Duplicates,
}

impl Default for IdempotentOptions {
    fn default() -> Self {
        IdempotentOptions {
            key: None,
            in_progress_delay: Duration::from_secs(5),
            duplicates: Duplicates::default(),
        }
    }
}

impl fmt::Debug for IdempotentOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentOptions")
            .field("key", &self.key.as_ref().map(|_| "a key function"))
            .field("in_progress_delay", &self.in_progress_delay)
            .finish_non_exhaustive()
    }
}

impl IdempotentOptions {
    /// Takes the key from the message (e.g. an order id from the payload) instead of its
    /// `x-acemq-id`. A key function that fails rejects the message (it can never succeed).
    /// Defaults to the message id.
    pub fn key<K>(mut self, key: K) -> Self
    where
        K: Fn(&Message) -> Result<String, BoxError> + Send + Sync + 'static,
    {
        self.key = Some(Box::new(key));
        self
    }

    /// How long a message claimed by someone else waits before it comes back. Defaults to 5 s.
    pub fn in_progress_delay(mut self, delay: Duration) -> Self {
        self.in_progress_delay = delay;
        self
    }

    /// Where absorbed duplicates are reported ([`Observer::duplicate`]); give it the observer
    /// the connection has. Defaults to [`LogObserver`](crate::observe::LogObserver) (a debug
    /// line).
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.duplicates.observer = crate::observe::Guarded::wrap(observer);
        self
    }
}

/// How [`IdempotentTx::batch`](crate::patterns::idempotent::IdempotentTx::batch) gathers and reports its batches.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[must_use]
pub struct IdempotentTxBatchOptions {
    pub(super) max_messages: usize,
    pub(super) max_wait: Duration,
    pub(super) on_commit: Option<Box<dyn Fn(usize) + Send + Sync>>,
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
impl Default for IdempotentTxBatchOptions {
    fn default() -> Self {
        IdempotentTxBatchOptions {
            max_messages: 100,
            max_wait: Duration::from_millis(20),
            on_commit: None,
        }
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
impl std::fmt::Debug for IdempotentTxBatchOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentTxBatchOptions")
            .field("max_messages", &self.max_messages)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
impl IdempotentTxBatchOptions {
    /// Every check of these options, in one place (run by `IdempotentTx::batch`).
    pub(super) fn validate(&self) -> crate::Result<()> {
        if self.max_messages == 0 || self.max_messages > 10_000 {
            return Err(crate::Error::invalid(format!(
                "a batch holds from 1 to 10000 messages (max_messages {})",
                self.max_messages
            )));
        }
        if self.max_wait.is_zero() {
            return Err(crate::Error::invalid(
                "max_wait must be more than zero (got 0 s)",
            ));
        }
        Ok(())
    }

    /// The most messages in one batch (one transaction), from 1 to 10,000; 1 is the
    /// single-message form. Defaults to 100.
    pub fn max_messages(mut self, n: usize) -> Self {
        self.max_messages = n;
        self
    }

    /// The longest a partial batch waits for more messages (more than zero). Defaults to
    /// 20 ms.
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = wait;
        self
    }

    /// Called with the number of messages after each batch committed, before any of them is
    /// handed back to the consumer (so before any is acknowledged). For metrics; it must not
    /// block. Defaults to none.
    pub fn on_commit(mut self, f: impl Fn(usize) + Send + Sync + 'static) -> Self {
        self.on_commit = Some(Box::new(f));
        self
    }
}
