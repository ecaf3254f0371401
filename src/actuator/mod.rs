//! The family's HTTP endpoints on a small blocking listener (feature `actuator`):
//!
//! | path | what |
//! |---|---|
//! | `/acemq-health` | [`Connection::health`] as the family's JSON; **200** when up or degraded, **503** when down, and **503** with `"status":"down"` and `"reason":"draining"` while [draining](RunningActuator::set_draining) |
//! | `/readyz` | readiness, as the family's .NET hosting names it: the same answer as `/acemq-health` |
//! | `/livez` | liveness: **200** `{"status":"up"}` whenever the process answers; never asks the broker or the checks, and is answered even while draining or while every answering place is taken |
//! | `/acemq-info` | `library`, `libraryVersion`, `name` (the service), `version` (the application's, when given), `transport` (the five capabilities, as Go writes them), `origin`, `connectionName`, `address` (never a password) |
//! | `/acemq-metrics` | Prometheus text, from the `metrics` facade's recorder (`metrics-exporter-prometheus`) |
//!
//! The same paths as the Python, Go, Java and .NET libraries, so one scrape configuration or
//! probe reads them all; [`ActuatorOptions::prefix`] puts them all under a prefix, as Go's
//! `Options.Prefix` does. Point a Kubernetes readiness probe at `/readyz` and its liveness
//! probe at `/livez`: a broker outage then takes the instance out of rotation without
//! restarting it. Nothing checks who asks: bind it to loopback or a port the ingress does not
//! publish.
//!
//! ```no_run
//! use acemq_amqp::actuator::{install_prometheus_recorder, Actuator, ActuatorOptions};
//! use acemq_amqp::observe::MetricsObserver;
//! use acemq_amqp::{Connection, ConnectionOptions};
//! # fn main() -> acemq_amqp::Result<()> {
//! let prometheus = install_prometheus_recorder()?;
//! let connection = Connection::open_with(
//!     ConnectionOptions::new()
//!         .address("amqp://guest:guest@127.0.0.1:5672/")
//!         .service("billing")
//!         .observer(MetricsObserver::new()),
//! )?;
//! let options = ActuatorOptions::new().bind("127.0.0.1:9464").prometheus(prometheus);
//! let running = Actuator::new(&connection, options)?.start()?;
//! println!("health on http://{}/acemq-health", running.local_addr());
//! // … the service runs; at shutdown, readiness fails first (liveness holds) …
//! running.set_draining(true);
//! // … the orchestrator stops sending work, the consumers close …
//! running.close()?;
//! # Ok(()) }
//! ```
//!
//! # Threads
//!
//! `acemq-actuator` accepts connections and gives each a thread of its own,
//! `acemq-actuator-client`, which reads one request, answers it and closes the connection
//! (`Connection: close`; GET and HEAD only). Everything a client can hold is bounded, so slow
//! or silent clients cannot hold up a probe:
//!
//! - at most 256 connections are open at once; past that a new one is answered `503` at once
//!   by `acemq-actuator` and closed, with no thread of its own;
//! - a client has 5 s from its connect to send its request line and headers (at most 16 KiB;
//!   `431` past that), else it is answered `408` and closed; its answer must be written within
//!   5 s as well, else the connection is dropped. A hundred clients holding half-finished
//!   requests hold a hundred threads for at most those 5 s, and a probe beside them is
//!   answered at once;
//! - at most four answers that read the connection or the recorder (health, readiness, info,
//!   metrics) are worked out at once, on the clients' threads; past that `503` at once, so at
//!   most four clients wait on health checks that hang (each under its deadline). `/livez` is
//!   never held back.
//!
//! `acemq-actuator-stop` waits for [`RunningActuator::close`] or a [`StopHandle`] and wakes
//! `acemq-actuator`, which closes the listener; `close` then stops reading the requests still
//! being sent and waits for the answers being worked out to be written.

mod answers;
mod http;
mod options;
mod readiness;
mod request;

use std::net::SocketAddr;
use std::sync::Arc;

pub use metrics_exporter_prometheus::PrometheusHandle;

use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::stop::StopHandle;
use answers::Serving;
pub use options::ActuatorOptions;
pub use readiness::Readiness;

/// Installs the `metrics-exporter-prometheus` recorder as the process's `metrics` recorder
/// (without its own HTTP listener: the actuator serves the text) and returns its handle for
/// [`ActuatorOptions::prometheus`].
///
/// # Errors
///
/// [`Error::InvalidArgument`] when a recorder is installed already (the `metrics` facade takes
/// one per process): pass that recorder's handle instead.
pub fn install_prometheus_recorder() -> Result<PrometheusHandle> {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| Error::invalid(format!("installing the Prometheus recorder: {e}")))
}

/// The endpoints, configured: not listening until [`start`](Self::start).
pub struct Actuator {
    connection: Connection,
    options: ActuatorOptions,
}

impl std::fmt::Debug for Actuator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actuator")
            .field("options", &self.options)
            .finish()
    }
}

impl Actuator {
    /// The endpoints for `connection`, with these options. Nothing listens yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty bind address.
    pub fn new(connection: &Connection, options: ActuatorOptions) -> Result<Actuator> {
        options.validate()?;
        Ok(Actuator {
            connection: connection.clone(),
            options,
        })
    }

    /// Binds the address and starts answering.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when the address cannot be bound (naming it) or a thread cannot be
    /// spawned.
    pub fn start(self) -> Result<RunningActuator> {
        let readiness = Readiness::new();
        let bind = self.options.bind.clone();
        let serving = Serving::new(self.connection, self.options, readiness.clone());
        let server = http::Server::start(&bind, Arc::new(serving))?;
        Ok(RunningActuator { server, readiness })
    }
}

/// A started [`Actuator`]. Dropping it closes it (blocking until the answers being worked
/// out are written: at most a health answer's longest check deadline and 5 s to write it).
pub struct RunningActuator {
    server: http::Server,
    readiness: Readiness,
}

impl std::fmt::Debug for RunningActuator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningActuator")
            .field("local_addr", &self.server.local_addr())
            .field("draining", &self.readiness.is_draining())
            .finish()
    }
}

impl RunningActuator {
    /// The address it listens on (with the port chosen when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// A handle that stops it from any thread; the listener closes at once, and the
    /// connections open then end as [`close`](Self::close) says.
    pub fn stop_handle(&self) -> StopHandle {
        self.server.stop_handle()
    }

    /// Starts (`true`) or ends (`false`) draining: while draining, `/readyz` and
    /// `/acemq-health` answer 503 with `"status":"down"` and `"reason":"draining"` (the rest of
    /// the health JSON as it is), and `/livez` still answers 200. For a host shutting down:
    /// drain, wait for the orchestrator to stop sending work, then close. The same as
    /// [`readiness`](Self::readiness)`().set_draining(draining)`.
    pub fn set_draining(&self, draining: bool) {
        self.readiness.set_draining(draining);
    }

    /// A cloneable handle on the draining state, for a host on another thread.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// Stops answering: closes the listener, stops reading the requests still being sent (their
    /// clients see the connection close), and waits for the answers being worked out to be
    /// written (each within 5 s).
    ///
    /// # Errors
    ///
    /// [`Error::Handler`] when one of its threads panicked.
    pub fn close(mut self) -> Result<()> {
        self.shut()
    }

    fn shut(&mut self) -> Result<()> {
        if self.server.shut() {
            return Err(Error::Handler {
                source: "an actuator thread panicked".into(),
            });
        }
        Ok(())
    }
}

impl Drop for RunningActuator {
    fn drop(&mut self) {
        if let Err(e) = self.shut() {
            log::warn!("acemq: closing the actuator: {e}");
        }
    }
}
