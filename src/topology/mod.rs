//! Topology as a value, with plan, apply and validate — the family's Java `Topology`,
//! `TopologyPlan`, `TopologyPlanner` and `ApplyMode`, and Python's
//! `Topology().exchange(…).queue(…, dead_letter=True, retry=policy)`.
//!
//! Build one [`Topology`] with a service's exchanges, its queues — a consumed one with its
//! dead-letter and retry topology ([`Topology::consumed_queue`]) —, its bindings and the
//! scheduler's ladder, then, at start or from the command line (`acemq topology
//! plan|apply|validate --file …`):
//!
//! * [`Topology::plan`]: what would be created, what is there, what differs and how — as data
//!   ([`TopologyPlan`]) and as text — changing nothing;
//! * [`Topology::apply`] with [`ApplyMode::Apply`]: creates what is missing and binds; refuses,
//!   creating nothing, when a queue or exchange on the broker differs from its spec, naming
//!   each difference (a queue's arguments cannot change in place: that is a migration);
//! * [`Topology::validate`]: fails on any drift, changing nothing (a deploy's check).
//!
//! The comparison reads the broker's refusals of equivalent declarations
//! ([`Connection::compare_queue`](crate::Connection::compare_queue)): AMQP cannot read a
//! queue's arguments or list bindings, so bindings are planned as `bind` (idempotent) and never
//! reported as drift.
//!
//! ```no_run
//! use acemq_amqp::topology::{ApplyMode, Topology};
//! use acemq_amqp::{Binding, Connection, ExchangeKind, ExchangeSpec, QueueSpec, RetryPolicy};
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! let topology = Topology::new()
//!     .exchange(ExchangeSpec::new("orders", ExchangeKind::Topic))
//!     .consumed_queue(QueueSpec::new("billing.orders"), &RetryPolicy::exponential())
//!     .binding(Binding::new().exchange("orders").queue("billing.orders").routing_key("order.*"));
//! println!("{}", topology.plan(&connection)?);
//! topology.apply(&connection, ApplyMode::Apply)?;
//! # Ok(()) }
//! ```
//!
//! A file holds the same ([`Topology::from_toml_str`], [`Topology::from_json_str`],
//! [`Topology::from_file`]; the format is in `docs/topology.md`).

mod file;
mod model;
mod plan;

pub use model::Topology;
pub use plan::{ApplyMode, PlanAction, PlanItem, TopologyPlan};
