//! The warning a consumer gives once at start when its queue can lose messages to RabbitMQ 4.x's
//! quorum delivery limit ([`warn_if_unguarded`]).
//!
//! On 4.x a quorum queue dead-letters a message returned to it more often than its delivery limit
//! (20 by default) allows, and **drops** it when the queue has no dead-letter target — the
//! family's default declaration. The library never spends that limit on a message it did not
//! fail (`put_back.rs`), but a message whose handler crashes the consumer again and again is
//! counted by the broker all the same: without a target it vanishes unseen. So a consumer of such
//! a queue says so once, with the two mends.

use std::collections::HashSet;

use crate::connection::{Connection, QueueSpec};

/// Queues warned about in this process (bounded: past it, warnings may repeat).
static WARNED: parking_lot::Mutex<Option<HashSet<String>>> = parking_lot::Mutex::new(None);
const MAX_WARNED: usize = 4096;

/// Logs a warning (once per queue in this process) when `queue` is a quorum queue with no
/// dead-letter target on a broker with a delivery limit (RabbitMQ 4 or later). Asks the broker
/// only there, by comparing the queue with its dead-letter form (a declaration the broker
/// refuses or accepts, never a change); says nothing when it cannot tell.
pub(crate) fn warn_if_unguarded(connection: &Connection, queue: &str) {
    if connection.broker_major().is_none_or(|major| major < 4) {
        return;
    }
    {
        let mut warned = WARNED.lock();
        let warned = warned.get_or_insert_with(HashSet::new);
        if warned.contains(queue) {
            return;
        }
        if warned.len() >= MAX_WARNED {
            warned.clear();
        }
        warned.insert(queue.to_string());
    }
    let Ok(differences) = connection.compare_queue(&QueueSpec::new(queue).with_dead_letter())
    else {
        return;
    };
    let other_type = differences
        .iter()
        .any(|d| d.what == "x-queue-type" || d.what == "existence");
    let no_target = differences
        .iter()
        .any(|d| d.what == "x-dead-letter-exchange" && d.actual == "none");
    if other_type || !no_target {
        return;
    }
    log::warn!(
        "acemq: queue {queue:?} is a quorum queue with no dead-letter target on RabbitMQ {}: \
         the broker drops a message returned to it more often than its delivery limit (20 by \
         default) allows — a message whose handler keeps crashing the consumer — without a \
         trace. Declare it in the dead-letter form (QueueSpec::with_dead_letter: \
         x-dead-letter-exchange acemq.dlx, routing key {queue}.dlq), or give it a broker policy \
         with a dead-letter-exchange, and such a message lands in {queue}.dlq with the reason \
         delivery_limit",
        connection.broker_version().unwrap_or_default()
    );
}
