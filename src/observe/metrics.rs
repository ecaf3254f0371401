//! The family's metric names, label keys and label values (Java's `MetricNames`, which Go's
//! `telemetry.go` and Python's `telemetry.py` follow; `tests/fixtures/metric_words.json` holds
//! them with their sources). [`MetricsObserver`](super::MetricsObserver) records them; an
//! observer of another metrics system should use the same words.

/// Counter, labels `queue` and `outcome`: every delivery settled, once. The family's outcomes
/// `acked`, `retried`, `rejected` (the handler's own), `dead_lettered` (the consumer gave up),
/// `parked`; this crate's own `in_progress`, `copy_failed`, `dropped`, `lost`.
pub const CONSUME_TOTAL: &str = "acemq.consume.total";
/// Histogram in seconds, labels `queue` and `outcome`: how long the handler ran.
pub const CONSUME_DURATION: &str = "acemq.consume.duration";
/// Histogram of attempt numbers (from 1), label `queue`: sampled as each delivery is taken,
/// before its handler runs.
pub const CONSUME_ATTEMPTS: &str = "acemq.consume.attempts";
/// Gauge, label `queue`: deliveries taken and not yet settled, bounded by the prefetch.
pub const CONSUME_IN_FLIGHT: &str = "acemq.consume.in.flight";
/// Counter, labels `queue` and `where` (`broker`: on a rung; `consumer`: held in the
/// consumer): another attempt scheduled.
pub const RETRIED_TOTAL: &str = "acemq.messages.retried.total";
/// Counter, labels `queue` and `outcome` (`dead_lettered`, `parked`): copies confirmed in
/// `.dlq` / `.parked`.
pub const DEAD_LETTERED_TOTAL: &str = "acemq.messages.dead.lettered.total";
/// Counter, labels `queue` and `target` (`{queue}.dlq`, `{queue}.parked`): a dead-letter or
/// parked copy that could not be published.
pub const SET_ASIDE_FAILED: &str = "acemq.messages.set.aside.failed";
/// Counter, labels `queue` and `rung` (`{queue}.retry.{rung}`): a retry whose rung queue is
/// missing, waited in the consumer instead.
pub const RUNG_MISSING: &str = "acemq.retry.rung.missing";
/// Counter, labels `exchange`, `routing.key` and `outcome` (confirmed, unroutable, failed, the
/// family's `published` for a publish sent without a confirm, and this crate's `nacked`).
pub const PUBLISH_TOTAL: &str = "acemq.publish.total";
/// Histogram in seconds, labels as [`PUBLISH_TOTAL`]: from the call to the broker's answer.
pub const PUBLISH_DURATION: &str = "acemq.publish.duration";
/// Histogram of request/reply round trips in seconds, labels `routing.key` and `outcome`
/// (answered, timed_out, failed, and this crate's responder_failed).
pub const REQUEST_DURATION: &str = "acemq.request.duration";
/// Counter, labels as [`REQUEST_DURATION`]: request/reply round trips.
pub const REQUEST_TOTAL: &str = "acemq.request.total";
/// Counter, labels `exchange`, `routing.key` and `outcome` (published, failed): records the
/// outbox relay handled.
pub const OUTBOX_TOTAL: &str = "acemq.outbox.total";
/// Histogram in seconds, labels `exchange` and `routing.key`: an outbox record's commit to its
/// confirm.
pub const OUTBOX_LAG: &str = "acemq.outbox.lag";
/// Counter, labels `pipeline`, `step` and `outcome` (completed, ended_early): pipeline runs
/// that ended.
pub const PIPELINE_RUN_TOTAL: &str = "acemq.pipeline.run.total";
/// Histogram in seconds, labels as [`PIPELINE_RUN_TOTAL`]: how long the run's message had
/// existed when the run ended.
pub const PIPELINE_RUN_DURATION: &str = "acemq.pipeline.run.duration";
/// Gauge: outbox records waiting to be published, after a relay's last sweep (this crate's
/// name; the family has none).
pub const OUTBOX_PENDING: &str = "acemq.outbox.pending";
/// Gauge in seconds: age of the oldest waiting outbox record, after a relay's last sweep, 0
/// when none waits (this crate's name; the family has none).
pub const OUTBOX_OLDEST_AGE: &str = "acemq.outbox.oldest.age";

/// Label key: the queue a delivery came from.
pub const TAG_QUEUE: &str = "queue";
/// Label key: what happened.
pub const TAG_OUTCOME: &str = "outcome";
/// Label key: the exchange published to (`""`: the default exchange).
pub const TAG_EXCHANGE: &str = "exchange";
/// Label key: the routing key (the family's dotted spelling; Prometheus exporters write
/// `routing_key`).
pub const TAG_ROUTING_KEY: &str = "routing.key";
/// Label key: where a retry waits (`broker`, `consumer`).
pub const TAG_WHERE: &str = "where";
/// Label key: the rung queue a retry belonged on.
pub const TAG_RUNG: &str = "rung";
/// Label key: where a set-aside copy was going.
pub const TAG_TARGET: &str = "target";
/// Label key: a pipeline's name.
pub const TAG_PIPELINE: &str = "pipeline";
/// Label key: the pipeline step a run ended at.
pub const TAG_STEP: &str = "step";
