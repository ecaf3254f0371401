//! What the idempotent wrappers share: the duplicates they count and report, and the key of a
//! message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::consume::{HandlerResult, Outcome};
use crate::envelope::Message;
use crate::error::{BoxError, FatalError};
use crate::observe::{Duplicate, LogObserver, Observer};

pub(super) type KeyFn = Box<dyn Fn(&Message) -> Result<String, BoxError> + Send + Sync>;

/// The number of duplicates an idempotent wrapper absorbed, shared with it: take it with
/// [`Idempotent::duplicates`](crate::patterns::idempotent::Idempotent::duplicates) before the wrapper moves into a consumer.
#[derive(Clone, Debug, Default)]
pub struct DuplicateCount(Arc<AtomicU64>);

impl DuplicateCount {
    /// Duplicates absorbed so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What the wrappers keep to report duplicates.
pub(super) struct Duplicates {
    pub(super) observer: Arc<dyn Observer>,
    pub(super) count: DuplicateCount,
}

impl Default for Duplicates {
    fn default() -> Self {
        Duplicates {
            observer: Arc::new(LogObserver),
            count: DuplicateCount::default(),
        }
    }
}

impl Duplicates {
    /// Counts and reports a duplicate of `key`; the outcome is an accept, as for a real run.
    pub(super) fn absorbed(&self, key: &str, m: &Message) -> HandlerResult {
        let duplicates = self.count.0.fetch_add(1, Ordering::Relaxed) + 1;
        self.observer.duplicate(&Duplicate {
            key,
            message_id: m.id(),
            attempt: m.envelope.attempt,
            duplicates,
        });
        Ok(Outcome::Accept)
    }
}

/// The key of a message, or the outcome that ends it (no usable key).
///
/// Without a key function the key is the message id, which is never empty: a message without
/// `x-acemq-id` and `message_id` reads with an id derived from the delivery, the same on every
/// redelivery. A key function can still return an empty key: that message can never be
/// deduplicated, so it is refused (fatal, to `.dlq`) without running the handler.
pub(super) fn key_of(key: &Option<KeyFn>, m: &Message) -> Result<String, BoxError> {
    match key {
        Some(f) => {
            let k = f(m)
                .map_err(|e| FatalError::new(format!("cannot compute the idempotency key: {e}")))?;
            if k.is_empty() {
                return Err(Box::new(FatalError::new(
                    "the key function returned an empty idempotency key",
                )));
            }
            Ok(k)
        }
        None => Ok(m.id().to_string()),
    }
}
