//! What a handler returns: [`Outcome`] and [`HandlerResult`]. Plain data in the base layer, so
//! that the consume interceptors' trait (`intercept.rs`), which returns one, can be held typed by
//! the connection's options; the handler trait and the consumer's verdicts are in `consume/`.

use std::time::Duration;

use crate::error::BoxError;

/// What to do with a message once its handler has run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: acknowledge it.
    Accept,
    /// Try again later: a copy with `x-acemq-attempt` + 1 comes back after `delay` (the
    /// policy's wait when `None`) — held in the consumer under the broker-wait threshold, on a
    /// rung at or over it; after the last attempt (or past the age limit) it goes to
    /// `{queue}.dlq`.
    Retry {
        /// How long to wait; `None` uses the retry policy's schedule.
        delay: Option<Duration>,
        /// Why (written to `x-acemq-error`).
        reason: String,
    },
    /// It can never succeed: a copy goes to `{queue}.dlq` with the reason.
    Reject {
        /// Why (written to `x-acemq-error` as `the handler rejected it: {reason}`).
        reason: String,
    },
    /// Set it aside for a person: a copy goes to `{queue}.parked` with the reason.
    Park {
        /// Why (written to `x-acemq-error` as `the handler parked it: {reason}`).
        reason: String,
    },
    /// Someone else is working on it: put it back after `delay` with its attempt unchanged. It is
    /// never dead-lettered for this.
    InProgress {
        /// How long to wait before it comes back.
        delay: Duration,
    },
}

impl Outcome {
    /// [`Outcome::Retry`] after the policy's wait.
    pub fn retry(reason: impl Into<String>) -> Outcome {
        Outcome::Retry {
            delay: None,
            reason: reason.into(),
        }
    }

    /// [`Outcome::Retry`] after `delay`.
    pub fn retry_after(delay: Duration, reason: impl Into<String>) -> Outcome {
        Outcome::Retry {
            delay: Some(delay),
            reason: reason.into(),
        }
    }

    /// [`Outcome::Reject`].
    pub fn reject(reason: impl Into<String>) -> Outcome {
        Outcome::Reject {
            reason: reason.into(),
        }
    }

    /// [`Outcome::Park`].
    pub fn park(reason: impl Into<String>) -> Outcome {
        Outcome::Park {
            reason: reason.into(),
        }
    }

    /// [`Outcome::InProgress`].
    pub fn in_progress(delay: Duration) -> Outcome {
        Outcome::InProgress { delay }
    }

    /// The [`Settlement::outcome`](crate::observe::Settlement::outcome) a handler's outcome
    /// settles with (`MetricsObserver` writes the family's word for it on
    /// `acemq.consume.total`: `acked`, `retried`, `rejected`, `parked`, `in_progress`).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Accept => "accept",
            Outcome::Retry { .. } => "retry",
            Outcome::Reject { .. } => "reject",
            Outcome::Park { .. } => "park",
            Outcome::InProgress { .. } => "in_progress",
        }
    }
}

/// What a handler returns: an [`Outcome`], or an error. An `Err` (or a panic) is a failed
/// attempt: retried while the consumer's retry policy allows another, then dead-lettered to
/// `{queue}.dlq` with its reason. The default policy, [`RetryPolicy::none`](crate::RetryPolicy::none)
/// (one attempt, as in the family), allows none, so by default an `Err` is dead-lettered at
/// once. A [`FatalError`](crate::FatalError) is never retried: it is a reject.
pub type HandlerResult = Result<Outcome, BoxError>;
