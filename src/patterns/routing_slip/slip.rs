//! The slip itself: its steps, its form, advancing it; the declared route's names.

use std::fmt;

use serde::Serialize;

use crate::envelope::{check_name, new_id};
use crate::error::{Error, Result};

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

/// An itinerary: the stops still to do and the ones done. Immutable: [`then`](Self::then) and
/// [`advance`](Self::advance) return a new slip.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RoutingSlip {
    pub(super) steps: Vec<SlipStep>,
    pub(super) done: Vec<SlipStep>,
    pub(super) form: SlipForm,
    pub(super) route_id: Option<String>,
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
            step.completed_at = Some(crate::patterns::replay::rfc3339_now());
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

    /// Every step name, done and to do, for the declared form.
    pub(super) fn step_names(&self) -> Result<Vec<String>> {
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
