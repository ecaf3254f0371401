//! The family's metric names.

/// Counter, labels `queue` and `outcome` (accept, retry, reject, park, in_progress).
pub const CONSUME_TOTAL: &str = "acemq.consume.total";
/// Counter, labels `exchange` and `outcome` (confirmed, nacked, unroutable, failed).
pub const PUBLISH_TOTAL: &str = "acemq.publish.total";
/// Histogram of request/reply round trips, label `outcome` (replied, responder_failed,
/// timed_out, failed).
pub const REQUEST_DURATION: &str = "acemq.request.duration";
/// Counter, label `outcome` (published, failed, retired).
pub const OUTBOX_TOTAL: &str = "acemq.outbox.total";
/// An outbox record's commit to its confirm (Java graphs a gauge; `MetricsObserver` records
/// a histogram in seconds).
pub const OUTBOX_LAG: &str = "acemq.outbox.lag";
