//! The redelivery horizon: the oldest message still waiting on the broker to be delivered
//! (again) — in a consumed queue, its `.dlq`, `.parked`, its retry rungs or the scheduler's
//! ladder —, read without consuming anything.

use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::patterns::peek::peek_unordered;

use super::options::RetentionOptions;

/// The message that holds the horizon back: the oldest one waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Where it waits.
    pub queue: String,
    /// Its id (the idempotency key its receipt is kept under).
    pub message_id: String,
    /// When it was first sent (its envelope's `x-acemq-first-seen`, ms since the epoch).
    pub first_seen_ms: i64,
}

impl std::fmt::Display for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let age = crate::envelope::now_ms().saturating_sub(self.first_seen_ms) / 1000;
        write!(
            f,
            "message {} on {}, first sent {age} s ago",
            self.message_id, self.queue
        )
    }
}

/// What a scan of the broker found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Horizon {
    /// The oldest message waiting, if any waits.
    pub oldest: Option<Held>,
    /// Messages read (and put back).
    pub scanned: usize,
    /// The queues looked at that exist.
    pub queues: Vec<String>,
}

/// Reads every message waiting in the queues `options` names (each put back as
/// [`peek_unordered`] puts it back: nothing consumed, a quorum queue's order may change) and
/// returns the oldest by first-seen time. A queue that does not exist holds nothing.
///
/// Only messages ready in a queue are seen: one a consumer holds unacknowledged at the moment
/// is being handled — its receipt, if it was handled before, is as old as its first handling,
/// which the cutoff also keeps when it is younger than the oldest waiting message.
///
/// # Errors
///
/// [`Error::InvalidArgument`] when a queue holds more messages than the scan limit (the
/// horizon cannot be known: nothing may be purged); the broker's error when it cannot be read.
pub fn horizon(connection: &Connection, options: &RetentionOptions) -> Result<Horizon> {
    let mut found = Horizon::default();
    for queue in options.queues_to_scan() {
        let count = match connection.queue_info(&queue) {
            Ok(info) => info.message_count as usize,
            Err(Error::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        found.queues.push(queue.clone());
        if count == 0 {
            continue;
        }
        if count > options.scan_limit {
            return Err(Error::invalid(format!(
                "the redelivery horizon cannot be known: {queue} holds {count} messages, more \
                 than the scan limit of {}; nothing is purged (raise the limit, or look at \
                 the queue first)",
                options.scan_limit
            )));
        }
        for message in peek_unordered(connection, &queue, count)? {
            found.scanned += 1;
            let first_seen = message.envelope.first_seen_ms;
            if found
                .oldest
                .as_ref()
                .is_none_or(|o| first_seen < o.first_seen_ms)
            {
                found.oldest = Some(Held {
                    queue: queue.clone(),
                    message_id: message.id().to_string(),
                    first_seen_ms: first_seen,
                });
            }
        }
    }
    Ok(found)
}
