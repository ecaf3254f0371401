//! [`FollowSlip`]: the handler that runs one step and sends the message on.

use std::fmt;

use super::slip::SlipForm;
use super::wire::slip_from;
use crate::consume::{Handler, HandlerResult, Outcome};
use crate::envelope::{new_id, Message};
use crate::error::BoxError;
use crate::error::FatalError;
use crate::publish::Publisher;

/// A [`Handler`] that runs one step of a slip and sends the message on: see [`follow_slip`].
pub struct FollowSlip<F> {
    publisher: Publisher,
    step: F,
    pipeline: Option<String>,
}

impl<F> fmt::Debug for FollowSlip<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FollowSlip")
            .field("pipeline", &self.pipeline)
            .finish()
    }
}

/// Wraps `step` (which returns the payload to send on: `None` = the received one unchanged) as
/// a handler that follows the slip: see the [module docs](super).
pub fn follow_slip<F>(publisher: &Publisher, step: F, options: FollowSlipOptions) -> FollowSlip<F>
where
    F: Fn(&Message) -> Result<Option<Message>, BoxError>,
{
    FollowSlip {
        publisher: publisher.clone(),
        step,
        pipeline: options.pipeline,
    }
}

/// Options for [`follow_slip`].
#[derive(Clone, Debug, Default)]
pub struct FollowSlipOptions {
    pipeline: Option<String>,
}

impl FollowSlipOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Resolves a declared route's step names against this pipeline: exchange `pipeline`,
    /// routing key the step name. Defaults to none: step names are routing keys on the default
    /// exchange. A JSON slip carries its own exchanges and is not affected.
    #[must_use]
    pub fn pipeline(mut self, pipeline: impl Into<String>) -> Self {
        self.pipeline = Some(pipeline.into());
        self
    }
}

impl<F> Handler for FollowSlip<F>
where
    F: Fn(&Message) -> Result<Option<Message>, BoxError>,
{
    fn handle(&self, message: &Message) -> HandlerResult {
        let slip = match slip_from(message)? {
            Some(slip) => slip.resolved(self.pipeline.as_deref().unwrap_or("")),
            None => {
                return Err(FatalError::new(format!(
                    "message {} has no routing slip, so there is nowhere to send it next",
                    message.id()
                ))
                .into())
            }
        };
        if slip.is_finished() {
            log::warn!(
                "acemq: message {} arrived with a finished routing slip ({slip}); accepted \
                 without running a step",
                message.id()
            );
            return Ok(Outcome::Accept);
        }
        let out = (self.step)(message)?;
        let advanced = slip.advance();
        let Some(next) = advanced.next().cloned() else {
            return Ok(Outcome::Accept);
        };
        let mut onward = match out {
            Some(m) => m,
            None => {
                let mut m = Message::new(message.body.clone());
                m.content_type = message.content_type.clone();
                m
            }
        };
        onward.envelope.id = hop_id(message.id(), advanced.done().len());
        onward.envelope.correlation_id = Some(
            message
                .envelope
                .correlation_id
                .clone()
                .unwrap_or_else(|| message.id().to_string()),
        );
        onward.envelope.causation_id = Some(message.id().to_string());
        // A step that names no type sends it on typed with the next stop's routing key (the
        // publisher's default), as Go's and Python's slips do; not with the type it received.
        let mut advanced = advanced;
        if advanced.form == SlipForm::StepNames && advanced.route_id.is_none() {
            advanced.route_id = Some(new_id());
        }
        advanced
            .write_onto(&mut onward)
            .map_err(|e| FatalError::new(e.to_string()))?;
        match self
            .publisher
            .publish_routed(&next.exchange, &next.routing_key, onward)
        {
            Ok(()) => Ok(Outcome::Accept),
            Err(e) => Ok(Outcome::retry(format!(
                "the step is done but the next stop {next} ({:?}/{:?}) did not take the \
                 message: {e}",
                next.exchange, next.routing_key
            ))),
        }
    }
}

/// The id of the message sent on from `received` at `position`: the same every time the step
/// runs for that message, so a redelivered step sends a duplicate an idempotent consumer knows.
pub(super) fn hop_id(received: &str, position: usize) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(format!("acemq-routing-slip\n{received}\n{position}").as_bytes());
    crate::envelope::uuid_v8(&d)
}
