//! [`IdempotentOptions`]: how both idempotent wrappers take their key, wait and report.

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
