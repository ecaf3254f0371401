//! What each path answers: `/acemq-health`, `/readyz` and `/livez`, `/acemq-info`,
//! `/acemq-metrics` (under the prefix when one is set), and 404 for anything else. At most
//! [`ANSWERING`] answers that read the connection or the recorder are worked out at once; past
//! that, 503 at once. `/livez` never waits for anything.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use super::http::Answer;
use super::options::ActuatorOptions;
use super::readiness::Readiness;
use super::request::{Request, Response};
use crate::connection::Connection;

/// The most answers worked out at once (each may wait for health checks under their
/// deadlines).
pub(super) const ANSWERING: usize = 4;

/// What the connections' threads share to answer.
pub(super) struct Serving {
    pub(super) connection: Connection,
    pub(super) options: ActuatorOptions,
    pub(super) readiness: Readiness,
    answering: AtomicUsize,
}

/// One of the [`ANSWERING`] places, given back when dropped.
struct Place<'a>(&'a AtomicUsize);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Serving {
    pub(super) fn new(
        connection: Connection,
        options: ActuatorOptions,
        readiness: Readiness,
    ) -> Serving {
        Serving {
            connection,
            options,
            readiness,
            answering: AtomicUsize::new(0),
        }
    }

    /// Takes one of the places, or `None` when all are taken.
    fn place(&self) -> Option<Place<'_>> {
        self.answering
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < ANSWERING).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(&self.answering))
    }

    /// `answer` in one of the places, or 503 when all are taken.
    fn in_place(&self, answer: impl FnOnce() -> Response) -> Response {
        match self.place() {
            Some(_place) => answer(),
            None => Response::text(
                503,
                format!("busy: {ANSWERING} answers are being worked out already\n"),
            ),
        }
    }

    /// The family's health JSON: 200 when up or degraded, 503 when down; while draining 503
    /// with `"status":"down"` and `"reason":"draining"`, the rest as it is.
    fn health(&self) -> Response {
        let health = self.connection.health();
        if self.readiness.is_draining() {
            let mut value = health.to_value();
            value["status"] = "down".into();
            value["reason"] = "draining".into();
            return Response::json(503, value.to_string());
        }
        let status = if health.is_healthy() { 200 } else { 503 };
        Response::json(status, health.to_json())
    }

    fn metrics(&self) -> Response {
        match &self.options.prometheus {
            Some(handle) => Response {
                status: 200,
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                body: handle.render(),
            },
            None => Response::text(404, "no Prometheus recorder configured\n"),
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

impl Answer for Serving {
    fn answer(&self, request: &Request) -> Response {
        let prefix = self.options.prefix.as_str();
        match request.path.strip_prefix(prefix).unwrap_or("") {
            "/livez" => Response::json(200, r#"{"status":"up"}"#),
            "/acemq-health" | "/readyz" => self.in_place(|| self.health()),
            "/acemq-info" => self.in_place(|| Response::json(200, self.info().to_string())),
            "/acemq-metrics" => self.in_place(|| self.metrics()),
            _ => Response::text(
                404,
                format!(
                    "nothing here; try {prefix}/acemq-health, {prefix}/readyz, {prefix}/livez, \
                     {prefix}/acemq-info or {prefix}/acemq-metrics\n"
                ),
            ),
        }
    }
}
