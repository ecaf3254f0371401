//! The family's three HTTP endpoints on a small blocking listener (feature `actuator`):
//!
//! | path | what |
//! |---|---|
//! | `/acemq-health` | [`Connection::health`] as the family's JSON; **200** when up or degraded, **503** when down |
//! | `/acemq-info` | `library`, `libraryVersion`, `name` (the service), `version` (the application's, when given), `transport` (the five capabilities, as Go writes them), `origin`, `connectionName`, `address` (never a password) |
//! | `/acemq-metrics` | Prometheus text, from the `metrics` facade's recorder (`metrics-exporter-prometheus`) |
//!
//! The same paths as the Python, Go, Java and .NET libraries, so one scrape configuration or
//! probe reads them all; [`ActuatorOptions::prefix`] puts them under a prefix, as Go's
//! `Options.Prefix` does. Nothing checks who asks: bind it to loopback or a port the ingress
//! does not publish.
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
//! // … the service runs …
//! running.close()?;
//! # Ok(()) }
//! ```
//!
//! # Threads
//!
//! HTTP is read by [`tiny_http`]'s threads (one per open client connection, from its pool),
//! which hand over complete requests only. `acemq-actuator` takes them and gives each to one of
//! four `acemq-actuator-N` threads that answer it; while all four are busy (writing to clients
//! that do not read, or waiting for health checks under their deadlines) a request is answered
//! `503` at once by `acemq-actuator` itself, so a client slow to read its answer does not hold
//! up the others' (but see the next paragraph on clients that hold `tiny_http`'s own threads). [`RunningActuator::close`] stops and joins them.
//!
//! `tiny_http` sets no socket timeouts: a client that opens a connection and never finishes its
//! request (or never reads its answer) holds one of `tiny_http`'s pool threads until it goes
//! away. The actuator keeps answering others while fewer such clients are open than the pool's
//! four idle threads; past that, `tiny_http`'s pool can queue a new connection behind a thread
//! such a client holds (a race in its idle-thread count) and its request waits until one of
//! them goes away. Another reason to keep it on loopback or a port only the probes reach.

mod options;

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
pub use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

use crate::connection::Connection;
use crate::error::{Error, Result};
use crate::stop::StopHandle;
pub use options::ActuatorOptions;

/// The answering threads.
const WORKERS: usize = 4;

/// How often `acemq-actuator` looks at its stop flag while no request comes (a
/// [`StopHandle`] from another thread is seen within this; [`RunningActuator::close`] wakes it
/// at once).
const STOP_POLL: Duration = Duration::from_millis(200);

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
        let bind = self.options.bind.clone();
        let server = tiny_http::Server::http(&bind).map_err(|e| Error::Io {
            context: format!("binding the actuator to {bind}"),
            source: std::io::Error::other(e.to_string()),
        })?;
        let server = Arc::new(server);
        let local_addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| Error::invalid(format!("the actuator's address {bind} is not IP")))?;
        let serving = Arc::new(Serving {
            connection: self.connection,
            options: self.options,
        });
        let (jobs, jobs_rx) = crossbeam_channel::bounded::<tiny_http::Request>(0);
        let mut threads = Vec::with_capacity(WORKERS + 1);
        let spawn_error = |e| Error::Io {
            context: "spawning the actuator's threads".into(),
            source: e,
        };
        for n in 1..=WORKERS {
            let rx: Receiver<tiny_http::Request> = jobs_rx.clone();
            let serving = Arc::clone(&serving);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("acemq-actuator-{n}"))
                    .spawn(move || {
                        for request in rx {
                            serving.answer(request);
                        }
                    })
                    .map_err(spawn_error)?,
            );
        }
        let stop = StopHandle::new();
        let accept = {
            let server = Arc::clone(&server);
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("acemq-actuator".into())
                .spawn(move || receive(&server, &stop, jobs))
                .map_err(spawn_error)?
        };
        threads.push(accept);
        Ok(RunningActuator {
            local_addr,
            server,
            stop,
            threads,
        })
    }
}

/// What the answering threads share.
struct Serving {
    connection: Connection,
    options: ActuatorOptions,
}

/// `acemq-actuator`: takes complete requests and hands each to a free worker, or answers 503
/// when none is free.
fn receive(server: &tiny_http::Server, stop: &StopHandle, jobs: Sender<tiny_http::Request>) {
    while !stop.is_stopped() {
        let request = match server.recv_timeout(STOP_POLL) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                if !stop.is_stopped() {
                    log::warn!("acemq: the actuator stopped receiving: {e}");
                }
                break;
            }
        };
        match jobs.try_send(request) {
            Ok(()) => {}
            Err(TrySendError::Full(r)) | Err(TrySendError::Disconnected(r)) => {
                let _ = r.respond(text(503, "busy: every answering thread is taken\n"));
            }
        }
    }
}

fn text(status: u16, body: &str) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    typed(
        tiny_http::Response::from_string(body).with_status_code(status),
        "text/plain; charset=utf-8",
    )
}

fn json_response(status: u16, body: String) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    typed(
        tiny_http::Response::from_string(body).with_status_code(status),
        "application/json",
    )
}

/// `Content-Type: {value}` (constants of this file, which always parse).
fn content_type(value: &str) -> Option<tiny_http::Header> {
    tiny_http::Header::from_bytes(&b"Content-Type"[..], value.as_bytes()).ok()
}

fn typed(
    response: tiny_http::Response<std::io::Cursor<Vec<u8>>>,
    value: &str,
) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    match content_type(value) {
        Some(h) => response.with_header(h),
        None => response,
    }
}

impl Serving {
    fn answer(&self, request: tiny_http::Request) {
        let path = request.url().split('?').next().unwrap_or("").to_string();
        let method = request.method();
        let response = if *method != tiny_http::Method::Get && *method != tiny_http::Method::Head {
            text(405, "only GET and HEAD\n")
        } else {
            let prefix = self.options.prefix.as_str();
            match path.strip_prefix(prefix).unwrap_or("") {
                "/acemq-health" => {
                    let health = self.connection.health();
                    let status = if health.is_healthy() { 200 } else { 503 };
                    json_response(status, health.to_json())
                }
                "/acemq-info" => json_response(200, self.info().to_string()),
                "/acemq-metrics" => match &self.options.prometheus {
                    Some(handle) => typed(
                        tiny_http::Response::from_string(handle.render()),
                        "text/plain; version=0.0.4; charset=utf-8",
                    ),
                    None => text(404, "no Prometheus recorder configured\n"),
                },
                _ => text(
                    404,
                    &format!(
                        "nothing here; try {prefix}/acemq-health, {prefix}/acemq-info or \
                         {prefix}/acemq-metrics\n"
                    ),
                ),
            }
        };
        if let Err(e) = request.respond(response) {
            log::debug!("acemq: the actuator's answer to {path} was not delivered: {e}");
        }
    }

    /// The family's keys (Go's and Java's): `library`, `libraryVersion`, `name` and `version`
    /// (the application's, `version` only when given), and `transport` as Go writes it (an
    /// object of the five capabilities; `null` while the connection is down); then ours:
    /// `origin`, `connectionName`, `address` (never a password).
    fn info(&self) -> serde_json::Value {
        let options = &self.connection.shared.options;
        let mut info = json!({
            "library": env!("CARGO_PKG_NAME"),
            "libraryVersion": env!("CARGO_PKG_VERSION"),
            "name": self.options.service.clone().unwrap_or_else(|| options.service.clone()),
        });
        if let Some(version) = &self.options.version {
            info["version"] = version.clone().into();
        }
        info["transport"] = match self.connection.capabilities() {
            Some(c) => c
                .entries()
                .iter()
                .map(|(k, v)| ((*k).to_string(), serde_json::Value::Bool(*v)))
                .collect::<serde_json::Map<_, _>>()
                .into(),
            None => serde_json::Value::Null,
        };
        info["origin"] = self.connection.origin().into();
        info["connectionName"] = options.name.clone().into();
        info["address"] = self.connection.current_address().into();
        info
    }
}

/// A started [`Actuator`]. Dropping it closes it (blocking until its threads end: at most a
/// health answer's longest check deadline).
pub struct RunningActuator {
    local_addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    stop: StopHandle,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for RunningActuator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningActuator")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl RunningActuator {
    /// The address it listens on (with the port chosen when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A handle that stops it from any thread (seen within 200 ms); the listener closes when
    /// this is closed or dropped.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Stops answering, closes the listener and joins the threads (a request being answered is
    /// answered first).
    ///
    /// # Errors
    ///
    /// [`Error::Handler`] when one of its threads panicked.
    pub fn close(mut self) -> Result<()> {
        self.shut()
    }

    fn shut(&mut self) -> Result<()> {
        self.stop.stop();
        self.server.unblock();
        let mut panicked = false;
        for t in self.threads.drain(..) {
            panicked |= t.join().is_err();
        }
        if panicked {
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
