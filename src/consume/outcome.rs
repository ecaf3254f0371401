//! What a handler returns, and the handler trait.

use std::fmt;
use std::time::Duration;

use crate::envelope::Message;
use crate::error::BoxError;

/// What to do with a message once its handler has run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: acknowledge it.
    Accept,
    /// Try again later: a copy with `x-acemq-attempt` + 1 goes to the retry queue for `delay`
    /// (the policy's ladder when `None`); after the last attempt it goes to `{queue}.dlq`.
    Retry {
        /// How long to wait; `None` uses the retry policy's ladder.
        delay: Option<Duration>,
        /// Why (written to `x-acemq-error`).
        reason: String,
    },
    /// It can never succeed: a copy goes to `{queue}.dlq` with the reason.
    Reject {
        /// Why (written to `x-acemq-error`).
        reason: String,
    },
    /// Set it aside for a person: a copy goes to `{queue}.parked` with the reason.
    Park {
        /// Why (written to `x-acemq-error`).
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
    /// [`Outcome::Retry`] on the policy's ladder.
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

    /// The `outcome` label of `acemq.consume.total`.
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

/// An error that retrying cannot fix: a handler returning it (as the `Err` of its result)
/// rejects the message to `{queue}.dlq` at once, without spending the retry ladder.
#[derive(Debug)]
pub struct FatalError(pub BoxError);

impl FatalError {
    /// Wraps any error (or a message) as fatal.
    pub fn new(error: impl Into<BoxError>) -> FatalError {
        FatalError(error.into())
    }
}

impl fmt::Display for FatalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for FatalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.0.as_ref())
    }
}

/// What a handler returns: an [`Outcome`], or an error. An `Err` is a retry, unless it is a
/// [`FatalError`], which is a reject.
pub type HandlerResult = Result<Outcome, BoxError>;

/// Handles one message. Any `Fn(&Message) -> HandlerResult` is a handler.
///
/// A handler runs on a worker thread and may run on several at once: it needs `Sync` (and, for
/// a consumer that runs on its own threads, `Send + 'static`).
pub trait Handler {
    /// Handles one message.
    fn handle(&self, message: &Message) -> HandlerResult;
}

impl<F> Handler for F
where
    F: Fn(&Message) -> HandlerResult,
{
    fn handle(&self, message: &Message) -> HandlerResult {
        self(message)
    }
}

/// Turns what a handler produced into an outcome.
pub(crate) fn decide(result: std::thread::Result<HandlerResult>) -> (Outcome, Option<String>) {
    match result {
        Ok(Ok(outcome)) => {
            let error = match &outcome {
                Outcome::Retry { reason, .. }
                | Outcome::Reject { reason }
                | Outcome::Park { reason } => Some(reason.clone()),
                _ => None,
            };
            (outcome, error)
        }
        Ok(Err(e)) => match e.downcast::<FatalError>() {
            Ok(fatal) => {
                let reason = format!("fatal: {fatal}");
                (Outcome::reject(reason.clone()), Some(reason))
            }
            Err(e) => {
                let reason = format!("handler error: {e}");
                (Outcome::retry(reason.clone()), Some(reason))
            }
        },
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string payload".into());
            let reason = format!("handler panicked: {what}");
            (Outcome::retry(reason.clone()), Some(reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_retry_fatal_rejects_panics_retry() {
        let (o, _) = decide(Ok(Err("boom".into())));
        assert_eq!(o.label(), "retry");
        let (o, e) = decide(Ok(Err(Box::new(FatalError::new("bad input")))));
        assert_eq!(o.label(), "reject");
        assert!(e.unwrap().contains("bad input"));
        let panic = std::panic::catch_unwind(|| -> HandlerResult { panic!("oops") });
        let (o, e) = decide(panic);
        assert_eq!(o.label(), "retry");
        assert!(e.unwrap().contains("oops"));
    }
}
