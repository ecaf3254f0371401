//! Pipelines: a consumer does its step and publishes what comes out to the next one, carrying
//! the correlation forward, so that a whole run can be followed from any message in it.
//!
//! ```no_run
//! use acemq_amqp::patterns::pipeline::{then, Next, NOTHING};
//! use acemq_amqp::{Connection, Message};
//! use serde_json::{json, Value};
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://127.0.0.1")?;
//! let publisher = connection.publisher()?;
//! let validate = then(publisher, "", "orders.ship", |m: &Message| {
//!     let order: Value = m.payload()?;
//!     if order["digital"] == json!(true) {
//!         return Ok(NOTHING); // nothing to ship: accepted, nothing published
//!     }
//!     Ok(Next::Publish(json!({ "order_id": order["order_id"] })))
//! });
//! let running = connection.consume("orders.validate", validate)?;
//! # running.close()?; Ok(()) }
//! ```
//!
//! # What is promised
//!
//! * The step returns [`Next::Publish`] (a value, encoded with the publisher's codec),
//!   [`Next::Message`] (a message built by the step), or [`NOTHING`] (publish nothing and
//!   accept: "this one does not continue", without inventing an empty message for the next
//!   service).
//! * The published message carries the consumed message's **correlation id** forward
//!   (`x-acemq-correlation`; the consumed id when it had none) and the consumed message's **id as
//!   its causation id** (`x-acemq-causation`), whatever the step set.
//! * The consumed message is accepted only after the next one is **confirmed and routed**: the
//!   publish is mandatory and waits for the broker's confirm. An unroutable next hop (no queue
//!   bound), a nack, a lost connection or a timeout is a **retry of the step** (the consumer's
//!   retry policy, then `{queue}.dlq`) with the error
//!   `acemq: the work for message {id} is done but the next message did not go out: …`; the
//!   consumed message is not acknowledged before that copy is out. An `Err` from the step is a
//!   retry as from any handler (a [`FatalError`](crate::FatalError) a reject).
//! * The next message's id is **derived** from the consumed message's id and the destination
//!   for [`Next::Publish`], so a step that runs again (a retry, a redelivery after a crash
//!   between the confirm and the ack) publishes the same id, and an
//!   [`idempotent`](fn@crate::patterns::idempotent::idempotent) consumer of the next hop sees the duplicate for
//!   what it is. A [`Next::Message`] keeps the id the step gave it.
//!
//! Since a failed publish runs the step again, **a step that changes anything (a database, an
//! e-mail) should be idempotent**.
//!
//! # The family's run metrics
//!
//! A step given names with [`Then::named`] reports each run that ends at it to the connection's
//! observer ([`Observer::pipeline_run`](crate::observe::Observer::pipeline_run):
//! `acemq.pipeline.run.total` and `.duration`, labels `pipeline`, `step`, `outcome`): a run ends
//! `ended_early` at a step that returns [`NOTHING`], and `completed` at the step marked
//! [`Then::last`] once its work is done (its next message, if any, confirmed). Each service
//! names its own steps, so the pipeline's name is what ties its steps' series together.

use crate::consume::{Handler, HandlerResult, Outcome};
use crate::envelope::{now_ms, Message};
use crate::error::{BoxError, Result};
use crate::observe::{PipelineOutcome, PipelineRun};
use crate::publish::Publisher;

/// What a pipeline step produces.
#[derive(Clone, Debug)]
pub enum Next {
    /// Publish this value onwards, encoded with the publisher's codec.
    Publish(serde_json::Value),
    /// Publish this message onwards (its correlation and causation are set by [`then`]); boxed
    /// because a message is large (`Next::Message(Box::new(m))`).
    Message(Box<Message>),
    /// Publish nothing and accept the consumed message.
    Nothing,
}

/// "This message does not continue": publish nothing, accept it.
pub const NOTHING: Next = Next::Nothing;

impl Next {
    /// [`Next::Publish`] of any serialisable value.
    ///
    /// # Errors
    ///
    /// [`Error::Codec`](crate::Error::Codec) when it cannot be turned into JSON.
    pub fn publish<T: serde::Serialize + ?Sized>(value: &T) -> Result<Next> {
        serde_json::to_value(value)
            .map(Next::Publish)
            .map_err(|e| crate::Error::Codec {
                content_type: "application/json".into(),
                source: Box::new(e),
            })
    }
}

/// A pipeline step: runs `step` on each consumed message and publishes what it produces to
/// `exchange` with `routing_key` (see the [module docs](self)).
pub fn then<F>(
    publisher: Publisher,
    exchange: impl Into<String>,
    routing_key: impl Into<String>,
    step: F,
) -> Then<F>
where
    F: Fn(&Message) -> std::result::Result<Next, BoxError>,
{
    Then {
        publisher,
        exchange: exchange.into(),
        routing_key: routing_key.into(),
        step,
        names: None,
        last: false,
    }
}

/// A pipeline step, made by [`then`].
pub struct Then<F> {
    publisher: Publisher,
    exchange: String,
    routing_key: String,
    step: F,
    /// The pipeline's and the step's names, for the run metrics.
    names: Option<(String, String)>,
    last: bool,
}

impl<F> std::fmt::Debug for Then<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Then")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("names", &self.names)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl<F> Then<F> {
    /// Names this step `step` of the pipeline `pipeline`: a run that ends here is reported to
    /// the connection's observer under these names (see the [module docs](self#the-familys-run-metrics)).
    /// Without names, nothing is reported.
    pub fn named(mut self, pipeline: impl Into<String>, step: impl Into<String>) -> Then<F> {
        self.names = Some((pipeline.into(), step.into()));
        self
    }

    /// Marks this step the pipeline's last: a run whose work is done here is `completed` (and
    /// one that returns [`NOTHING`] here too), where at any other step [`NOTHING`] ends it
    /// `ended_early`. Reported only for a step given [`named`](Self::named).
    pub fn last(mut self) -> Then<F> {
        self.last = true;
        self
    }

    /// Reports a run of `consumed` that ended here, if this step has names.
    fn ended(&self, consumed: &Message, outcome: PipelineOutcome) {
        let Some((pipeline, step)) = &self.names else {
            return;
        };
        let age_ms = u64::try_from(now_ms().saturating_sub(consumed.envelope.first_seen_ms));
        self.publisher.observer().pipeline_run(&PipelineRun {
            pipeline,
            step,
            outcome,
            duration: std::time::Duration::from_millis(age_ms.unwrap_or(0)),
        });
    }

    /// The message to publish for what the step produced.
    fn next_message(&self, consumed: &Message, next: Next) -> Result<Option<Message>> {
        let message = match next {
            Next::Nothing => return Ok(None),
            Next::Message(m) => *m,
            Next::Publish(value) => Message::encode(self.publisher.codec().as_ref(), &value)?
                .with_id(derived_id(consumed.id(), &self.exchange, &self.routing_key)),
        };
        let correlation = consumed
            .envelope
            .correlation_id
            .clone()
            .unwrap_or_else(|| consumed.id().to_string());
        Ok(Some(
            message
                .with_correlation_id(correlation)
                .with_causation_id(consumed.id().to_string()),
        ))
    }
}

impl<F> Handler for Then<F>
where
    F: Fn(&Message) -> std::result::Result<Next, BoxError>,
{
    fn handle(&self, m: &Message) -> HandlerResult {
        let next = (self.step)(m)?;
        let Some(message) = self.next_message(m, next)? else {
            let outcome = if self.last {
                PipelineOutcome::Completed
            } else {
                PipelineOutcome::EndedEarly
            };
            self.ended(m, outcome);
            return Ok(Outcome::Accept);
        };
        match self
            .publisher
            .publish_routed(&self.exchange, &self.routing_key, message)
        {
            Ok(()) => {
                if self.last {
                    self.ended(m, PipelineOutcome::Completed);
                }
                Ok(Outcome::Accept)
            }
            Err(e) => Ok(Outcome::retry(format!(
                "acemq: the work for message {} is done but the next message did not go out: {e}",
                m.id()
            ))),
        }
    }
}

/// The id of the message a step publishes for `consumed` to `exchange`/`routing_key`: the same
/// every time the step runs for that message, in the UUID form (version 8) the family's readers
/// expect.
fn derived_id(consumed: &str, exchange: &str, routing_key: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in ["acemq-then", consumed, exchange, routing_key] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let d = h.finalize();
    crate::envelope::uuid_v8(&d)
}

#[cfg(test)]
mod tests {
    use super::derived_id;

    #[test]
    fn derived_ids_are_stable_and_differ_by_destination() {
        let a = derived_id("m-1", "", "ship");
        assert_eq!(a, derived_id("m-1", "", "ship"));
        assert_ne!(a, derived_id("m-1", "", "bill"));
        assert_ne!(a, derived_id("m-2", "", "ship"));
        assert_eq!(a.len(), 36);
    }
}
