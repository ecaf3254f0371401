//! [`MetricsObserver`]: the family's metric names through the `metrics` crate facade.

use std::sync::Arc;

use super::events::{
    ConnectionEvent, Decision, Duplicate, IdReplaced, InFlight, OutboxEvent, Overrun, PipelineRun,
    PublishEvent, PublishOutcome, Received, ReplayEvent, RequestEvent, RequestOutcome, Retried,
    RungMissing, SetAsideFailed, Settlement,
};
use super::metrics as names;
use super::observer::{LogObserver, Observer};

/// An [`Observer`] that records what the engine does through the [`metrics`](::metrics) crate's
/// facade, under the family's names, so a service picks its exporter
/// (`metrics-exporter-prometheus`, StatsD, …) by installing a recorder. Every event is then
/// passed on to an inner observer ([`LogObserver`] unless [`with_inner`](Self::with_inner)), so
/// logging goes on as before. Give it to a connection with
/// [`ConnectionOptions::observer`](crate::ConnectionOptions::observer).
///
/// | name | kind | labels | from |
/// |---|---|---|---|
/// | `acemq.publish.total` | counter | `exchange`, `routing.key`, `outcome`: `confirmed`, `unroutable`, `failed`, `refused` (not written: the broker blocks the connection), `published` (sent without a confirm), `nacked` | every publish answered; a request, and a responder's reply to a transient reply queue, when sent (`published`), and again (`unroutable`) if the broker returns it |
/// | `acemq.publish.duration` | histogram, seconds | as above | a publish's call to its answer (not for `published`) |
/// | `acemq.consume.total` | counter | `queue`, `outcome`: `acked`, `retried`, `rejected`, `dead_lettered`, `parked`, `in_progress`, `copy_failed`, `dropped`, `lost` | every delivery settled, once |
/// | `acemq.consume.duration` | histogram, seconds | `queue`, `outcome` | the handler's run (not for `dropped`: no handler's outcome) |
/// | `acemq.consume.attempts` | histogram, attempts | `queue` | a delivery taken, before its handler |
/// | `acemq.consume.in.flight` | gauge | `queue` | a delivery taken or settled |
/// | `acemq.messages.retried.total` | counter | `queue`, `where`: `broker`, `consumer`, `requeued` (its retry copy could not be published: back on its queue as it was) | another attempt scheduled |
/// | `acemq.messages.dead.lettered.total` | counter | `queue`, `outcome`: `dead_lettered`, `parked` | a copy confirmed in `.dlq` (deliveries `rejected` and `dead_lettered`) or `.parked` |
/// | `acemq.messages.set.aside.failed` | counter | `queue`, `target` | a `.dlq` / `.parked` copy that could not be published |
/// | `acemq.retry.rung.missing` | counter | `queue`, `rung` | a retry whose rung queue is missing (it waits in the consumer) |
/// | `acemq.request.duration` | histogram, seconds | `routing.key`, `outcome`: `answered`, `responder_failed`, `timed_out`, `failed` | a request/reply round trip |
/// | `acemq.request.total` | counter | as above | |
/// | `acemq.outbox.total` | counter | `exchange`, `routing.key`, `outcome`: `published`, `failed` | a relayed record |
/// | `acemq.outbox.lag` | histogram, seconds | `exchange`, `routing.key`, `outcome` (`published`, as Go and Python write it) | a record's commit to its confirm |
/// | `acemq.outbox.pending`, `acemq.outbox.oldest.age` | gauges (count, seconds) | — | as a started relay reports its backlog ([`OutboxEvent::Backlog`](crate::observe::OutboxEvent::Backlog)) |
/// | `acemq.pipeline.run.total` | counter | `pipeline`, `step`, `outcome`: `completed`, `ended_early` | a run ending at a named step ([`Then::named`](crate::patterns::pipeline::Then::named)) |
/// | `acemq.pipeline.run.duration` | histogram, seconds | as above | |
///
/// The words are the family's (Java's `MetricNames`, Go's `telemetry.go`, Python's
/// `telemetry.py`; `tests/fixtures/metric_words.json`); this crate's [`Settlement::outcome`]
/// (`accept`, `retry`, `reject`, `dead_letter`, `park`) is mapped to theirs (`acked`, `retried`,
/// `rejected`, `dead_lettered`, `parked`), [`PublishOutcome::Unconfirmed`] is the family's
/// `published`, and the request outcome `replied` is the family's `answered`. Prometheus
/// exporters spell the names with `_` (`acemq_publish_total`, label `routing_key`). Durations
/// are in seconds, as Prometheus expects. Recording is a few hash look-ups in the installed
/// recorder: it does not block.
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

/// The family's word for a publish outcome.
fn publish_outcome(outcome: PublishOutcome) -> &'static str {
    match outcome {
        PublishOutcome::Unconfirmed => "published",
        other => other.as_str(),
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
        // The engine reports through `publish_answered`; a call made here directly is recorded
        // with an empty routing key.
        ::metrics::counter!(
            names::PUBLISH_TOTAL,
            names::TAG_EXCHANGE => exchange.to_string(),
            names::TAG_ROUTING_KEY => "",
            names::TAG_OUTCOME => publish_outcome(outcome)
        )
        .increment(1);
        self.inner.published(exchange, outcome)
    }

    fn publish_answered(&self, e: &PublishEvent<'_>) {
        let labels = [
            ::metrics::Label::new(names::TAG_EXCHANGE, e.exchange.to_string()),
            ::metrics::Label::new(names::TAG_ROUTING_KEY, e.routing_key.to_string()),
            ::metrics::Label::new(names::TAG_OUTCOME, publish_outcome(e.outcome)),
        ];
        // The count last, as for a settlement: a publish seen counted has its duration too.
        if let Some(duration) = e.duration {
            ::metrics::histogram!(names::PUBLISH_DURATION, labels.iter())
                .record(duration.as_secs_f64());
        }
        ::metrics::counter!(names::PUBLISH_TOTAL, labels.iter()).increment(1);
        self.inner.publish_answered(e)
    }

    fn received(&self, e: &Received<'_>) {
        let queue = e.queue.to_string();
        ::metrics::histogram!(names::CONSUME_ATTEMPTS, names::TAG_QUEUE => queue.clone())
            .record(f64::from(e.attempt));
        ::metrics::gauge!(names::CONSUME_IN_FLIGHT, names::TAG_QUEUE => queue)
            .set(e.in_flight as f64);
        self.inner.received(e)
    }

    fn in_flight(&self, e: &InFlight<'_>) {
        ::metrics::gauge!(names::CONSUME_IN_FLIGHT, names::TAG_QUEUE => e.queue.to_string())
            .set(e.in_flight as f64);
        self.inner.in_flight(e)
    }

    fn settled(&self, s: &Settlement<'_>) {
        let queue = s.queue.to_string();
        let outcome = s.outcome.family_word();
        // The settlement's own count last: whoever sees it counted sees the rest of this
        // settlement's series too.
        if s.outcome != Decision::Dropped {
            ::metrics::histogram!(
                names::CONSUME_DURATION,
                names::TAG_QUEUE => queue.clone(),
                names::TAG_OUTCOME => outcome
            )
            .record(s.handler_duration.as_secs_f64());
        }
        if let Some(set_aside) = s.outcome.set_aside() {
            ::metrics::counter!(
                names::DEAD_LETTERED_TOTAL,
                names::TAG_QUEUE => queue.clone(),
                names::TAG_OUTCOME => set_aside
            )
            .increment(1);
        }
        ::metrics::counter!(
            names::CONSUME_TOTAL,
            names::TAG_QUEUE => queue,
            names::TAG_OUTCOME => outcome
        )
        .increment(1);
        self.inner.settled(s)
    }

    fn retried(&self, e: &Retried<'_>) {
        ::metrics::counter!(
            names::RETRIED_TOTAL,
            names::TAG_QUEUE => e.queue.to_string(),
            names::TAG_WHERE => e.waits.as_str()
        )
        .increment(1);
        self.inner.retried(e)
    }

    fn rung_missing(&self, e: &RungMissing<'_>) {
        ::metrics::counter!(
            names::RUNG_MISSING,
            names::TAG_QUEUE => e.queue.to_string(),
            names::TAG_RUNG => e.rung.to_string()
        )
        .increment(1);
        self.inner.rung_missing(e)
    }

    fn set_aside_failed(&self, e: &SetAsideFailed<'_>) {
        ::metrics::counter!(
            names::SET_ASIDE_FAILED,
            names::TAG_QUEUE => e.queue.to_string(),
            names::TAG_TARGET => e.target.to_string()
        )
        .increment(1);
        self.inner.set_aside_failed(e)
    }

    fn outbox(&self, event: &OutboxEvent<'_>) {
        match event {
            OutboxEvent::Published {
                exchange,
                routing_key,
                lag,
                ..
            } => {
                ::metrics::counter!(
                    names::OUTBOX_TOTAL,
                    names::TAG_EXCHANGE => exchange.to_string(),
                    names::TAG_ROUTING_KEY => routing_key.to_string(),
                    names::TAG_OUTCOME => "published"
                )
                .increment(1);
                ::metrics::histogram!(
                    names::OUTBOX_LAG,
                    names::TAG_EXCHANGE => exchange.to_string(),
                    names::TAG_ROUTING_KEY => routing_key.to_string(),
                    names::TAG_OUTCOME => "published"
                )
                .record(lag.as_secs_f64());
            }
            OutboxEvent::Failed {
                exchange,
                routing_key,
                ..
            } => {
                ::metrics::counter!(
                    names::OUTBOX_TOTAL,
                    names::TAG_EXCHANGE => exchange.to_string(),
                    names::TAG_ROUTING_KEY => routing_key.to_string(),
                    names::TAG_OUTCOME => "failed"
                )
                .increment(1);
            }
            OutboxEvent::Backlog {
                pending,
                oldest_age,
            } => {
                ::metrics::gauge!(names::OUTBOX_PENDING).set(*pending as f64);
                ::metrics::gauge!(names::OUTBOX_OLDEST_AGE)
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
            names::TAG_ROUTING_KEY => e.routing_key.to_string(),
            names::TAG_OUTCOME => outcome
        )
        .record(e.duration.as_secs_f64());
        ::metrics::counter!(
            names::REQUEST_TOTAL,
            names::TAG_ROUTING_KEY => e.routing_key.to_string(),
            names::TAG_OUTCOME => outcome
        )
        .increment(1);
        self.inner.request(e)
    }

    fn replay(&self, event: &ReplayEvent<'_>) {
        self.inner.replay(event)
    }

    fn overrun(&self, overrun: &Overrun<'_>) {
        self.inner.overrun(overrun)
    }

    fn id_replaced(&self, event: &IdReplaced<'_>) {
        self.inner.id_replaced(event)
    }

    fn pipeline_run(&self, e: &PipelineRun<'_>) {
        let labels = [
            ::metrics::Label::new(names::TAG_PIPELINE, e.pipeline.to_string()),
            ::metrics::Label::new(names::TAG_STEP, e.step.to_string()),
            ::metrics::Label::new(names::TAG_OUTCOME, e.outcome.as_str()),
        ];
        ::metrics::histogram!(names::PIPELINE_RUN_DURATION, labels.iter())
            .record(e.duration.as_secs_f64());
        ::metrics::counter!(names::PIPELINE_RUN_TOTAL, labels.iter()).increment(1);
        self.inner.pipeline_run(e)
    }
}
