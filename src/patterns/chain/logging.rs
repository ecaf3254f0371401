//! The logging layer: [`Logged`], one line per message, never the payload.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use super::layer::{Layer, Ran};
use crate::consume::{Handler, HandlerResult, OrderBy, Outcome};
use crate::envelope::Message;

/// The logging layer: [`Logged`] around the rest of the chain.
pub fn with_logging() -> Layer {
    Layer::new(|inner| Box::new(Logged::new(inner)))
}

/// Logs id, type, attempt, outcome and duration of each message its handler handles, never the
/// payload (see the [module docs](crate::patterns::chain#with_logging)).
pub struct Logged<H> {
    handler: H,
}

impl<H> Logged<H> {
    /// Wraps `handler`.
    pub fn new(handler: H) -> Self {
        Logged { handler }
    }
}

impl<H: Handler> Handler for Logged<H> {
    fn handle(&self, m: &Message) -> HandlerResult {
        let started = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| self.handler.handle(m)));
        log_line(m, started.elapsed(), &result);
        match result {
            Ok(r) => r,
            Err(panic) => resume_unwind(panic),
        }
    }

    fn ordering(&self) -> Option<&OrderBy> {
        self.handler.ordering()
    }

    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.handler.batch_limits()
    }

    /// One line per message of the batch, each with the batch's duration.
    fn handle_batch(&self, messages: &[&Message]) -> Vec<Ran> {
        let started = Instant::now();
        let results = catch_unwind(AssertUnwindSafe(|| self.handler.handle_batch(messages)));
        let took = started.elapsed();
        match &results {
            Ok(results) => {
                for (m, result) in messages.iter().zip(results) {
                    log_line(m, took, result);
                }
            }
            Err(panic) => {
                for m in messages {
                    log_panic(m, took, &**panic);
                }
            }
        }
        match results {
            Ok(results) => results,
            Err(panic) => resume_unwind(panic),
        }
    }
}

/// The logging layer's line for one message.
fn log_line(m: &Message, took: Duration, result: &Ran) {
    let kind = m.envelope.message_type.as_deref().unwrap_or("-");
    let attempt = m.envelope.attempt;
    match result {
        Ok(Ok(outcome)) => {
            let (label, reason) = describe(outcome);
            log::info!(
                "acemq: message {} type={kind} attempt={attempt} took={took:?} outcome={label}{}",
                m.id(),
                reason.map(|r| format!(": {r}")).unwrap_or_default()
            );
        }
        Ok(Err(e)) => log::warn!(
            "acemq: message {} type={kind} attempt={attempt} took={took:?} outcome=error: {e}",
            m.id()
        ),
        Err(panic) => log_panic(m, took, &**panic),
    }
}

fn log_panic(m: &Message, took: Duration, panic: &(dyn Any + Send)) {
    let kind = m.envelope.message_type.as_deref().unwrap_or("-");
    log::warn!(
        "acemq: message {} type={kind} attempt={} took={took:?} outcome=panic: {}",
        m.id(),
        m.envelope.attempt,
        crate::error::panic_message(panic)
    );
}

/// An outcome's label and the reason it carries.
fn describe(outcome: &Outcome) -> (&'static str, Option<String>) {
    let reason = match outcome {
        Outcome::Accept => None,
        Outcome::Retry { reason, .. } | Outcome::Reject { reason } | Outcome::Park { reason } => {
            Some(reason.clone())
        }
        Outcome::InProgress { delay } => Some(format!("back in {delay:?}")),
    };
    (outcome.label(), reason)
}
