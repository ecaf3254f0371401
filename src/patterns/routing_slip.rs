//! Routing slips: the itinerary travels with the message; each step does its part and sends it
//! on to the next stop written on the slip.
//!
//! ```no_run
//! use acemq_amqp::{Connection, ConsumerOptions, Message};
//! use acemq_amqp::patterns::routing_slip::{follow_slip, start, RoutingSlip};
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! let publisher = connection.publisher()?;
//! let slip = RoutingSlip::new()
//!     .then("", "orders.validate", "validate")
//!     .then("", "orders.charge", "charge");
//! start(&publisher, slip, Message::new(r#"{"order":"o-1"}"#)).send()?;
//!
//! // In the service behind `orders.validate`: run the step, and the message goes on.
//! let running = connection
//!     .consumer("orders.validate", ConsumerOptions::new())?
//!     .start(follow_slip(&publisher, |m: &Message| {
//!         // … validate m …; Ok(None) sends the payload on unchanged, Ok(Some(m)) a new one.
//!         Ok(None)
//!     }))?;
//! # running.close()?; Ok(()) }
//! ```
//!
//! # The two wire forms (both read, exactly as the family writes them)
//!
//! **JSON** (the default, self-describing; Go, Python and Ruby write it): the application
//! header `acemq-routing-slip` (a long string) holds
//!
//! ```text
//! {"steps":[{"exchange":"orders","routingKey":"order.charge","name":"charge"}],"done":[{"exchange":"orders","routingKey":"order.validate","name":"validate","completedAt":"2026-11-30T14:12:36Z"}]}
//! ```
//!
//! `steps` are the stops still to do, the first being the one the message is at now; `done`
//! the completed ones, oldest first. Each step has `exchange` (`""` = the default exchange) and
//! `routingKey`, and optionally `name` and `completedAt` (RFC 3339, UTC, whole seconds; written
//! as the step is completed). This crate writes the keys in that order, compact, omits `name`
//! and `completedAt` when unset and always writes `done`; it reads any JSON with that shape
//! (extra keys ignored; a missing or null string is empty; `done` may be missing; `steps`
//! missing is an empty, finished slip).
//!
//! **Declared** (the Java library's `Pipeline`): three reserved headers carry only names —
//! `x-acemq-route` = every step name, done and to do, comma-separated (`validate,charge,ship`),
//! `x-acemq-route-position` = a 32-bit integer, 0-based, the step the message is at (past the
//! end = finished; unreadable or negative = 0), `x-acemq-route-id` = the run's id (a fresh one
//! is written when a message arrives without one). Where a step goes is resolved by the reader:
//! with [`FollowSlip::pipeline`]`("fulfilment")` the exchange is `fulfilment`, the routing key
//! the step name and the queue behind it `fulfilment.{step}` (see [`route_queue`]); without a
//! pipeline, step names are routing keys on the default exchange (queue = step name). The
//! route headers are engine headers: they are kept on retry, dead-letter and parked copies and
//! on a replay, so a replayed dead letter resumes its route.
//!
//! [`route_of`] and [`SlipStart::form`]`(SlipForm::StepNames)` write the declared form; a slip
//! that cannot be said in it — steps on two exchanges, a step with no name, a name that is not
//! its routing key, a name with a comma — is refused where it is built
//! ([`RoutingSlip::with_form`], [`route_of`], and `send` before anything is published).
//!
//! # Reading, following
//!
//! * [`slip_from`]: `Ok(None)` when the message carries no slip; `Err(FatalError)` when it
//!   carries one that cannot be read (so a handler returning it dead-letters the message at
//!   once: it will not parse on the next attempt either); the JSON form first when both are
//!   present.
//! * [`follow_slip`] is a [`Handler`]: it reads the slip (unreadable or missing → fatal,
//!   dead-lettered), runs the step (an `Err` is a retry, a [`FatalError`] a reject, as for any
//!   handler), then publishes the step's payload — the one it returned, or the received body
//!   and content type unchanged — to the next stop, **mandatory, with a confirm**, and accepts
//!   only once that hop is routed and confirmed; a hop that fails (no queue bound there, the
//!   broker refusing it, the connection lost) is a retry of this step. After the last step it
//!   just accepts. It writes back the form it read. The onward message carries the received
//!   correlation id, causation = the received message's id, and an id derived from the received
//!   id and the slip's position, so a step run twice (a redelivery) sends the same id onward
//!   and an idempotent next step sees a duplicate.
//! * A message whose slip is already finished when it arrives is accepted without running the
//!   step (logged at warn).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::consume::{Handler, HandlerResult, Outcome};
use crate::envelope::{check_name, headers, new_id, HeaderValue, Message};
use crate::error::FatalError;
use crate::error::{BoxError, Error, Result};
use crate::publish::Publisher;

/// Which wire form a slip is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SlipForm {
    /// The JSON slip in `acemq-routing-slip`. The default.
    #[default]
    Json,
    /// The declared route: `x-acemq-route`, `x-acemq-route-position`, `x-acemq-route-id`.
    StepNames,
}

/// One stop on a slip.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlipStep {
    /// Where the message for this step is published (`""`: the default exchange).
    pub exchange: String,
    /// With what routing key.
    #[serde(rename = "routingKey")]
    pub routing_key: String,
    /// The step's name, for people (and the declared form).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// When it was completed (RFC 3339), set as the slip advances past it.
    #[serde(rename = "completedAt", skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
}

impl fmt::Display for SlipStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => f.write_str(n),
            None => write!(f, "{}/{}", self.exchange, self.routing_key),
        }
    }
}

/// A slip as read: every field forgiving.
#[derive(Deserialize)]
struct WireSlip {
    #[serde(default)]
    steps: Option<Vec<WireStep>>,
    #[serde(default)]
    done: Option<Vec<WireStep>>,
}

#[derive(Deserialize)]
struct WireStep {
    #[serde(default)]
    exchange: Option<String>,
    #[serde(default, rename = "routingKey")]
    routing_key: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "completedAt")]
    completed_at: Option<String>,
}

impl From<WireStep> for SlipStep {
    fn from(w: WireStep) -> SlipStep {
        SlipStep {
            exchange: w.exchange.unwrap_or_default(),
            routing_key: w.routing_key.unwrap_or_default(),
            name: w.name.filter(|n| !n.is_empty()),
            completed_at: w.completed_at.filter(|c| !c.is_empty()),
        }
    }
}

/// An itinerary: the stops still to do and the ones done. Immutable: [`then`](Self::then) and
/// [`advance`](Self::advance) return a new slip.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RoutingSlip {
    steps: Vec<SlipStep>,
    done: Vec<SlipStep>,
    form: SlipForm,
    route_id: Option<String>,
}

impl RoutingSlip {
    /// An empty slip, written as JSON.
    pub fn new() -> RoutingSlip {
        RoutingSlip::default()
    }

    /// A slip with one more stop at the end: publish to `exchange` with `routing_key`; `name`
    /// is for people (`""` for none).
    pub fn then(
        &self,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        name: impl Into<String>,
    ) -> RoutingSlip {
        let mut next = self.clone();
        let name = name.into();
        next.steps.push(SlipStep {
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            name: Some(name).filter(|n| !n.is_empty()),
            completed_at: None,
        });
        next
    }

    /// A slip with the current stop moved to [`done`](Self::done), stamped with now. A finished
    /// slip stays as it is.
    pub fn advance(&self) -> RoutingSlip {
        let mut next = self.clone();
        if !next.steps.is_empty() {
            let mut step = next.steps.remove(0);
            step.completed_at = Some(super::replay::rfc3339_now());
            next.done.push(step);
        }
        next
    }

    /// The stop the message is at (before [`advance`](Self::advance)) or going to (after), if any.
    pub fn next(&self) -> Option<&SlipStep> {
        self.steps.first()
    }

    /// The stops still to do, in order.
    pub fn remaining(&self) -> &[SlipStep] {
        &self.steps
    }

    /// The completed stops, oldest first.
    pub fn done(&self) -> &[SlipStep] {
        &self.done
    }

    /// True when no stop is left.
    pub fn is_finished(&self) -> bool {
        self.steps.is_empty()
    }

    /// The form it is written in.
    pub fn form(&self) -> SlipForm {
        self.form
    }

    /// The run id of a declared route (none for a JSON slip: that form has no field for it).
    pub fn route_id(&self) -> Option<&str> {
        self.route_id.as_deref()
    }

    /// This slip, to be written in `form`. The declared form gets a fresh run id if it has none.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the steps cannot be said in the declared form: no steps,
    /// steps on more than one exchange, a step without a name (and routing key), a name that is
    /// not its routing key, a name with a comma.
    pub fn with_form(&self, form: SlipForm) -> Result<RoutingSlip> {
        let mut next = self.clone();
        next.form = form;
        if form == SlipForm::StepNames {
            next.step_names()?;
            if next.route_id.is_none() {
                next.route_id = Some(new_id());
            }
        }
        Ok(next)
    }

    /// The JSON form (whatever form the slip is written in).
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            steps: &'a [SlipStep],
            done: &'a [SlipStep],
        }
        // Strings and optional strings only: serialising cannot fail.
        serde_json::to_string(&Out {
            steps: &self.steps,
            done: &self.done,
        })
        .unwrap_or_default()
    }

    /// Reads the JSON form.
    ///
    /// # Errors
    ///
    /// [`FatalError`] when `json` is not a slip.
    pub fn from_json(json: &str) -> Result<RoutingSlip, FatalError> {
        let wire: WireSlip = serde_json::from_str(json).map_err(|e| {
            FatalError::new(format!(
                "the routing slip cannot be read ({e}): {json:.200}"
            ))
        })?;
        Ok(RoutingSlip {
            steps: wire
                .steps
                .unwrap_or_default()
                .into_iter()
                .map(Into::into)
                .collect(),
            done: wire
                .done
                .unwrap_or_default()
                .into_iter()
                .map(Into::into)
                .collect(),
            form: SlipForm::Json,
            route_id: None,
        })
    }

    /// Every step name, done and to do, for the declared form.
    fn step_names(&self) -> Result<Vec<String>> {
        let every: Vec<&SlipStep> = self.done.iter().chain(&self.steps).collect();
        if every.is_empty() {
            return Err(Error::invalid("the routing slip has no steps"));
        }
        let exchange = &every[0].exchange;
        let mut names = Vec::with_capacity(every.len());
        for step in every.iter().copied() {
            if step.exchange != *exchange {
                return Err(Error::invalid(format!(
                    "a declared route is one exchange, but these steps use {exchange:?} and \
                     {:?}; write this slip as JSON",
                    step.exchange
                )));
            }
            let name = step.name.as_deref().unwrap_or(&step.routing_key);
            if name.is_empty() {
                return Err(Error::invalid(
                    "a declared route carries step names only, and a step has neither a name \
                     nor a routing key",
                ));
            }
            if name != step.routing_key {
                return Err(Error::invalid(format!(
                    "step {name:?} is published with routing key {:?}, and in a declared route \
                     the name is the routing key; write this slip as JSON",
                    step.routing_key
                )));
            }
            if name.contains(',') {
                return Err(Error::invalid(format!(
                    "step name {name:?} contains a comma, which separates the steps of a \
                     declared route"
                )));
            }
            names.push(name.to_string());
        }
        Ok(names)
    }

    /// Writes the slip onto `message` in its form, removing the other form.
    fn write_onto(&self, message: &mut Message) -> Result<()> {
        match self.form {
            SlipForm::Json => {
                for h in [headers::ROUTE, headers::ROUTE_POSITION, headers::ROUTE_ID] {
                    message.engine_headers.remove(h);
                }
                message.headers.insert(
                    headers::ROUTING_SLIP.into(),
                    HeaderValue::Text(self.to_json()),
                );
            }
            SlipForm::StepNames => {
                let names = self.step_names()?;
                message.headers.remove(headers::ROUTING_SLIP);
                let e = &mut message.engine_headers;
                e.insert(headers::ROUTE.into(), HeaderValue::Text(names.join(",")));
                e.insert(
                    headers::ROUTE_POSITION.into(),
                    HeaderValue::Int(i64::try_from(self.done.len()).unwrap_or(i64::MAX)),
                );
                let id = self.route_id.clone().unwrap_or_else(new_id);
                e.insert(headers::ROUTE_ID.into(), HeaderValue::Text(id));
            }
        }
        Ok(())
    }

    /// A declared slip read without a pipeline, resolved against `pipeline` (`""`: the default
    /// exchange).
    fn resolved(mut self, pipeline: &str) -> RoutingSlip {
        if self.form == SlipForm::StepNames {
            for s in self.steps.iter_mut().chain(self.done.iter_mut()) {
                s.exchange = pipeline.to_string();
            }
        }
        self
    }
}

impl fmt::Display for RoutingSlip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |steps: &[SlipStep]| {
            steps
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(" -> ")
        };
        write!(
            f,
            "RoutingSlip[done: {} | next: {}]",
            join(&self.done),
            join(&self.steps)
        )
    }
}

/// A declared route at its first step: exchange `pipeline` (`""` for the default exchange),
/// each step's name its routing key, written in [`SlipForm::StepNames`] with a fresh run id.
///
/// # Errors
///
/// [`Error::InvalidArgument`] for no steps or a name that is empty or has a comma;
/// [`Error::InvalidName`] for a pipeline or step name over 255 bytes.
pub fn route_of(pipeline: &str, steps: &[&str]) -> Result<RoutingSlip> {
    check_name("exchange", pipeline, true)?;
    let mut slip = RoutingSlip::new();
    for s in steps {
        check_name("routing key", s, false)?;
        slip = slip.then(pipeline, *s, *s);
    }
    slip.with_form(SlipForm::StepNames)
}

/// The queue behind step `step` of declared pipeline `pipeline`: `{pipeline}.{step}` (the
/// step name itself without a pipeline), as the Java library lays it out.
pub fn route_queue(pipeline: &str, step: &str) -> String {
    if pipeline.is_empty() {
        step.to_string()
    } else {
        format!("{pipeline}.{step}")
    }
}

/// Reads the slip a message carries, in either form (JSON first when both are present).
/// Steps of a declared route come back on the default exchange, their names as routing keys.
///
/// # Errors
///
/// [`FatalError`] when the message carries a slip that cannot be read.
pub fn slip_from(message: &Message) -> Result<Option<RoutingSlip>, FatalError> {
    if let Some(raw) = message.headers.get(headers::ROUTING_SLIP) {
        let text = match raw {
            HeaderValue::Text(s) => s.clone(),
            HeaderValue::Bytes(b) => String::from_utf8(b.clone()).map_err(|_| {
                FatalError::new(format!(
                    "the routing slip on message {} is not UTF-8",
                    message.id()
                ))
            })?,
            other => {
                return Err(FatalError::new(format!(
                    "the routing slip on message {} is not text: {other:?}",
                    message.id()
                )))
            }
        };
        if !text.is_empty() {
            return RoutingSlip::from_json(&text)
                .map(Some)
                .map_err(|e| FatalError::new(format!("message {}: {e}", message.id())));
        }
    }
    let text = |name: &str| match message.engine_headers.get(name) {
        Some(HeaderValue::Text(s)) => Some(s.clone()),
        Some(HeaderValue::Bytes(b)) => String::from_utf8(b.clone()).ok(),
        _ => None,
    };
    let Some(route) = text(headers::ROUTE).filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let names: Vec<&str> = route.split(',').map(str::trim).collect();
    if names.iter().any(|n| n.is_empty()) {
        return Err(FatalError::new(format!(
            "the declared route on message {} has an empty step name: {route:?}",
            message.id()
        )));
    }
    let position = match message.engine_headers.get(headers::ROUTE_POSITION) {
        Some(HeaderValue::Int(i)) => *i,
        Some(HeaderValue::Text(s)) => s.trim().parse().unwrap_or(0),
        Some(HeaderValue::Bytes(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0),
        _ => 0,
    };
    let at = usize::try_from(position.max(0))
        .unwrap_or(usize::MAX)
        .min(names.len());
    let step = |n: &str| SlipStep {
        exchange: String::new(),
        routing_key: n.to_string(),
        name: Some(n.to_string()),
        completed_at: None,
    };
    Ok(Some(RoutingSlip {
        done: names[..at].iter().map(|n| step(n)).collect(),
        steps: names[at..].iter().map(|n| step(n)).collect(),
        form: SlipForm::StepNames,
        route_id: text(headers::ROUTE_ID).filter(|r| !r.is_empty()),
    }))
}

/// Sends a payload to a slip's first stop: see [`start`].
#[must_use = "nothing is published until send() is called"]
#[derive(Debug)]
pub struct SlipStart<'p> {
    publisher: &'p Publisher,
    slip: RoutingSlip,
    message: Message,
    form: Option<SlipForm>,
}

/// Starts `slip` with `payload`: [`SlipStart::send`] publishes it to the first stop (mandatory,
/// confirmed) carrying the slip in its form (JSON unless the slip is declared, or
/// [`SlipStart::form`] says otherwise).
pub fn start<'p>(
    publisher: &'p Publisher,
    slip: RoutingSlip,
    payload: impl Into<Message>,
) -> SlipStart<'p> {
    SlipStart {
        publisher,
        slip,
        message: payload.into(),
        form: None,
    }
}

impl SlipStart<'_> {
    /// Writes the slip in this form. Defaults to the slip's own.
    pub fn form(mut self, form: SlipForm) -> Self {
        self.form = Some(form);
        self
    }

    /// Publishes to the first stop and waits for the confirm.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a slip without steps or one that cannot be said in the
    /// form asked for (nothing is published); the publisher's errors ([`Error::Unroutable`]
    /// when nothing is bound at the first stop, …).
    pub fn send(self) -> Result<()> {
        let slip = match self.form {
            Some(form) => self.slip.with_form(form)?,
            None => self.slip,
        };
        let Some(first) = slip.next().cloned() else {
            return Err(Error::invalid("the routing slip has no steps"));
        };
        let mut message = self.message;
        slip.write_onto(&mut message)?;
        self.publisher
            .publish_routed(&first.exchange, &first.routing_key, message)
    }
}

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
/// a handler that follows the slip: see the [module docs](self).
pub fn follow_slip<F>(publisher: &Publisher, step: F) -> FollowSlip<F>
where
    F: Fn(&Message) -> Result<Option<Message>, BoxError>,
{
    FollowSlip {
        publisher: publisher.clone(),
        step,
        pipeline: None,
    }
}

impl<F> FollowSlip<F> {
    /// Resolves a declared route's step names against this pipeline: exchange `pipeline`,
    /// routing key the step name. Defaults to none: step names are routing keys on the default
    /// exchange. A JSON slip carries its own exchanges and is not affected.
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
        if onward.envelope.message_type.is_none() {
            onward.envelope.message_type = message.envelope.message_type.clone();
        }
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
fn hop_id(received: &str, position: usize) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(format!("acemq-routing-slip\n{received}\n{position}").as_bytes());
    crate::envelope::uuid_v8(&d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_form_is_exactly_the_familys() {
        let slip = RoutingSlip::new()
            .then("orders", "order.validate", "validate")
            .then("", "order.charge", "");
        assert_eq!(
            slip.to_json(),
            r#"{"steps":[{"exchange":"orders","routingKey":"order.validate","name":"validate"},{"exchange":"","routingKey":"order.charge"}],"done":[]}"#
        );
        let advanced = slip.advance();
        let json = advanced.to_json();
        assert!(json.starts_with(
            r#"{"steps":[{"exchange":"","routingKey":"order.charge"}],"done":[{"exchange":"orders","routingKey":"order.validate","name":"validate","completedAt":""#
        ), "{json}");
        assert_eq!(RoutingSlip::from_json(&json).unwrap(), advanced);
    }

    #[test]
    fn another_librarys_slip_reads() {
        // Python's json.dumps spacing, Go's omitted `done`, nulls, extra keys.
        let py = r#"{"steps": [{"exchange": "x", "routingKey": "a", "name": "a"}], "done": [{"exchange": "x", "routingKey": "z", "completedAt": "2026-01-02T03:04:05.123456+00:00"}]}"#;
        let s = RoutingSlip::from_json(py).unwrap();
        assert_eq!(s.next().unwrap().routing_key, "a");
        assert_eq!(s.done().len(), 1);
        let go = r#"{"steps":[{"exchange":"x","routingKey":"a","name":null,"extra":1}]}"#;
        let s = RoutingSlip::from_json(go).unwrap();
        assert!(s.done().is_empty() && s.next().unwrap().name.is_none());
        assert!(RoutingSlip::from_json("{not json").is_err());
        assert!(RoutingSlip::from_json(r#"{"steps":"nope"}"#).is_err());
    }

    #[test]
    fn the_declared_form_refuses_what_it_cannot_say() {
        let two = RoutingSlip::new().then("a", "s", "s").then("b", "t", "t");
        assert!(two.with_form(SlipForm::StepNames).is_err());
        let unnamed = RoutingSlip::new().then("a", "", "");
        assert!(unnamed.with_form(SlipForm::StepNames).is_err());
        let differs = RoutingSlip::new().then("a", "key", "name");
        assert!(differs.with_form(SlipForm::StepNames).is_err());
        assert!(route_of("p", &["a,b"]).is_err());
        assert!(route_of("p", &[]).is_err());
        let ok = route_of("p", &["a", "b"]).unwrap();
        assert_eq!(ok.form(), SlipForm::StepNames);
        assert!(ok.route_id().is_some());
    }

    #[test]
    fn the_declared_form_round_trips_through_a_message() {
        let slip = route_of("p", &["a", "b", "c"]).unwrap().advance();
        let mut m = Message::new("x");
        slip.write_onto(&mut m).unwrap();
        assert_eq!(
            m.engine_header(headers::ROUTE),
            Some(&HeaderValue::Text("a,b,c".into()))
        );
        assert_eq!(
            m.engine_header(headers::ROUTE_POSITION),
            Some(&HeaderValue::Int(1))
        );
        let read = slip_from(&m).unwrap().unwrap().resolved("p");
        assert_eq!(read.next().unwrap().routing_key, "b");
        assert_eq!(read.done().len(), 1);
        assert_eq!(read.route_id(), slip.route_id());
        // Past the end is finished; JSON wins when both are there.
        m.engine_headers
            .insert(headers::ROUTE_POSITION.into(), HeaderValue::Int(7));
        assert!(slip_from(&m).unwrap().unwrap().is_finished());
        m.headers.insert(
            headers::ROUTING_SLIP.into(),
            HeaderValue::Text(RoutingSlip::new().then("j", "k", "").to_json()),
        );
        assert_eq!(slip_from(&m).unwrap().unwrap().form(), SlipForm::Json);
    }

    #[test]
    fn hop_ids_are_stable_and_differ_per_position() {
        assert_eq!(hop_id("m", 1), hop_id("m", 1));
        assert_ne!(hop_id("m", 1), hop_id("m", 2));
        assert_eq!(hop_id("m", 1).len(), 36);
    }
}
