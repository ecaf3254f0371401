//! The actuator's options.

use metrics_exporter_prometheus::PrometheusHandle;

use crate::error::{Error, Result};

/// Options for an [`Actuator`](super::Actuator).
///
/// ```
/// use acemq_amqp::actuator::ActuatorOptions;
/// let options = ActuatorOptions::new().bind("127.0.0.1:0").service("billing");
/// # let _ = options;
/// ```
#[derive(Clone)]
pub struct ActuatorOptions {
    pub(super) bind: String,
    pub(super) prefix: String,
    pub(super) service: Option<String>,
    pub(super) version: Option<String>,
    pub(super) prometheus: Option<PrometheusHandle>,
}

impl std::fmt::Debug for ActuatorOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActuatorOptions")
            .field("bind", &self.bind)
            .field("prefix", &self.prefix)
            .field("service", &self.service)
            .field("version", &self.version)
            .field("prometheus", &self.prometheus.is_some())
            .finish()
    }
}

impl Default for ActuatorOptions {
    fn default() -> Self {
        ActuatorOptions {
            bind: "127.0.0.1:9464".into(),
            prefix: String::new(),
            service: None,
            version: None,
            prometheus: None,
        }
    }
}

impl ActuatorOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where to listen, `host:port` (port 0: any free port, see
    /// [`RunningActuator::local_addr`](super::RunningActuator::local_addr)). Nothing checks who
    /// asks, so keep it on loopback or a port the ingress does not publish. Defaults to
    /// `127.0.0.1:9464` (the family's port, the OpenTelemetry Prometheus convention).
    #[must_use]
    pub fn bind(mut self, address: impl Into<String>) -> Self {
        self.bind = address.into();
        self
    }

    /// A path the three endpoints are served under (`/ops` serves `/ops/acemq-health`, …), as
    /// Go's `Options.Prefix`: for a port shared with the service's own routes. It starts with
    /// `/`, does not end with one, and holds no `?`, `#` or whitespace. Defaults to none.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The application's version shown by `/acemq-info` (`version`, as Go and Java write it).
    /// Defaults to none (the key left out).
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// The service name shown by `/acemq-info` (`name`). Defaults to the connection's
    /// [`ConnectionOptions::service`](crate::ConnectionOptions::service).
    #[must_use]
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// The Prometheus recorder whose text `/acemq-metrics` serves (see
    /// [`install_prometheus_recorder`](super::install_prometheus_recorder)); the connection
    /// needs an [`observe::MetricsObserver`](crate::observe::MetricsObserver) for the library's
    /// own metrics to reach it. Without one, `/acemq-metrics` answers 404. Defaults to none.
    #[must_use]
    pub fn prometheus(mut self, handle: PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.bind.trim().is_empty() {
            return Err(Error::invalid(
                "the actuator's bind address must not be empty",
            ));
        }
        let p = &self.prefix;
        if !p.is_empty()
            && (!p.starts_with('/')
                || p.ends_with('/')
                || p.chars().any(|c| c == '?' || c == '#' || c.is_whitespace()))
        {
            return Err(Error::invalid(format!(
                "the actuator's path prefix {p:?} must start with '/', not end with one, and \
                 hold no '?', '#' or whitespace (e.g. \"/ops\")"
            )));
        }
        Ok(())
    }
}
