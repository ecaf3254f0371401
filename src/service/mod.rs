//! The service host: one value a plain threaded program builds with its consumers,
//! responders, relays, scheduler and actuator, then runs — it opens the connections, starts
//! every part, registers each in health, blocks until it is asked to stop (SIGTERM or SIGINT,
//! a [`StopHandle`](crate::StopHandle), a part failing for good), drains in order within a
//! deadline, and returns a report a `main` turns into an exit code.
//!
//! ```no_run
//! use acemq_amqp::service::{Service, ServiceOptions};
//! use acemq_amqp::{ConnectionOptions, ConsumerOptions, Message, Outcome};
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! let options = ServiceOptions::new(
//!     "billing",
//!     ConnectionOptions::new().address("amqp://guest:guest@127.0.0.1:5672/"),
//! );
//! let report = Service::new(options)
//!     .consumer("invoices", ConsumerOptions::new().concurrency(4), |m: &Message| {
//!         println!("invoice {}", m.id());
//!         Ok(Outcome::Accept)
//!     })
//!     .run()?;
//! std::process::exit(report.exit_code());
//! # }
//! ```
//!
//! **Two connections.** The host opens one connection for publishing (`{name}-publish`: the
//! outbox relays) and one for consuming (`{name}-consume`: consumers, responders and the
//! scheduler, with the retry copies and replies they publish before a delivery's ack), as
//! RabbitMQ advises: under a memory or disk alarm the broker blocks publishing connections, and
//! a blocked publisher must never stall acknowledgements. Each part registers in the consuming
//! connection's health, with a check of the publishing one.
//!
//! **The drain**, on a signal, a stop or a failing part, each step with what is left of the
//! deadline ([`ServiceOptions::drain_timeout`], 20 s as the family's):
//!
//! 1. readiness turns down: the actuator's `/readyz` and `/acemq-health` answer 503 `draining`
//!    (`/livez` stays 200), so the orchestrator sends no new work;
//! 2. the consumers stop taking deliveries (`basic.cancel`, not a close), their running
//!    handlers finish and are settled, and what was received and not started goes back to the
//!    queue without spending RabbitMQ 4.x's delivery limit;
//! 3. the outbox relays make a last sweep (what those handlers wrote) and stop;
//! 4. the responders and the scheduler stop;
//! 5. the actuator and the connections close.
//!
//! A handler still running at the deadline is abandoned — its delivery given back to the
//! queue, its result dropped — and counted in the [`ServiceReport`]; its
//! [`exit_code`](ServiceReport::exit_code) is then 75 (`EX_TEMPFAIL`), 1 when a part failed,
//! 0 otherwise.
//!
//! **Flow control** while it runs: [`RunningService::pause`] / [`resume`](RunningService::resume)
//! every consumer and responder, [`scale_to`](RunningService::scale_to) one of them
//! ([`RunningConsumer`](crate::RunningConsumer) has the same on its own).
//!
//! A part of the application's own implements [`ServicePart`] and is added with
//! [`Service::part`]. `docs/operating.md` says how to run a service under systemd and
//! Kubernetes.

mod host;
mod options;
mod part;
mod report;
mod running;
mod signals;

pub use host::Service;
pub use options::{Connections, ServiceOptions};
pub use part::{ServicePart, Stage};
pub use report::{PartReport, ServiceReport, StopReason};
pub use running::RunningService;
