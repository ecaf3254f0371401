//! Health: whether this service's messaging still works, as the family reports it.
//!
//! [`Connection::health`](crate::Connection::health) answers with a [`Health`]: one
//! [`HealthReport`] per component — the broker link (`broker`), each running consumer
//! (`consumer:{queue}`), each running outbox relay (`outbox-relay`), and each of the
//! application's own checks under its name — and the worst of their statuses. The statuses are
//! the family's three words: `up`, `degraded` (working, but not as well as it should: worth an
//! alert, not worth taking the instance out of rotation) and `down` (a readiness probe should
//! fail). [`Health::to_json`] writes the family's JSON (`status`, `detail`, `checked`,
//! `parts`), which the `actuator` feature serves on `/acemq-health`.
//!
//! ```no_run
//! use acemq_amqp::health::{HealthCheckOptions, HealthReport};
//! use acemq_amqp::Connection;
//! use std::time::Duration;
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! let options = HealthCheckOptions::new().deadline(Duration::from_secs(2));
//! connection.add_health_check("database", options, || {
//!     HealthReport::up() // ask the database here
//! })?;
//! let health = connection.health();
//! println!("{}", health.to_json());
//! # Ok(()) }
//! ```
//!
//! A component reports through a [`HealthSource`]: the connection holds each one as a `Weak`
//! reference, so a consumer or relay appears while it runs and drops out when it is closed. A
//! started consumer is listed (`Consumer::start`, and what runs on one: a consumer group's
//! members, a responder, a stream reader, a scheduler's control consumer); a `Consumer::run` on
//! the caller's thread is not.
//!
//! The broker link's report asks the broker, as Go's and Python's connection checks do: a round
//! trip (a passive declare of the standard exchange `amq.direct` on a short-lived channel: no
//! permission needed, nothing changed) under [`ROUND_TRIP_DEADLINE`] (3 s, Go's), so that an open but
//! wedged connection is `down` within it rather than after two missed heartbeats; its time is
//! `roundTripMillis`. One round trip serves every probe for [`ROUND_TRIP_REUSE`] (1 s), and
//! probes at once share the one under way, so a probe every 100 ms never means a declare every
//! 100 ms. A blocked connection (a memory or disk alarm) is `up`, its detail saying so, and is
//! not asked (the broker reads nothing from it), as Go, Python, Java and .NET report it.
//!
//! Where the family differs, this follows the majority; docs/wire-contract.md lists each choice:
//! Go's and Python's lower-case words and `parts` (Java and .NET write `UP`/`DOWN` with
//! `components` and `details`), the camelCase keys of Go, Java and .NET (`roundTripMillis`,
//! `blockedReason`, `inFlight`; Python writes `in-flight`, `round-trip`), and Go's aggregate
//! detail (`name: detail` for each component that is not up or has something to say).

mod checks;
mod report;
mod sources;

pub(crate) use checks::{AppChecks, Probe, Started};
pub use checks::{
    HealthCheckOptions, DEFAULT_CHECK_DEADLINE, ROUND_TRIP_DEADLINE, ROUND_TRIP_REUSE,
};
pub(crate) use report::rfc3339;
pub use report::{Health, HealthReport, HealthStatus};
pub use sources::HealthSource;
pub(crate) use sources::{HealthSources, Registered};
