//! [`Observer`], the default [`LogObserver`], and the guard that keeps an observer's panic off
//! the engine's threads.

use super::events::{
    ConnectionEvent, Duplicate, IdReplaced, InFlight, OutboxEvent, Overrun, PipelineRun,
    PublishEvent, PublishOutcome, Received, ReplayEvent, RequestEvent, Retried, RungMissing,
    SetAsideFailed, Settlement,
};
use super::metrics;

/// Receives events from connections, publishers and consumers. Implementations must be cheap
/// and must not block: they run on the engine's threads.
pub trait Observer: Send + Sync + 'static {
    /// A connection event.
    fn connection(&self, event: &ConnectionEvent<'_>) {
        LogObserver.connection(event)
    }

    /// A publish was answered ([`metrics::PUBLISH_TOTAL`]).
    fn published(&self, exchange: &str, outcome: PublishOutcome) {
        LogObserver.published(exchange, outcome)
    }

    /// A delivery was settled by a consumer ([`metrics::CONSUME_TOTAL`]).
    fn settled(&self, settlement: &Settlement<'_>) {
        LogObserver.settled(settlement)
    }

    /// An outbox relay event ([`metrics::OUTBOX_TOTAL`], [`metrics::OUTBOX_LAG`]).
    fn outbox(&self, event: &OutboxEvent<'_>) {
        LogObserver.outbox(event)
    }

    /// An idempotent wrapper absorbed a duplicate: it accepted a message whose key was already
    /// confirmed, without running the handler. The consumer settles it as `accept`, like a real
    /// run; this event is how an operator sees duplicates being absorbed. Reported by the
    /// wrappers given this observer ([`IdempotentOptions::observer`](crate::patterns::idempotent::IdempotentOptions::observer)).
    fn duplicate(&self, duplicate: &Duplicate<'_>) {
        LogObserver.duplicate(duplicate)
    }

    /// A request/reply round trip ended ([`metrics::REQUEST_DURATION`]), reported by a
    /// [`Requester`](crate::patterns::request_reply::Requester) on the calling thread.
    fn request(&self, event: &RequestEvent<'_>) {
        LogObserver.request(event)
    }

    /// A dead-letter replay pass made progress (every
    /// [`progress_every`](crate::patterns::replay::ReplayOptions::progress_every) messages read) or ended
    /// (`finished`), reported on the thread running it.
    fn replay(&self, event: &ReplayEvent<'_>) {
        LogObserver.replay(event)
    }
    /// A handler ran past its [`with_timeout`](crate::patterns::chain::with_timeout) deadline: its
    /// message was settled as a retry and its thread, which cannot be interrupted, runs on as an
    /// orphan. Reported by the wrapper given this observer
    /// ([`DeadlineOptions::observer`](crate::patterns::chain::DeadlineOptions::observer)).
    fn overrun(&self, overrun: &Overrun<'_>) {
        LogObserver.overrun(overrun)
    }

    /// A consumer read a message whose `x-acemq-id` it cannot carry as it came (longer than a
    /// short string, not UTF-8, not a string) and replaced it, for this attempt and every copy
    /// (the rule: [`Envelope`](crate::Envelope)'s `id`). The replacement is also logged at warn,
    /// whatever the observer.
    fn id_replaced(&self, event: &IdReplaced<'_>) {
        LogObserver.id_replaced(event)
    }

    /// A publish was answered, failed, or sent without a confirm, with its routing key and the
    /// time to its answer ([`metrics::PUBLISH_TOTAL`], [`metrics::PUBLISH_DURATION`]). Every
    /// publish the engine reports comes here; the default passes it on to
    /// [`published`](Self::published), so an observer written before this event was added
    /// hears every publish as it did.
    fn publish_answered(&self, event: &PublishEvent<'_>) {
        self.published(event.exchange, event.outcome)
    }

    /// A consumer took a delivery, before its handler runs ([`metrics::CONSUME_ATTEMPTS`],
    /// [`metrics::CONSUME_IN_FLIGHT`]), on the thread that took it.
    fn received(&self, event: &Received<'_>) {
        LogObserver.received(event)
    }

    /// A consumer's deliveries in flight after one was settled or its subscription ended
    /// ([`metrics::CONSUME_IN_FLIGHT`]), on the consumer's own thread.
    fn in_flight(&self, event: &InFlight<'_>) {
        LogObserver.in_flight(event)
    }

    /// Another attempt was scheduled: the retry copy confirmed on a rung, or the wait started
    /// in the consumer ([`metrics::RETRIED_TOTAL`] with `where`). Reported before the
    /// delivery's [`settled`](Self::settled) (`retry`).
    fn retried(&self, event: &Retried<'_>) {
        LogObserver.retried(event)
    }

    /// A retry's rung queue is missing: it waits in the consumer instead
    /// ([`metrics::RUNG_MISSING`]).
    fn rung_missing(&self, event: &RungMissing<'_>) {
        LogObserver.rung_missing(event)
    }

    /// A dead-letter or parked copy could not be published ([`metrics::SET_ASIDE_FAILED`]); the
    /// original goes back to the queue after a pause (settled `copy_failed`).
    fn set_aside_failed(&self, event: &SetAsideFailed<'_>) {
        LogObserver.set_aside_failed(event)
    }

    /// A pipeline run ended at a named step ([`metrics::PIPELINE_RUN_TOTAL`],
    /// [`metrics::PIPELINE_RUN_DURATION`]; see
    /// [`Then::named`](crate::patterns::pipeline::Then::named)).
    fn pipeline_run(&self, event: &PipelineRun<'_>) {
        LogObserver.pipeline_run(event)
    }
}

/// The default observer: logs through the `log` crate (connection events at info/warn,
/// publishes and settlements at debug/trace).
#[derive(Clone, Copy, Debug, Default)]
pub struct LogObserver;

impl Observer for LogObserver {
    fn connection(&self, event: &ConnectionEvent<'_>) {
        match event {
            ConnectionEvent::Connected {
                address,
                generation,
            } => log::info!("acemq: connected to {address} (generation {generation})"),
            ConnectionEvent::Lost { address, reason } => {
                log::warn!("acemq: connection to {address} lost: {reason}")
            }
            ConnectionEvent::ReconnectFailed {
                attempt,
                reason,
                retry_in,
            } => log::warn!(
                "acemq: reconnect attempt {attempt} failed: {reason}; retrying in {retry_in:?}"
            ),
            ConnectionEvent::RedeclareFailed { what, reason } => {
                log::error!("acemq: re-declaring {what} after reconnect failed: {reason}")
            }
            ConnectionEvent::Blocked { reason } => {
                log::warn!("acemq: broker blocked publishing: {reason}")
            }
            ConnectionEvent::Unblocked => log::info!("acemq: broker unblocked publishing"),
        }
    }

    fn published(&self, exchange: &str, outcome: PublishOutcome) {
        log::trace!(
            "{}{{exchange={exchange:?},outcome={}}}",
            metrics::PUBLISH_TOTAL,
            outcome.as_str()
        );
    }

    fn outbox(&self, event: &OutboxEvent<'_>) {
        match event {
            OutboxEvent::Published { id, lag, .. } => {
                log::trace!("acemq: outbox record {id} published, {lag:?} after its commit")
            }
            OutboxEvent::Failed {
                id,
                attempts,
                error,
                ..
            } => log::warn!("acemq: outbox record {id} failed (attempt {attempts}): {error}"),
            OutboxEvent::Backlog {
                pending,
                oldest_age,
            } => log::debug!("acemq: outbox backlog {pending}, oldest {oldest_age:?}"),
        }
    }

    fn duplicate(&self, d: &Duplicate<'_>) {
        log::debug!(
            "acemq: message {} (attempt {}) is a duplicate of key {:?}: accepted without running \
             the handler ({} duplicate(s) absorbed)",
            d.message_id,
            d.attempt,
            d.key,
            d.duplicates
        );
    }

    fn request(&self, e: &RequestEvent<'_>) {
        log::trace!(
            "{}{{routing_key={:?},outcome={}}} {:?}",
            metrics::REQUEST_DURATION,
            e.routing_key,
            e.outcome.as_str(),
            e.duration
        );
    }

    fn replay(&self, e: &ReplayEvent<'_>) {
        if e.finished {
            log::debug!("acemq: replay of {:?} ended: {}", e.report.queue, e.report);
        } else {
            log::debug!(
                "acemq: replaying {:?}: moved {}, skipped {} so far",
                e.report.queue,
                e.report.moved,
                e.report.skipped
            );
        }
    }
    fn id_replaced(&self, e: &IdReplaced<'_>) {
        // The warn line is the reader's own (`Message::from_delivery`), whatever the observer.
        log::debug!(
            "acemq: a message on {:?} is handled as {} ({})",
            e.queue,
            e.id,
            e.reason
        );
    }

    fn overrun(&self, o: &Overrun<'_>) {
        log::warn!(
            "acemq: the handler of message {} ran past its deadline of {:?}; settled as a retry, \
             its thread runs on ({} orphaned handler thread(s) now, {} overrun(s) so far)",
            o.message_id,
            o.limit,
            o.orphans,
            o.total
        );
    }

    fn received(&self, _: &Received<'_>) {}

    fn in_flight(&self, _: &InFlight<'_>) {}

    fn retried(&self, e: &Retried<'_>) {
        log::trace!(
            "acemq: message {} on {:?} retried (attempt {}) after {:?}, waiting in the {}",
            e.message_id,
            e.queue,
            e.attempt,
            e.wait,
            e.waits.as_str()
        );
    }

    fn rung_missing(&self, e: &RungMissing<'_>) {
        // The warn line is the consumer's own (`consume/ladder/copies.rs`), whatever the observer.
        log::debug!(
            "acemq: {}{{queue={:?},rung={:?}}} (message {})",
            metrics::RUNG_MISSING,
            e.queue,
            e.rung,
            e.message_id
        );
    }

    fn set_aside_failed(&self, e: &SetAsideFailed<'_>) {
        log::debug!(
            "acemq: {}{{queue={:?},target={:?}}} (message {}): {}",
            metrics::SET_ASIDE_FAILED,
            e.queue,
            e.target,
            e.message_id,
            e.error
        );
    }

    fn pipeline_run(&self, e: &PipelineRun<'_>) {
        log::trace!(
            "acemq: pipeline {:?} run ended at step {:?}: {} after {:?}",
            e.pipeline,
            e.step,
            e.outcome.as_str(),
            e.duration
        );
    }

    fn settled(&self, s: &Settlement<'_>) {
        match s.error {
            Some(error) => log::debug!(
                "acemq: {} message {} attempt {} on {:?} after {:?}: {error}",
                s.outcome,
                s.message_id,
                s.attempt,
                s.queue,
                s.handler_duration
            ),
            None => log::trace!(
                "acemq: {} message {} attempt {} on {:?} after {:?}",
                s.outcome,
                s.message_id,
                s.attempt,
                s.queue,
                s.handler_duration
            ),
        }
    }
}

/// Wraps the application's observer so that a panic in it is caught and logged, never taking an
/// engine thread (a consumer's worker, the confirm thread, the supervisor) down with it. The
/// first panic is logged at error, later ones at debug.
pub(crate) struct Guarded {
    inner: std::sync::Arc<dyn Observer>,
    panicked: std::sync::atomic::AtomicBool,
}

impl Guarded {
    pub(crate) fn wrap(inner: impl Observer) -> std::sync::Arc<dyn Observer> {
        std::sync::Arc::new(Guarded {
            inner: std::sync::Arc::new(inner),
            panicked: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn guard(&self, event: &str, f: impl FnOnce(&dyn Observer)) {
        let inner = self.inner.as_ref();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(inner))).is_err() {
            if self
                .panicked
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                log::debug!("acemq: the observer panicked again on a {event} event");
            } else {
                log::error!(
                    "acemq: the observer panicked on a {event} event; the panic was caught and \
                     the engine goes on (later panics are logged at debug)"
                );
            }
        }
    }
}

impl Observer for Guarded {
    fn connection(&self, event: &ConnectionEvent<'_>) {
        self.guard("connection", |o| o.connection(event))
    }
    fn published(&self, exchange: &str, outcome: PublishOutcome) {
        self.guard("published", |o| o.published(exchange, outcome))
    }
    fn settled(&self, settlement: &Settlement<'_>) {
        self.guard("settled", |o| o.settled(settlement))
    }
    fn outbox(&self, event: &OutboxEvent<'_>) {
        self.guard("outbox", |o| o.outbox(event))
    }
    fn duplicate(&self, duplicate: &Duplicate<'_>) {
        self.guard("duplicate", |o| o.duplicate(duplicate))
    }
    fn request(&self, event: &RequestEvent<'_>) {
        self.guard("request", |o| o.request(event))
    }
    fn replay(&self, event: &ReplayEvent<'_>) {
        self.guard("replay", |o| o.replay(event))
    }
    fn overrun(&self, overrun: &Overrun<'_>) {
        self.guard("overrun", |o| o.overrun(overrun))
    }
    fn id_replaced(&self, event: &IdReplaced<'_>) {
        self.guard("id_replaced", |o| o.id_replaced(event))
    }
    fn publish_answered(&self, event: &PublishEvent<'_>) {
        self.guard("publish_answered", |o| o.publish_answered(event))
    }
    fn received(&self, event: &Received<'_>) {
        self.guard("received", |o| o.received(event))
    }
    fn in_flight(&self, event: &InFlight<'_>) {
        self.guard("in_flight", |o| o.in_flight(event))
    }
    fn retried(&self, event: &Retried<'_>) {
        self.guard("retried", |o| o.retried(event))
    }
    fn rung_missing(&self, event: &RungMissing<'_>) {
        self.guard("rung_missing", |o| o.rung_missing(event))
    }
    fn set_aside_failed(&self, event: &SetAsideFailed<'_>) {
        self.guard("set_aside_failed", |o| o.set_aside_failed(event))
    }
    fn pipeline_run(&self, event: &PipelineRun<'_>) {
        self.guard("pipeline_run", |o| o.pipeline_run(event))
    }
}

impl<T: Observer + ?Sized> Observer for std::sync::Arc<T> {
    fn connection(&self, event: &ConnectionEvent<'_>) {
        self.as_ref().connection(event)
    }
    fn published(&self, exchange: &str, outcome: PublishOutcome) {
        self.as_ref().published(exchange, outcome)
    }
    fn settled(&self, settlement: &Settlement<'_>) {
        self.as_ref().settled(settlement)
    }
    fn outbox(&self, event: &OutboxEvent<'_>) {
        self.as_ref().outbox(event)
    }
    fn duplicate(&self, duplicate: &Duplicate<'_>) {
        self.as_ref().duplicate(duplicate)
    }
    fn request(&self, event: &RequestEvent<'_>) {
        self.as_ref().request(event)
    }
    fn replay(&self, event: &ReplayEvent<'_>) {
        self.as_ref().replay(event)
    }
    fn overrun(&self, overrun: &Overrun<'_>) {
        self.as_ref().overrun(overrun)
    }
    fn id_replaced(&self, event: &IdReplaced<'_>) {
        self.as_ref().id_replaced(event)
    }
    fn publish_answered(&self, event: &PublishEvent<'_>) {
        self.as_ref().publish_answered(event)
    }
    fn received(&self, event: &Received<'_>) {
        self.as_ref().received(event)
    }
    fn in_flight(&self, event: &InFlight<'_>) {
        self.as_ref().in_flight(event)
    }
    fn retried(&self, event: &Retried<'_>) {
        self.as_ref().retried(event)
    }
    fn rung_missing(&self, event: &RungMissing<'_>) {
        self.as_ref().rung_missing(event)
    }
    fn set_aside_failed(&self, event: &SetAsideFailed<'_>) {
        self.as_ref().set_aside_failed(event)
    }
    fn pipeline_run(&self, event: &PipelineRun<'_>) {
        self.as_ref().pipeline_run(event)
    }
}
