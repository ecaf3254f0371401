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
    /// Declined before anything was written: the broker blocks the connection (a memory or
    /// disk alarm) and the publish found no room within its timeout
    /// ([`Error::Blocked`](crate::Error::Blocked)). The family's `refused`, told apart from
    /// `failed`.
    Refused,
    /// Handed to the broker without a publisher confirm: every publish of a
    /// [`Publisher`](crate::Publisher) made with
    /// [`PublisherOptions::confirms`](crate::PublisherOptions::confirms)`(false)` (at most once),
    /// a [`Requester`](crate::patterns::request_reply::Requester)'s request (its reply is its confirmation), and
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
            PublishOutcome::Refused => "refused",
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
    /// A record was published and confirmed
    /// (`acemq.outbox.total{exchange,routing.key,outcome=published}`); `lag` is
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
    /// (`acemq.outbox.total{exchange,routing.key,outcome=failed}`).
    Failed {
        /// The record's id.
        id: i64,
        /// The exchange it was to be published to.
        exchange: &'a str,
        /// Its routing key.
        routing_key: &'a str,
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
    /// What the consumer did with the delivery (see [`Decision`]). It compares with its label
    /// (`s.outcome == "accept"`).
    pub outcome: Decision,
    /// The delivery's attempt.
    pub attempt: u32,
    /// How long the handler ran.
    pub handler_duration: Duration,
    /// The message id.
    pub message_id: &'a str,
    /// The error that caused a retry or reject, if any.
    pub error: Option<&'a str>,
}

/// What a consumer did with a delivery: the one typed outcome its observer, its metrics
/// ([`MetricsObserver`](super::MetricsObserver): `acemq.consume.total`'s `outcome`) and its
/// trace read. [`as_str`](Self::as_str) is this crate's label, [`family_word`](Self::family_word)
/// the family's metric and span word. It compares equal to its label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Decision {
    /// Acknowledged (`accept`; the family's `acked`).
    Accept,
    /// Another attempt scheduled (`retry`; `retried`).
    Retry,
    /// The handler's own reject — a [`FatalError`](crate::FatalError),
    /// [`Outcome::reject`](crate::Outcome::reject) or a body that cannot be read — dead-lettered
    /// (`reject`; `rejected`).
    Reject,
    /// The consumer's decision to dead-letter: no attempt or age left for a retry, or a held
    /// retry that can never be published (`dead_letter`; `dead_lettered`).
    DeadLetter,
    /// Set aside in `{queue}.parked` (`park`; `parked`).
    Park,
    /// Back later with its attempt unchanged (`in_progress`).
    InProgress,
    /// The copy its outcome needs could not be published: the original goes back to the queue
    /// after a pause (`copy_failed`).
    CopyFailed,
    /// An outcome from before a reconnect, dropped: the broker redelivers the message
    /// (`dropped`).
    Dropped,
    /// With [`ConsumerOptions::at_most_once`](crate::ConsumerOptions::at_most_once): the handler
    /// failed after the ack, or never ran on a delivery acknowledged after its worker stopped
    /// waiting; nothing is retried (`lost`).
    Lost,
}

impl Decision {
    /// This crate's label: `accept`, `retry`, `reject`, `dead_letter`, `park`, `in_progress`,
    /// `copy_failed`, `dropped`, `lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Accept => "accept",
            Decision::Retry => "retry",
            Decision::Reject => "reject",
            Decision::DeadLetter => "dead_letter",
            Decision::Park => "park",
            Decision::InProgress => "in_progress",
            Decision::CopyFailed => "copy_failed",
            Decision::Dropped => "dropped",
            Decision::Lost => "lost",
        }
    }

    /// The family's word (Java's `MetricNames`, Python's `tracing.py`): `acked`, `retried`,
    /// `rejected` (the handler's own), `dead_lettered` (the consumer's), `parked`; the others as
    /// [`as_str`](Self::as_str).
    pub fn family_word(self) -> &'static str {
        match self {
            Decision::Accept => "acked",
            Decision::Retry => "retried",
            Decision::Reject => "rejected",
            Decision::DeadLetter => "dead_lettered",
            Decision::Park => "parked",
            other => other.as_str(),
        }
    }

    /// Whether it put a copy in `{queue}.dlq` (`Reject`, `DeadLetter`) or `{queue}.parked`
    /// (`Park`): the family's `acemq.messages.dead.lettered.total` word, `dead_lettered` or
    /// `parked`.
    pub fn set_aside(self) -> Option<&'static str> {
        match self {
            Decision::Reject | Decision::DeadLetter => Some("dead_lettered"),
            Decision::Park => Some("parked"),
            _ => None,
        }
    }
}

impl std::fmt::Display for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Decision {
    fn eq(&self, label: &&str) -> bool {
        self.as_str() == *label
    }
}

impl PartialEq<str> for Decision {
    fn eq(&self, label: &str) -> bool {
        self.as_str() == label
    }
}

/// A publish answered (or failed, or sent without a confirm), with where it went and how long
/// its answer took (see [`Observer::publish_answered`](super::Observer::publish_answered)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PublishEvent<'a> {
    /// The exchange it was published to (`""`: the default exchange).
    pub exchange: &'a str,
    /// Its routing key (through the default exchange: the queue's name).
    pub routing_key: &'a str,
    /// How it ended.
    pub outcome: PublishOutcome,
    /// From the call to the broker's answer (`acemq.publish.duration`); `None` for a publish
    /// that no answer is waited for ([`PublishOutcome::Unconfirmed`], a return read later).
    pub duration: Option<Duration>,
}

/// A delivery taken by a consumer, before its handler runs (see
/// [`Observer::received`](super::Observer::received)): the family samples the attempt here,
/// on the way in, so a delivery whose handler never returns is still counted.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Received<'a> {
    /// The queue consumed.
    pub queue: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// The delivery's attempt, from 1 (`acemq.consume.attempts`).
    pub attempt: u32,
    /// Deliveries of this consumer taken and not yet settled, this one included
    /// (`acemq.consume.in.flight`).
    pub in_flight: usize,
}

/// A consumer's count of deliveries in flight after one was settled, or after its subscription
/// ended (see [`Observer::in_flight`](super::Observer::in_flight)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct InFlight<'a> {
    /// The queue consumed.
    pub queue: &'a str,
    /// Deliveries taken and not yet settled (`acemq.consume.in.flight`).
    pub in_flight: usize,
}

/// Where a retry spends its wait (the family's `where` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryWhere {
    /// On one of the queue's retry rungs (`{queue}.retry.{rung}`): the copy is confirmed there
    /// and the original acknowledged.
    Broker,
    /// In the consumer: the original held unacknowledged while the wait runs (a wait shorter
    /// than the policy's broker threshold, a missing rung, a retry that keeps its ordering key),
    /// or none at all (a retry with no wait goes straight back to the queue).
    Consumer,
    /// Back on its own queue as it was (same attempt), after its retry copy could not be
    /// published: the family's `requeued` (Python's, for a republish that failed).
    Requeued,
}

impl RetryWhere {
    /// The `where` label of [`metrics::RETRIED_TOTAL`](super::metrics::RETRIED_TOTAL):
    /// `broker`, `consumer` or `requeued`.
    pub fn as_str(self) -> &'static str {
        match self {
            RetryWhere::Broker => "broker",
            RetryWhere::Consumer => "consumer",
            RetryWhere::Requeued => "requeued",
        }
    }
}

/// Another attempt scheduled for a message (see [`Observer::retried`](super::Observer::retried)):
/// its copy confirmed on a rung, or its wait started in the consumer.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Retried<'a> {
    /// The queue consumed.
    pub queue: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// The attempt the retry will be.
    pub attempt: u32,
    /// How long it waits first.
    pub wait: Duration,
    /// Where the wait is spent.
    pub waits: RetryWhere,
}

/// A retry long enough for a broker rung found the rung's queue missing and waits in the
/// consumer instead (see [`Observer::rung_missing`](super::Observer::rung_missing)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RungMissing<'a> {
    /// The queue consumed.
    pub queue: &'a str,
    /// The rung queue that is missing (`{queue}.retry.{rung}`).
    pub rung: &'a str,
    /// The message id.
    pub message_id: &'a str,
}

/// A message's dead-letter or parked copy could not be published (see
/// [`Observer::set_aside_failed`](super::Observer::set_aside_failed)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SetAsideFailed<'a> {
    /// The queue consumed.
    pub queue: &'a str,
    /// Where the copy was going: `{queue}.dlq` or `{queue}.parked`.
    pub target: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// Why.
    pub error: &'a str,
}

/// How a pipeline run ended at a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PipelineOutcome {
    /// The step marked last ([`Then::last`](crate::patterns::pipeline::Then::last)) did its
    /// work (and its next message, if any, was confirmed).
    Completed,
    /// A step returned [`NOTHING`](crate::patterns::pipeline::NOTHING): the run does not go on.
    EndedEarly,
}

impl PipelineOutcome {
    /// The `outcome` label of [`metrics::PIPELINE_RUN_TOTAL`](super::metrics::PIPELINE_RUN_TOTAL).
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineOutcome::Completed => "completed",
            PipelineOutcome::EndedEarly => "ended_early",
        }
    }
}

/// A pipeline run ended (see [`Observer::pipeline_run`](super::Observer::pipeline_run)).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PipelineRun<'a> {
    /// The pipeline's name.
    pub pipeline: &'a str,
    /// The step it ended at.
    pub step: &'a str,
    /// How it ended.
    pub outcome: PipelineOutcome,
    /// How long the message the step consumed had existed when the run ended: from its first
    /// consumption (`x-acemq-first-seen`, which its retries keep) to the end of the step.
    pub duration: Duration,
}

#[cfg(test)]
mod tests {
    use super::Decision;

    /// The one mapping every reader uses: this crate's label, the family's word (metrics, spans)
    /// and where a copy was set aside, for each decision.
    #[test]
    fn each_decision_has_its_label_its_family_word_and_its_set_aside() {
        for (d, label, word, aside) in [
            (Decision::Accept, "accept", "acked", None),
            (Decision::Retry, "retry", "retried", None),
            (
                Decision::Reject,
                "reject",
                "rejected",
                Some("dead_lettered"),
            ),
            (
                Decision::DeadLetter,
                "dead_letter",
                "dead_lettered",
                Some("dead_lettered"),
            ),
            (Decision::Park, "park", "parked", Some("parked")),
            (Decision::InProgress, "in_progress", "in_progress", None),
            (Decision::CopyFailed, "copy_failed", "copy_failed", None),
            (Decision::Dropped, "dropped", "dropped", None),
            (Decision::Lost, "lost", "lost", None),
        ] {
            assert_eq!(d.as_str(), label);
            assert_eq!(d, label, "compares with its label");
            assert_eq!(d.to_string(), label);
            assert_eq!(d.family_word(), word, "{label}");
            assert_eq!(d.set_aside(), aside, "{label}");
        }
    }
}
