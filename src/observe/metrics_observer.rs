//! [`MetricsObserver`]: the family's metric names through the `metrics` crate facade.

use std::sync::Arc;

use super::events::{
    ConnectionEvent, Duplicate, OutboxEvent, PublishOutcome, ReplayEvent, RequestEvent,
    RequestOutcome, Settlement,
};
use super::metrics as names;
use super::observer::{LogObserver, Observer};

/// Counter, label `queue`: retries decided (the family's standalone retry counter).
pub const RETRIED_TOTAL: &str = "acemq.messages.retried.total";
/// Counter, labels `queue` and `outcome` (`dead_lettered`, `parked`): messages set aside.
pub const DEAD_LETTERED_TOTAL: &str = "acemq.messages.dead.lettered.total";
/// Histogram in seconds, labels `queue` and `outcome`: how long the handler ran.
pub const CONSUME_DURATION: &str = "acemq.consume.duration";
/// Counter, label `outcome`: request/reply round trips.
pub const REQUEST_TOTAL: &str = "acemq.request.total";
/// Gauge: outbox records waiting to be published, after a relay's last sweep (this crate's
/// name; the family has none).
pub const OUTBOX_PENDING: &str = "acemq.outbox.pending";
/// Gauge in seconds: age of the oldest waiting outbox record, after a relay's last sweep, 0
/// when none waits (this crate's name; the family has none).
pub const OUTBOX_OLDEST_AGE: &str = "acemq.outbox.oldest.age";

/// An [`Observer`] that records what the engine does through the [`metrics`](::metrics) crate's
/// facade, under the family's names, so a service picks its exporter
/// (`metrics-exporter-prometheus`, StatsD, …) by installing a recorder. Every event is then
/// passed on to an inner observer ([`LogObserver`] unless [`with_inner`](Self::with_inner)), so
/// logging goes on as before. Give it to a connection with
/// [`ConnectionOptions::observer`](crate::ConnectionOptions::observer).
///
/// | name | kind | labels | from |
/// |---|---|---|---|
/// | `acemq.publish.total` | counter | `exchange`, `outcome`: `confirmed`, `nacked`, `unroutable`, `failed`, `unconfirmed` | every publish answered; a request, and a responder's reply to a transient reply queue, when sent (`unconfirmed`), and again (`unroutable`) if the broker returns it |
/// | `acemq.consume.total` | counter | `queue`, `outcome`: `acked`, `retried`, `rejected`, `parked`, `in_progress`, `dropped` | every delivery settled |
/// | `acemq.consume.duration` | histogram, seconds | `queue`, `outcome` | the handler's run |
/// | `acemq.messages.retried.total` | counter | `queue` | a retry decided |
/// | `acemq.messages.dead.lettered.total` | counter | `queue`, `outcome`: `dead_lettered`, `parked` | a copy to `.dlq` / `.parked` |
/// | `acemq.request.duration` | histogram, seconds | `routing.key`, `outcome`: `answered`, `responder_failed`, `timed_out`, `failed` | a request/reply round trip |
/// | `acemq.request.total` | counter | as above | |
/// | `acemq.outbox.total` | counter | `outcome`: `published`, `failed` | a relayed record |
/// | `acemq.outbox.lag` | histogram, seconds | `exchange`, `routing.key` (the family's) | a record's commit to its confirm |
/// | `acemq.outbox.pending`, `acemq.outbox.oldest.age` | gauges (count, seconds) | — | as a started relay reports its backlog ([`OutboxEvent::Backlog`](crate::observe::OutboxEvent::Backlog)) |
///
/// The consume outcomes are the family's words (Java, .NET and Python tag `acemq.consume.total`
/// with `acked`, `retried`, `rejected`, `parked`); this crate's
/// [`Settlement::outcome`] (`accept`, `retry`, `reject`, `park`) is mapped to them, and a
/// `reject` (the handler's, or retries exhausted: both go to `.dlq`) also counts
/// `acemq.messages.dead.lettered.total{outcome=dead_lettered}`. The request outcome `replied` is
/// the family's `answered`. Prometheus exporters spell the names with `_` (`acemq_publish_total`,
/// label `routing_key`). Durations are in seconds, as Prometheus expects. Recording is a few
/// hash look-ups in the installed recorder: it does not block.
#[derive(Clone)]
pub struct MetricsObserver {
    inner: Arc<dyn Observer>,
}

impl std::fmt::Debug for MetricsObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsObserver").finish_non_exhaustive()
    }
}

impl Default for MetricsObserver {
    fn default() -> Self {
        MetricsObserver::new()
    }
}

impl MetricsObserver {
    /// Records metrics, then logs every event as [`LogObserver`] does.
    pub fn new() -> MetricsObserver {
        MetricsObserver {
            inner: Arc::new(LogObserver),
        }
    }

    /// Records metrics, then passes every event on to `inner`.
    pub fn with_inner(inner: impl Observer) -> MetricsObserver {
        MetricsObserver {
            inner: Arc::new(inner),
        }
    }
}

/// The family's word for a consume outcome.
fn consume_outcome(label: &str) -> &str {
    match label {
        "accept" => "acked",
        "retry" => "retried",
        "reject" => "rejected",
        "park" => "parked",
        other => other,
    }
}

fn request_outcome(outcome: RequestOutcome) -> &'static str {
    match outcome {
        RequestOutcome::Replied => "answered",
        other => other.as_str(),
    }
}

impl Observer for MetricsObserver {
    fn connection(&self, event: &ConnectionEvent<'_>) {
        self.inner.connection(event)
    }

    fn published(&self, exchange: &str, outcome: PublishOutcome) {
        ::metrics::counter!(
            names::PUBLISH_TOTAL,
            "exchange" => exchange.to_string(),
            "outcome" => outcome.as_str()
        )
        .increment(1);
        self.inner.published(exchange, outcome)
    }

    fn settled(&self, s: &Settlement<'_>) {
        let queue = s.queue.to_string();
        let outcome = consume_outcome(s.outcome).to_string();
        ::metrics::counter!(
            names::CONSUME_TOTAL,
            "queue" => queue.clone(),
            "outcome" => outcome.clone()
        )
        .increment(1);
        ::metrics::histogram!(
            CONSUME_DURATION,
            "queue" => queue.clone(),
            "outcome" => outcome
        )
        .record(s.handler_duration.as_secs_f64());
        match s.outcome {
            "retry" => ::metrics::counter!(RETRIED_TOTAL, "queue" => queue).increment(1),
            "reject" => ::metrics::counter!(
                DEAD_LETTERED_TOTAL,
                "queue" => queue,
                "outcome" => "dead_lettered"
            )
            .increment(1),
            "park" => ::metrics::counter!(
                DEAD_LETTERED_TOTAL,
                "queue" => queue,
                "outcome" => "parked"
            )
            .increment(1),
            _ => {}
        }
        self.inner.settled(s)
    }

    fn outbox(&self, event: &OutboxEvent<'_>) {
        match event {
            OutboxEvent::Published {
                exchange,
                routing_key,
                lag,
                ..
            } => {
                ::metrics::counter!(names::OUTBOX_TOTAL, "outcome" => "published").increment(1);
                ::metrics::histogram!(
                    names::OUTBOX_LAG,
                    "exchange" => exchange.to_string(),
                    "routing.key" => routing_key.to_string()
                )
                .record(lag.as_secs_f64());
            }
            OutboxEvent::Failed { .. } => {
                ::metrics::counter!(names::OUTBOX_TOTAL, "outcome" => "failed").increment(1);
            }
            OutboxEvent::Backlog {
                pending,
                oldest_age,
            } => {
                ::metrics::gauge!(OUTBOX_PENDING).set(*pending as f64);
                ::metrics::gauge!(OUTBOX_OLDEST_AGE)
                    .set(oldest_age.map_or(0.0, |a| a.as_secs_f64()));
            }
        }
        self.inner.outbox(event)
    }

    fn duplicate(&self, duplicate: &Duplicate<'_>) {
        self.inner.duplicate(duplicate)
    }

    fn request(&self, e: &RequestEvent<'_>) {
        let outcome = request_outcome(e.outcome);
        ::metrics::histogram!(
            names::REQUEST_DURATION,
            "routing.key" => e.routing_key.to_string(),
            "outcome" => outcome
        )
        .record(e.duration.as_secs_f64());
        ::metrics::counter!(
            REQUEST_TOTAL,
            "routing.key" => e.routing_key.to_string(),
            "outcome" => outcome
        )
        .increment(1);
        self.inner.request(e)
    }

    fn replay(&self, event: &ReplayEvent<'_>) {
        self.inner.replay(event)
    }
}
