//! Observability: an [`Observer`] receives what the engine does; [`LogObserver`], the default,
//! writes it through the `log` crate. Payloads are never passed to an observer or logged.
//!
//! The family's metric names are the constants in [`metrics`]; an observer that feeds a metrics
//! system should use them with the labels named there. With the `metrics` feature,
//! `MetricsObserver` does exactly that through the `metrics` crate facade (its docs list every
//! name, kind and label it records).

use std::time::Duration;

#[cfg(feature = "metrics")]
mod metrics_observer;
pub(crate) mod replay_report;
#[cfg(feature = "metrics")]
pub use metrics_observer::{
    MetricsObserver, CONSUME_DURATION, DEAD_LETTERED_TOTAL, OUTBOX_OLDEST_AGE, OUTBOX_PENDING,
    REQUEST_TOTAL, RETRIED_TOTAL,
};

/// The family's metric names.
pub mod metrics {
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
}

/// How a publish ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The broker confirmed it.
    Confirmed,
    /// The broker nacked it.
    Nacked,
    /// It was returned as unroutable.
    Unroutable,
    /// The connection or channel failed before an answer.
    Failed,
    /// Handed to the broker without a publisher confirm: a
    /// [`Requester`](crate::patterns::request_reply::Requester)'s request (its reply is its confirmation), and
    /// a responder's reply to a transient reply queue, published on the request's channel just
    /// before the request's acknowledgement (see [`Responder`](crate::patterns::request_reply::Responder)).
    /// If the broker returns one (no queue for the request; the requester went away), it is
    /// reported [`Unroutable`](Self::Unroutable) as well.
    Unconfirmed,
}

impl PublishOutcome {
    /// The `outcome` label of [`metrics::PUBLISH_TOTAL`].
    pub fn as_str(self) -> &'static str {
        match self {
            PublishOutcome::Confirmed => "confirmed",
            PublishOutcome::Nacked => "nacked",
            PublishOutcome::Unroutable => "unroutable",
            PublishOutcome::Failed => "failed",
            PublishOutcome::Unconfirmed => "unconfirmed",
        }
    }
}

/// Something that happened to a connection.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ConnectionEvent<'a> {
    /// Connected (generation 1) or reconnected (later generations) to `address`.
    Connected {
        /// The address, without password.
        address: &'a str,
        /// Counts connections made by this handle, from 1.
        generation: u64,
    },
    /// The connection dropped.
    Lost {
        /// The address, without password.
        address: &'a str,
        /// Why, as amiquip reported it.
        reason: &'a str,
    },
    /// A reconnection attempt failed; the next one is in `retry_in`.
    ReconnectFailed {
        /// Attempts so far in this outage.
        attempt: u32,
        /// Why it failed.
        reason: &'a str,
        /// Delay before the next attempt.
        retry_in: Duration,
    },
    /// Re-declaring the remembered topology after a reconnect failed for one entry.
    RedeclareFailed {
        /// The entry.
        what: &'a str,
        /// Why.
        reason: &'a str,
    },
    /// The broker blocked publishing (resource alarm).
    Blocked {
        /// The broker's reason.
        reason: &'a str,
    },
    /// The broker unblocked publishing.
    Unblocked,
}

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
}

/// A foreign message id replaced as it was read (see [`Observer::id_replaced`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct IdReplaced<'a> {
    /// The queue consumed.
    pub queue: &'a str,
    /// The id the message is handled and copied with.
    pub id: &'a str,
    /// Why the id it arrived with was not used as it came.
    pub reason: &'a str,
}

/// Progress of a dead-letter replay pass (see [`Observer::replay`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReplayEvent<'a> {
    /// The report so far (its `stopped` means something only when `finished`).
    pub report: &'a replay_report::ReplayReport,
    /// True for the last event of the pass.
    pub finished: bool,
}

/// A handler that overran its deadline (see [`Observer::overrun`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Overrun<'a> {
    /// The message id.
    pub message_id: &'a str,
    /// The deadline it overran.
    pub limit: Duration,
    /// Orphaned handler threads still running now, this one included.
    pub orphans: usize,
    /// Overruns of this wrapper so far, this one included.
    pub total: u64,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestOutcome {
    /// A reply came.
    Replied,
    /// A reply came carrying the responder's failure (`acemq-error`).
    ResponderFailed,
    /// No reply in time.
    TimedOut,
    /// The request could not be sent or the connection dropped under it.
    Failed,
}

impl RequestOutcome {
    /// The `outcome` label of [`metrics::REQUEST_DURATION`].
    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Replied => "replied",
            RequestOutcome::ResponderFailed => "responder_failed",
            RequestOutcome::TimedOut => "timed_out",
            RequestOutcome::Failed => "failed",
        }
    }
}

/// One request/reply round trip (see [`Observer::request`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RequestEvent<'a> {
    /// The exchange the request was published to.
    pub exchange: &'a str,
    /// Its routing key.
    pub routing_key: &'a str,
    /// From the call to its end (publish, wait, reply).
    pub duration: Duration,
    /// How it ended.
    pub outcome: RequestOutcome,
}

/// A duplicate absorbed by an idempotent wrapper (see [`Observer::duplicate`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Duplicate<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// The delivery's attempt.
    pub attempt: u32,
    /// Duplicates absorbed by this wrapper so far, this one included.
    pub duplicates: u64,
}

/// What an outbox relay did.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum OutboxEvent<'a> {
    /// A record was published and confirmed (`acemq.outbox.total{outcome=published}`); `lag` is
    /// from its commit (`created_ms`) to the confirm (`acemq.outbox.lag`).
    Published {
        /// The record's id.
        id: i64,
        /// The exchange it was published to.
        exchange: &'a str,
        /// Its routing key.
        routing_key: &'a str,
        /// Commit to confirm.
        lag: Duration,
    },
    /// Publishing a record failed and was counted against it
    /// (`acemq.outbox.total{outcome=failed}`).
    Failed {
        /// The record's id.
        id: i64,
        /// Its failed attempts, this one included.
        attempts: i64,
        /// Why.
        error: &'a str,
    },
    /// The backlog, reported by a started relay after each sweep that found less than a full
    /// batch, and at most once a second (or once per interval, if longer) while it works
    /// through full batches; in both cases no sooner than twenty times as long as the last
    /// count took after it started (a count over a large table is slow: the gauge then costs
    /// the relay at most ~5 % of its time).
    Backlog {
        /// Records waiting (retired ones excluded).
        pending: u64,
        /// Age of the oldest waiting record.
        oldest_age: Option<Duration>,
    },
}

/// What a consumer did with one delivery.
#[derive(Clone, Debug)]
pub struct Settlement<'a> {
    /// The queue consumed.
    pub queue: &'a str,
    /// The outcome label: accept, retry, reject, park, in_progress, dropped, and with
    /// [`ConsumerOptions::at_most_once`](crate::ConsumerOptions::at_most_once) lost (the handler
    /// failed after the ack, or never ran on a delivery acknowledged after its worker stopped
    /// waiting: nothing is retried).
    pub outcome: &'a str,
    /// The delivery's attempt.
    pub attempt: u32,
    /// How long the handler ran.
    pub handler_duration: Duration,
    /// The message id.
    pub message_id: &'a str,
    /// The error that caused a retry or reject, if any.
    pub error: Option<&'a str>,
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
}
