//! [`ServiceOptions`]: how a service runs; [`Connections`]: the two it runs on.

use std::time::Duration;

use super::part::ServicePart;
use crate::connection::{Connection, ConnectionOptions};
use crate::error::{Error, Result};

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
    pub(super) topology: Option<(crate::topology::Topology, crate::topology::ApplyMode)>,
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
            topology: None,
            #[cfg(feature = "actuator")]
            actuator: None,
        }
    }

    /// The options [`Settings`](crate::settings::Settings) give (the `ACEMQ_*` variables and
    /// their TOML file, `docs/settings.md`): the connections' options, the drain deadline
    /// (`ACEMQ_CONSUMER__SHUTDOWN_TIMEOUT`, 20 s by default), SIGTERM and SIGINT, and with the
    /// `actuator` feature the actuator on `ACEMQ_ACTUATOR__ADDRESS` (default `127.0.0.1:9464`).
    /// The consumers' options are [`Settings::consumer_options`](crate::settings::Settings::consumer_options).
    ///
    /// # Errors
    ///
    /// As [`Settings::connection_options`](crate::settings::Settings::connection_options).
    pub fn from_settings(
        name: impl Into<String>,
        settings: &crate::settings::Settings,
    ) -> Result<Self> {
        let options = ServiceOptions::new(name, settings.connection_options()?)
            .drain_timeout(settings.drain_timeout());
        #[cfg(feature = "actuator")]
        let options = options.actuator(settings.actuator_options());
        Ok(options)
    }

    /// How long the drain may take, from the stop to the connections closed (default 20 s, as
    /// the family's). Set it under the orchestrator's grace period (Kubernetes'
    /// `terminationGracePeriodSeconds`, 30 s by default; systemd's `TimeoutStopSec`).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// The topology the service needs, carried out in `mode` on the consuming connection before
    /// any part starts ([`Topology::apply`](crate::topology::Topology::apply)): `Apply` creates
    /// what is missing and refuses to start on a conflict, `Validate` refuses to start on any
    /// drift, `Plan` logs the plan and starts. No topology by default: each part declares
    /// what it needs itself.
    pub fn topology(
        mut self,
        topology: crate::topology::Topology,
        mode: crate::topology::ApplyMode,
    ) -> Self {
        self.topology = Some((topology, mode));
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

    pub(super) fn validate(&self) -> Result<()> {
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
pub(super) type Factory = Box<dyn FnOnce(&Connections) -> Result<Box<dyn ServicePart>> + Send>;
