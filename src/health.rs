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
//! use acemq_amqp::health::HealthReport;
//! use acemq_amqp::Connection;
//! use std::time::Duration;
//! # fn main() -> acemq_amqp::Result<()> {
//! let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
//! connection.add_health_check("database", Duration::from_secs(2), || {
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
//! Where the family differs, this follows Python: its lower-case words and `parts` (Java writes
//! Spring Boot's `UP`/`DOWN` with `components` and `details`), and its snake_case keys (Go's
//! are camelCase). A blocked connection is `degraded` here; Go and Java report it `up` with the
//! reason, .NET as degraded only through a check the application registers.

mod checks;
mod report;
mod sources;

pub(crate) use checks::AppChecks;
pub use checks::DEFAULT_CHECK_DEADLINE;
pub(crate) use report::rfc3339;
pub use report::{Health, HealthReport, HealthStatus};
pub use sources::HealthSource;
pub(crate) use sources::{HealthSources, Registered};
