//! Sagas: a sequence of steps, each with a compensation that undoes it, run in order; when a
//! step fails, the compensations of the steps already completed run in reverse order.
//!
//! ```
//! use acemq_amqp::patterns::saga::Saga;
//!
//! struct Order { id: String }
//!
//! let saga = Saga::new("place-order")
//!     .step(
//!         "reserve-stock",
//!         |o: &Order| -> Result<(), std::io::Error> { Ok(()) },
//!         |o: &Order| -> Result<(), std::io::Error> { Ok(()) },
//!     )
//!     .step_without_compensation("send-email", |o: &Order| -> Result<(), std::io::Error> {
//!         Ok(())
//!     })
//!     .step(
//!         "charge-card",
//!         |o: &Order| -> Result<(), String> { Err(format!("card declined for {}", o.id)) },
//!         |o: &Order| -> Result<(), String> { Ok(()) },
//!     );
//! let report = saga.run(&Order { id: "o-1".into() });
//! assert!(!report.succeeded());
//! assert_eq!(report.failed().unwrap().step, "charge-card");
//! // reserve-stock was undone; send-email has no compensation and was skipped.
//! assert_eq!(report.compensated(), ["reserve-stock"]);
//! assert_eq!(report.skipped(), ["send-email"]);
//! assert!(!report.has_unresolved());
//! ```
//!
//! # What is promised
//!
//! * [`Saga::run`] never returns an error and never panics because of a step: it returns a
//!   [`SagaReport`] — the steps completed (in order), the step that failed and its error, the
//!   compensations run (in the order they ran: reverse), the completed steps without a
//!   compensation (skipped), and the steps whose compensation failed ([`SagaReport::unresolved`],
//!   [`SagaReport::has_unresolved`]).
//! * A step or a compensation that **panics** is a failure with the error text
//!   `panic: <message>`, caught on the caller's thread; the caller does not crash.
//! * A failing compensation does **not** stop the others: every completed step's compensation
//!   is tried once. Each unresolved step is logged at error (`log`), with the saga's name and the
//!   failure, because something is left half done that a person has to look at.
//! * Nothing here touches a broker: a step publishes, calls a service or writes a table as the
//!   application decides. A compensation should be idempotent; a saga does not retry.
//! * The failed step itself is not compensated: it is taken to have had no effect.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{panic_message, BoxError};

type Action<I> = Box<dyn Fn(&I) -> Result<(), BoxError> + Send + Sync>;

struct SagaStep<I> {
    name: String,
    action: Action<I>,
    compensation: Option<Action<I>>,
}

/// A saga over input `I`: steps run in order on the calling thread. `Send + Sync`, so one saga
/// may be shared and run by many threads at once (each run has its own report).
pub struct Saga<I> {
    name: String,
    steps: Vec<SagaStep<I>>,
}

impl<I> fmt::Debug for Saga<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let steps: Vec<_> = self
            .steps
            .iter()
            .map(|s| (s.name.as_str(), s.compensation.is_some()))
            .collect();
        f.debug_struct("Saga")
            .field("name", &self.name)
            .field("steps", &steps)
            .finish()
    }
}

fn boxed<I, E, F>(f: F) -> Action<I>
where
    F: Fn(&I) -> Result<(), E> + Send + Sync + 'static,
    E: Into<BoxError>,
{
    Box::new(move |input: &I| f(input).map_err(Into::into))
}

impl<I> Saga<I> {
    /// A saga with no steps; `name` is for the report and the logs.
    pub fn new(name: impl Into<String>) -> Saga<I> {
        Saga {
            name: name.into(),
            steps: Vec::new(),
        }
    }

    /// Adds a step and the compensation that undoes it.
    pub fn step<E1, E2>(
        mut self,
        name: impl Into<String>,
        action: impl Fn(&I) -> Result<(), E1> + Send + Sync + 'static,
        compensation: impl Fn(&I) -> Result<(), E2> + Send + Sync + 'static,
    ) -> Saga<I>
    where
        E1: Into<BoxError>,
        E2: Into<BoxError>,
    {
        self.steps.push(SagaStep {
            name: name.into(),
            action: boxed(action),
            compensation: Some(boxed(compensation)),
        });
        self
    }

    /// Adds a step that nothing undoes (sending a notification, say): when a later step fails it
    /// is listed in [`SagaReport::skipped`].
    pub fn step_without_compensation<E>(
        mut self,
        name: impl Into<String>,
        action: impl Fn(&I) -> Result<(), E> + Send + Sync + 'static,
    ) -> Saga<I>
    where
        E: Into<BoxError>,
    {
        self.steps.push(SagaStep {
            name: name.into(),
            action: boxed(action),
            compensation: None,
        });
        self
    }

    /// The saga's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs the steps in order; on a failure runs the completed steps' compensations in reverse
    /// order. Never panics because of a step (see the [module docs](self)).
    pub fn run(&self, input: &I) -> SagaReport {
        let mut report = SagaReport {
            saga: self.name.clone(),
            completed: Vec::new(),
            failed: None,
            compensated: Vec::new(),
            skipped: Vec::new(),
            unresolved: Vec::new(),
        };
        let mut done: Vec<&SagaStep<I>> = Vec::new();
        for step in &self.steps {
            match call(&step.action, input) {
                Ok(()) => {
                    report.completed.push(step.name.clone());
                    done.push(step);
                }
                Err(error) => {
                    log::warn!(
                        "acemq: saga {:?} step {:?} failed: {error}; compensating {} completed \
                         step(s)",
                        self.name,
                        step.name,
                        done.len()
                    );
                    report.failed = Some(StepFailure {
                        step: step.name.clone(),
                        error,
                    });
                    break;
                }
            }
        }
        if report.failed.is_none() {
            return report;
        }
        for step in done.iter().rev() {
            let Some(compensation) = &step.compensation else {
                report.skipped.push(step.name.clone());
                continue;
            };
            match call(compensation, input) {
                Ok(()) => report.compensated.push(step.name.clone()),
                Err(error) => {
                    log::error!(
                        "acemq: saga {:?}: the compensation of step {:?} failed, so it is left \
                         unresolved: {error}",
                        self.name,
                        step.name
                    );
                    report.unresolved.push(StepFailure {
                        step: step.name.clone(),
                        error,
                    });
                }
            }
        }
        report
    }
}

/// Runs an action, a panic turned into an error.
fn call<I>(action: &Action<I>, input: &I) -> Result<(), BoxError> {
    match catch_unwind(AssertUnwindSafe(|| action(input))) {
        Ok(result) => result,
        Err(payload) => Err(format!("panic: {}", panic_message(payload.as_ref())).into()),
    }
}

/// A step (or its compensation) that failed, and how.
#[derive(Debug)]
#[non_exhaustive]
pub struct StepFailure {
    /// The step's name.
    pub step: String,
    /// Its error (`panic: …` for a panic).
    pub error: BoxError,
}

/// What a saga run did. See [`Saga::run`].
#[derive(Debug)]
pub struct SagaReport {
    saga: String,
    completed: Vec<String>,
    failed: Option<StepFailure>,
    compensated: Vec<String>,
    skipped: Vec<String>,
    unresolved: Vec<StepFailure>,
}

impl SagaReport {
    /// The saga's name.
    pub fn saga(&self) -> &str {
        &self.saga
    }

    /// True when every step completed.
    pub fn succeeded(&self) -> bool {
        self.failed.is_none()
    }

    /// The steps that completed, in the order they ran.
    pub fn completed(&self) -> &[String] {
        &self.completed
    }

    /// The step that failed, and its error.
    pub fn failed(&self) -> Option<&StepFailure> {
        self.failed.as_ref()
    }

    /// The steps whose compensation ran and succeeded, in the order they ran (reverse).
    pub fn compensated(&self) -> &[String] {
        &self.compensated
    }

    /// Completed steps without a compensation, passed over while compensating (reverse order).
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// True when some compensation failed: something is left half done.
    pub fn has_unresolved(&self) -> bool {
        !self.unresolved.is_empty()
    }

    /// The steps whose compensation failed, with its error, in the order they were tried.
    pub fn unresolved(&self) -> &[StepFailure] {
        &self.unresolved
    }
}

impl fmt::Display for SagaReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.failed {
            None => write!(
                f,
                "saga {:?} completed {} step(s)",
                self.saga,
                self.completed.len()
            ),
            Some(failed) => {
                write!(
                    f,
                    "saga {:?} failed at step {:?} ({}); compensated {:?}",
                    self.saga, failed.step, failed.error, self.compensated
                )?;
                if self.has_unresolved() {
                    let names: Vec<_> = self.unresolved.iter().map(|u| &u.step).collect();
                    write!(f, "; unresolved {names:?}")?;
                }
                Ok(())
            }
        }
    }
}
