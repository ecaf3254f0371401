//! [`Service`]: the parts of a service, configured ([`ServiceOptions`]), started together on
//! the host's connections ([`Connections`]).

use std::time::Duration;

use super::part::ServicePart;
use super::running::RunningService;
use super::ServiceReport;
use crate::connection::{Connection, ConnectionOptions};
use crate::consume::{ConsumerOptions, Handler};
use crate::error::{BoxError, Error, Result};
use crate::patterns::outbox::{OutboxRelay, OutboxRelayOptions, OutboxStore};
use crate::patterns::request_reply::{Responder, ResponderOptions};
use crate::patterns::scheduler::{Scheduler, SchedulerOptions};
use crate::Message;

/// The family's drain deadline (Python, Go, .NET and Ruby: 20 s).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// The connections a service's parts run on: one that publishes (the relays) and one that
/// consumes (consumers, responders, the scheduler — and the copies and replies they publish
/// while a delivery is unacknowledged), as RabbitMQ advises: the broker blocks a publishing
/// connection under a memory or disk alarm, and one that also carried acknowledgements would
/// stall them with it.
#[derive(Clone, Debug)]
pub struct Connections {
    pub(super) publishing: Connection,
    pub(super) consuming: Connection,
}

impl Connections {
    /// The connection for publishing (`{name}-publish`).
    pub fn publishing(&self) -> &Connection {
        &self.publishing
    }

    /// The connection for consuming (`{name}-consume`).
    pub fn consuming(&self) -> &Connection {
        &self.consuming
    }
}

/// How a service runs: its name, its connections' options, the drain's deadline, the signals
/// it stops on, and its actuator.
#[derive(Clone, Debug)]
pub struct ServiceOptions {
    pub(super) name: String,
    pub(super) connection: ConnectionOptions,
    pub(super) drain_timeout: Duration,
    pub(super) signals: bool,
    #[cfg(feature = "actuator")]
    pub(super) actuator: Option<crate::actuator::ActuatorOptions>,
}

impl ServiceOptions {
    /// A service named `name` (its connections are `{name}-publish` and `{name}-consume`, and
    /// `name` is their `service`), connecting with `connection`; a drain deadline of 20 s, stopping
    /// on SIGTERM and SIGINT, no actuator.
    pub fn new(name: impl Into<String>, connection: ConnectionOptions) -> Self {
        ServiceOptions {
            name: name.into(),
            connection,
            drain_timeout: DRAIN_TIMEOUT,
            signals: true,
            #[cfg(feature = "actuator")]
            actuator: None,
        }
    }

    /// How long the drain may take, from the stop to the connections closed (default 20 s, as
    /// the family's). Set it under the orchestrator's grace period (Kubernetes'
    /// `terminationGracePeriodSeconds`, 30 s by default; systemd's `TimeoutStopSec`).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Whether the host stops on SIGTERM and SIGINT (default true; Unix only). Off, only a
    /// [`StopHandle`](crate::StopHandle) or a failing part stops it.
    pub fn signals(mut self, on: bool) -> Self {
        self.signals = on;
        self
    }

    /// Serves the actuator's endpoints (`/acemq-health`, `/readyz`, `/livez`, …) for the
    /// consuming connection, started once every part runs; readiness turns down first when the
    /// service drains.
    #[cfg(feature = "actuator")]
    pub fn actuator(mut self, options: crate::actuator::ActuatorOptions) -> Self {
        self.actuator = Some(options);
        self
    }

    fn validate(&self) -> Result<()> {
        if self.name.trim().is_empty() {
            return Err(Error::invalid("a service needs a name"));
        }
        if self.drain_timeout.is_zero() {
            return Err(Error::invalid("the drain timeout must be above zero"));
        }
        Ok(())
    }
}

/// Starts a part on the service's connections.
type Factory = Box<dyn FnOnce(&Connections) -> Result<Box<dyn ServicePart>> + Send>;

/// A service: its consumers, responders, relays, scheduler and parts of its own, started
/// together by [`start`](Self::start) or [`run`](Self::run) (which also waits for the stop and
/// drains). See the [module docs](super).
pub struct Service {
    pub(super) options: ServiceOptions,
    pub(super) parts: Vec<(String, Factory)>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<&str> = self.parts.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Service")
            .field("options", &self.options)
            .field("parts", &parts)
            .finish()
    }
}

impl Service {
    /// A service with these options and no parts yet.
    pub fn new(options: ServiceOptions) -> Service {
        Service {
            options,
            parts: Vec::new(),
        }
    }

    /// A consumer of `queue` on the consuming connection, named `consumer:{queue}`.
    pub fn consumer<H>(self, queue: &str, options: ConsumerOptions, handler: H) -> Service
    where
        H: Handler + Send + Sync + 'static,
    {
        let q = queue.to_string();
        self.part(format!("consumer:{queue}"), move |c: &Connections| {
            let running = c.consuming.consumer(&q, options)?.start(handler)?;
            Ok(Box::new(running) as Box<dyn ServicePart>)
        })
    }

    /// A responder to the requests on `queue` on the consuming connection, named
    /// `responder:{queue}` ([`Responder::start`] says what `handler` returns).
    pub fn responder<F, R, E>(self, queue: &str, options: ResponderOptions, handler: F) -> Service
    where
        F: Fn(&Message) -> std::result::Result<R, E> + Send + Sync + 'static,
        R: Into<Message>,
        E: Into<BoxError>,
    {
        let q = queue.to_string();
        self.part(format!("responder:{queue}"), move |c: &Connections| {
            let running = Responder::new(&c.consuming, &q, options)?.start(handler)?;
            Ok(Box::new(running) as Box<dyn ServicePart>)
        })
    }

    /// An outbox relay of `store` on the publishing connection, named `relay`; while the
    /// service drains it stops after the consumers, with a last sweep.
    pub fn relay(self, store: impl OutboxStore + 'static, options: OutboxRelayOptions) -> Service {
        self.part("relay", move |c: &Connections| {
            let running = OutboxRelay::new(&c.publishing, store, options)?.start()?;
            Ok(Box::new(running) as Box<dyn ServicePart>)
        })
    }

    /// The scheduler on the consuming connection, named `scheduler`.
    pub fn scheduler(self, options: SchedulerOptions) -> Service {
        self.part("scheduler", move |c: &Connections| {
            let running = Scheduler::new(&c.consuming, options)?.start()?;
            Ok(Box::new(running) as Box<dyn ServicePart>)
        })
    }

    /// A part of the application's own, started by `start` on the service's connections. A
    /// name used already gets `#2`, `#3`, … after it.
    pub fn part<F>(mut self, name: impl Into<String>, start: F) -> Service
    where
        F: FnOnce(&Connections) -> Result<Box<dyn ServicePart>> + Send + 'static,
    {
        let base = name.into();
        let taken = |n: &str| self.parts.iter().any(|(p, _)| p == n);
        let mut name = base.clone();
        let mut i = 1;
        while taken(&name) {
            i += 1;
            name = format!("{base}#{i}");
        }
        self.parts.push((name, Box::new(start)));
        self
    }

    /// Opens the connections, starts every part in the order added, then the actuator, and
    /// returns the running service (it stops on a signal only while someone
    /// [`wait`](RunningService::wait)s).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for bad options; the first connection or part that could
    /// not start (the parts started before it are stopped and the connections closed).
    pub fn start(self) -> Result<RunningService> {
        self.options.validate()?;
        RunningService::start(self)
    }

    /// Starts the service, blocks until it is asked to stop — SIGTERM or SIGINT, a
    /// [`StopHandle`](crate::StopHandle) from [`RunningService::stop_handle`] (not reachable
    /// here: use [`start`](Self::start) and [`RunningService::wait`] for that), or a part
    /// failing for good — then drains, and returns what the run did: a `main` ends with
    /// `std::process::exit(report.exit_code())`.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); once started, failures are in the report.
    pub fn run(self) -> Result<ServiceReport> {
        Ok(self.start()?.wait())
    }
}
