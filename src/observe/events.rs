//! What an [`Observer`](super::Observer) hears: the events, plain data borrowed for the call.

use std::time::Duration;

use super::replay_report;

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
    /// The `outcome` label of [`metrics::PUBLISH_TOTAL`](super::metrics::PUBLISH_TOTAL).
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

/// A foreign message id replaced as it was read (see [`Observer::id_replaced`](super::Observer::id_replaced)).
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

/// Progress of a dead-letter replay pass (see [`Observer::replay`](super::Observer::replay)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReplayEvent<'a> {
    /// The report so far (its `stopped` means something only when `finished`).
    pub report: &'a replay_report::ReplayReport,
    /// True for the last event of the pass.
    pub finished: bool,
}

/// A handler that overran its deadline (see [`Observer::overrun`](super::Observer::overrun)).
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
    /// The `outcome` label of [`metrics::REQUEST_DURATION`](super::metrics::REQUEST_DURATION).
    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Replied => "replied",
            RequestOutcome::ResponderFailed => "responder_failed",
            RequestOutcome::TimedOut => "timed_out",
            RequestOutcome::Failed => "failed",
        }
    }
}

/// One request/reply round trip (see [`Observer::request`](super::Observer::request)).
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

/// A duplicate absorbed by an idempotent wrapper (see [`Observer::duplicate`](super::Observer::duplicate)).
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
