//! Planning a [`Topology`] against the broker ([`TopologyPlan`]) and carrying it out in a mode
//! ([`ApplyMode`]): plan, apply, validate.

use super::model::Topology;
use crate::connection::{Connection, TopologyDifference};
use crate::error::{Error, Result};

/// What [`Topology::apply`] does with its plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApplyMode {
    /// Changes nothing: the plan only (Java's `DRY_RUN`).
    Plan,
    /// Creates what is missing and binds every binding; refuses, before creating anything, when
    /// a queue or exchange on the broker differs from its spec, naming each difference (Java's
    /// `CREATE_ONLY`, its default).
    Apply,
    /// Changes nothing and fails on any drift: something missing or different (Java's
    /// `VALIDATE`).
    Validate,
}

impl std::str::FromStr for ApplyMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<ApplyMode> {
        match s {
            "plan" => Ok(ApplyMode::Plan),
            "apply" => Ok(ApplyMode::Apply),
            "validate" => Ok(ApplyMode::Validate),
            other => Err(Error::invalid(format!(
                "`{other}` is not a topology mode: plan, apply or validate"
            ))),
        }
    }
}

/// What one item of a plan is, on the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanAction {
    /// Missing: [`ApplyMode::Apply`] creates it.
    Create,
    /// There, as its spec says.
    Present,
    /// There, but different: each difference ([`ApplyMode::Apply`] refuses).
    Differs(Vec<TopologyDifference>),
    /// A binding: AMQP cannot read bindings, so whether it exists is not known; binding is
    /// idempotent, and [`ApplyMode::Apply`] binds it.
    Bind,
}

/// One exchange, queue or binding of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanItem {
    /// `"exchange"`, `"queue"` or `"binding"`.
    pub kind: &'static str,
    /// Its name (a binding: `exchange -> queue (routing key)`).
    pub name: String,
    /// What it is on the broker.
    pub action: PlanAction,
}

/// A topology compared with the broker, item by item, in the order declared (exchanges,
/// queues, bindings): as data, and as text (`Display`, one line an item).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyPlan {
    /// Each item.
    pub items: Vec<PlanItem>,
}

impl TopologyPlan {
    /// The items that would be created.
    pub fn to_create(&self) -> impl Iterator<Item = &PlanItem> {
        self.items.iter().filter(|i| i.action == PlanAction::Create)
    }

    /// The items that differ from their spec.
    pub fn conflicts(&self) -> impl Iterator<Item = &PlanItem> {
        self.items
            .iter()
            .filter(|i| matches!(i.action, PlanAction::Differs(_)))
    }

    /// True when every queue and exchange is there as its spec says (bindings are not known).
    pub fn in_sync(&self) -> bool {
        self.to_create().next().is_none() && self.conflicts().next().is_none()
    }

    /// The drift, one line an item missing or different; empty when in sync.
    pub fn drift(&self) -> Vec<String> {
        self.items
            .iter()
            .filter_map(|i| match &i.action {
                PlanAction::Create => Some(format!("{} {:?} is missing", i.kind, i.name)),
                PlanAction::Differs(d) => Some(
                    d.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                _ => None,
            })
            .collect()
    }
}

impl std::fmt::Display for TopologyPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for item in &self.items {
            match &item.action {
                PlanAction::Create => writeln!(f, "create   {} {}", item.kind, item.name)?,
                PlanAction::Present => writeln!(f, "present  {} {}", item.kind, item.name)?,
                PlanAction::Bind => writeln!(f, "bind     {} (idempotent)", item.name)?,
                PlanAction::Differs(d) => {
                    writeln!(f, "DIFFERS  {} {}", item.kind, item.name)?;
                    for difference in d {
                        writeln!(
                            f,
                            "           {}: {} on the broker, {} in the topology",
                            difference.what, difference.actual, difference.expected
                        )?;
                    }
                }
            }
        }
        let (create, conflicts) = (self.to_create().count(), self.conflicts().count());
        write!(
            f,
            "{} items: {create} to create, {conflicts} differing, {} bindings",
            self.items.len(),
            self.items.iter().filter(|i| i.kind == "binding").count()
        )
    }
}

fn action_of(differences: Vec<TopologyDifference>) -> PlanAction {
    if differences.iter().any(|d| d.what == "existence") {
        PlanAction::Create
    } else if differences.is_empty() {
        PlanAction::Present
    } else {
        PlanAction::Differs(differences)
    }
}

impl Topology {
    /// Compares every exchange and queue with the broker, **changing nothing**
    /// ([`Connection::compare_queue`] and [`compare_exchange`](Connection::compare_exchange)):
    /// what would be created, what is there, what differs and how.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name; the broker's error when it cannot be asked.
    pub fn plan(&self, connection: &Connection) -> Result<TopologyPlan> {
        let mut plan = TopologyPlan::default();
        for x in &self.exchanges {
            plan.items.push(PlanItem {
                kind: "exchange",
                name: x.name().to_string(),
                action: action_of(connection.compare_exchange(x)?),
            });
        }
        for q in &self.queues {
            plan.items.push(PlanItem {
                kind: "queue",
                name: q.name().to_string(),
                action: action_of(connection.compare_queue(q)?),
            });
        }
        for b in &self.bindings {
            let key = if b.routing_key.is_empty() {
                String::new()
            } else {
                format!(" ({})", b.routing_key)
            };
            plan.items.push(PlanItem {
                kind: "binding",
                name: format!("{} -> {}{key}", b.exchange, b.queue),
                action: PlanAction::Bind,
            });
        }
        Ok(plan)
    }

    /// Plans, then carries the plan out in `mode` ([`ApplyMode`]); returns the plan (as it was
    /// before anything was created).
    ///
    /// # Errors
    ///
    /// As [`plan`](Self::plan); with [`ApplyMode::Apply`], [`Error::TopologyConflict`] naming
    /// the first queue or exchange that differs and every difference of every one (nothing is
    /// created then); with [`ApplyMode::Validate`], [`Error::TopologyConflict`] naming the
    /// first item that drifted and listing the whole drift.
    pub fn apply(&self, connection: &Connection, mode: ApplyMode) -> Result<TopologyPlan> {
        let plan = self.plan(connection)?;
        self.apply_plan(connection, &plan, mode)?;
        Ok(plan)
    }

    /// Carries out `plan`, made by [`plan`](Self::plan) of this topology, in `mode`: what
    /// [`apply`](Self::apply) does after planning, for a caller that shows the plan whatever
    /// comes of it (the command line) without asking the broker twice.
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply), but for the planning.
    pub fn apply_plan(
        &self,
        connection: &Connection,
        plan: &TopologyPlan,
        mode: ApplyMode,
    ) -> Result<()> {
        match mode {
            ApplyMode::Plan => Ok(()),
            ApplyMode::Validate => match plan
                .items
                .iter()
                .find(|i| matches!(i.action, PlanAction::Create | PlanAction::Differs(_)))
            {
                None => Ok(()),
                Some(first) => Err(conflict(first, "the topology has drifted", plan)),
            },
            ApplyMode::Apply => {
                if let Some(first) = plan.conflicts().next() {
                    return Err(conflict(first, "refusing to apply: nothing created", plan));
                }
                self.create_missing(connection, plan)
            }
        }
    }

    /// [`apply`](Self::apply) with [`ApplyMode::Validate`].
    ///
    /// # Errors
    ///
    /// As [`apply`](Self::apply).
    pub fn validate(&self, connection: &Connection) -> Result<TopologyPlan> {
        self.apply(connection, ApplyMode::Validate)
    }

    fn create_missing(&self, connection: &Connection, plan: &TopologyPlan) -> Result<()> {
        let missing = |kind: &str, name: &str| {
            plan.items
                .iter()
                .any(|i| i.kind == kind && i.name == name && i.action == PlanAction::Create)
        };
        for x in self
            .exchanges
            .iter()
            .filter(|x| missing("exchange", x.name()))
        {
            connection.declare_exchange(x)?;
        }
        for q in self.queues.iter().filter(|q| missing("queue", q.name())) {
            connection.declare_queue(q)?;
        }
        for b in &self.bindings {
            connection.bind(b)?;
        }
        Ok(())
    }
}

fn conflict(first: &PlanItem, what: &str, plan: &TopologyPlan) -> Error {
    Error::TopologyConflict {
        kind: first.kind,
        name: first.name.clone(),
        reason: format!("{what}: {}", plan.drift().join("; ")),
    }
}
