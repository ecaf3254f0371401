//! The family's names for the exchanges and queues a failed message travels through (Python
//! `retry.py`, Go `retry.go`): the base layer's, so that the topology (transport) and the
//! consumer (engine) both name them without importing each other.

use std::time::Duration;

/// The exchange rungs dead-letter through, back to their source queue.
pub const RETRY_EXCHANGE: &str = "acemq.retry";
/// The exchange `.dlq` and `.parked` queues are bound to.
pub const DEAD_LETTER_EXCHANGE: &str = "acemq.dlx";
/// The family's name for a rung's wait: whole hours `Nh`, whole minutes `Nm`, else whole
/// seconds `Ns` (fractions truncated, as the Python, Go and Ruby libraries do; under a second is
/// `0s`).
pub fn rung_name(delay: Duration) -> String {
    let secs = delay.as_secs();
    if secs == 0 {
        "0s".into()
    } else if secs.is_multiple_of(3600) {
        format!("{}h", secs / 3600)
    } else if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// `{queue}.retry.{rung}`.
pub fn retry_queue(queue: &str, delay: Duration) -> String {
    format!("{queue}.retry.{}", rung_name(delay))
}

/// `{queue}.dlq`.
pub fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}.dlq")
}

/// `{queue}.parked`.
pub fn parked_queue(queue: &str) -> String {
    format!("{queue}.parked")
}
