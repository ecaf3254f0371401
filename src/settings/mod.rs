//! Settings from the environment (`ACEMQ_*`) and an optional TOML file, with the family's
//! names, turned into this crate's options.
//!
//! The variables are the Python package's (`acemq_fastapi.settings`, pydantic-settings): the
//! prefix `ACEMQ_` and `__` between levels — `ACEMQ_URL`, `ACEMQ_CONSUMER__PREFETCH`,
//! `ACEMQ_CONSUMER__RETRY__KIND`, `ACEMQ_TLS__CERTIFICATE_AUTHORITY` — so one deployment's
//! environment configures a Python and a Rust service alike. Where this crate has a knob the
//! family lacks, it is named in the same style (`ACEMQ_FRAME_MAX`, `ACEMQ_ACTUATOR__ADDRESS`).
//! **Every variable, its TOML key, default and accepted forms are in one table:
//! `docs/settings.md`** (<https://github.com/AceMQ-Company/acemq-rust-amqp/blob/main/docs/settings.md>),
//! with the family's variables this crate does not read and why.
//!
//! ```no_run
//! use acemq_amqp::settings::Settings;
//! use acemq_amqp::{Connection, Message, Outcome};
//!
//! # fn main() -> acemq_amqp::Result<()> {
//! // ACEMQ_URL=amqps://broker.internal/ ACEMQ_USERNAME=billing ACEMQ_PASSWORD=…
//! // ACEMQ_CONSUMER__PREFETCH=64 ACEMQ_CONSUMER__RETRY__ENABLED=true …
//! let settings = Settings::load(None)?; // ACEMQ_CONFIG_FILE, if set, then the environment
//! let connection = Connection::open_with(settings.connection_options()?)?;
//! let publisher = connection.publisher_with(settings.publisher_options())?;
//! let consumer = connection
//!     .consumer("orders", settings.consumer_options())?
//!     .start(|_: &Message| Ok(Outcome::Accept))?;
//! # let _ = publisher;
//! // … on SIGTERM: consumer.close() waits up to settings.drain_timeout() for running handlers.
//! consumer.close()?;
//! # Ok(()) }
//! ```
//!
//! # Where values come from
//!
//! [`Settings::default`] holds the library's defaults. [`Settings::load`] reads, in order, each
//! later one overriding the earlier: the defaults; the TOML file (the path given, or the one
//! `ACEMQ_CONFIG_FILE` names — the variable wins over the argument, as the environment wins
//! over the file; feature `toml`); the `ACEMQ_*` variables of the process. A variable set to
//! the empty string counts as not set. [`Settings::from_vars`] reads variables given as pairs,
//! without the process's environment (for tests), [`Settings::from_env`] the process's alone.
//!
//! The file holds the same keys, nested as the variables are: `ACEMQ_URL` is `url`,
//! `ACEMQ_CONSUMER__RETRY__KIND` is `kind` under `[consumer.retry]`:
//!
//! ```toml
//! url = "amqps://broker.internal:5671/"
//! client_name = "billing"
//! confirm_timeout = "10s"
//!
//! [consumer]
//! prefetch = 64
//! shutdown_timeout = "PT20S"
//!
//! [consumer.retry]
//! enabled = true
//! kind = "exponential"
//! max_attempts = 5
//!
//! [tls]
//! certificate_authority = "/etc/acemq/ca.pem"
//!
//! [actuator]
//! address = "0.0.0.0:9464"
//! ```
//!
//! # Refusals and warnings
//!
//! Every value is read when the settings are loaded, and a bad one is an
//! [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming the variable (or the file's
//! key) and the forms it takes: `ACEMQ_CONSUMER__PREFETCH: `abc` is not a whole number from 1
//! to 65535`. A duration is seconds (`30`, `2.5`), a number with a unit (`500ms`, `30s`, `5m`,
//! `1h`), ISO 8601 (`PT30S`) or `H:MM:SS`. An `ACEMQ_` variable (or a file's key) that is no
//! setting is logged at warn with the setting it was probably meant to be, and otherwise
//! ignored: a typo is told, not fatal.
//!
//! Secrets — `ACEMQ_PASSWORD`, a password in `ACEMQ_URL`, `ACEMQ_TLS__CLIENT_KEY_PASSWORD` — are
//! never shown: `Debug` prints `<redacted>` and the URLs without their password, and no
//! refusal repeats a secret's value.

mod convert;
mod keys;
mod load;
pub(crate) mod parse;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::connection::Address;

/// A secret read from the settings (a password). `Debug` shows `<redacted>`; there is no
/// `Display`. [`expose`](Self::expose) gives the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret's value.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Everything the settings say (see the [module docs](self)): plain data, each field public,
/// each named after its variable. [`Default`] holds the library's defaults.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct Settings {
    /// `ACEMQ_URL`: the broker's addresses, tried in turn (one, or several separated by commas:
    /// a cluster — ours; the family reads one). Defaults to the family's
    /// `amqp://localhost:5672/`.
    pub urls: Vec<String>,
    /// `ACEMQ_USERNAME`: the login, replacing the URLs' (with `password`; both or neither).
    /// Defaults to none: the URLs' own (`guest`/`guest` when they have none).
    pub username: Option<String>,
    /// `ACEMQ_PASSWORD`: the login's password (with `username`). Defaults to none.
    pub password: Option<Secret>,
    /// `ACEMQ_VIRTUAL_HOST`: the vhost, replacing the URLs' paths. Defaults to none (the URLs').
    pub virtual_host: Option<String>,
    /// `ACEMQ_CLIENT_NAME`: the connection's name and the service stamped in `x-acemq-origin`
    /// (`{client_name}@{host}`). Defaults to none (no name; `acemq@{host}`).
    pub client_name: Option<String>,
    /// `ACEMQ_CONNECTION_TIMEOUT`: the TCP connect and the AMQP handshake. Defaults to 10 s.
    pub connection_timeout: Duration,
    /// `ACEMQ_HEARTBEAT` (Ruby's `heartbeat`): the AMQP heartbeat, whole seconds, 0 for none.
    /// Defaults to 10 s.
    pub heartbeat: Duration,
    /// `ACEMQ_CONFIRM_TIMEOUT`: how long a publish waits for room, recovery and its confirm.
    /// Defaults to 30 s.
    pub confirm_timeout: Duration,
    /// `ACEMQ_MAX_OUTSTANDING_PUBLISHES`: a publisher's window of publishes awaiting a confirm.
    /// Defaults to 1024.
    pub max_outstanding_publishes: usize,
    /// `ACEMQ_PUBLISHER_CONFIRMS`: whether a publisher made from
    /// [`publisher_options`](Self::publisher_options) waits for the broker's confirms; `false`
    /// publishes at most once ([`PublisherOptions::confirms`](crate::PublisherOptions::confirms)).
    /// The library's own copies (retries, dead letters, the outbox relay, …) are confirmed
    /// whatever this says. Defaults to true.
    pub publisher_confirms: bool,
    /// `ACEMQ_FORMAT`: the connection's codec, by name as
    /// [`codecs::by_name`](crate::codecs::by_name) reads it: `json`, `bytes`, `text` (or
    /// `string`), and with their features `yaml`, `toml`, `xml`, in any case (kept in its
    /// canonical form: `String` is `text`). Made by [`codec`](Self::codec). Defaults to `json`.
    pub format: String,
    /// `ACEMQ_CHANNEL_MAX` (ours): the most channels at once; 0 for the broker's limit.
    /// Defaults to 0.
    pub channel_max: u16,
    /// `ACEMQ_FRAME_MAX` (ours): the largest frame asked for, in bytes. Defaults to 131072.
    pub frame_max: u32,
    /// `ACEMQ_BACKOFF_MIN` (ours): the first wait before reconnecting. Defaults to 100 ms.
    pub backoff_min: Duration,
    /// `ACEMQ_BACKOFF_MAX` (ours): the longest wait between reconnects. Defaults to 10 s.
    pub backoff_max: Duration,
    /// `ACEMQ_OPERATION_TIMEOUT` (ours): how long a declaration or a channel open waits for a
    /// recovering connection. Defaults to 30 s.
    pub operation_timeout: Duration,
    /// `ACEMQ_MAX_UNCONFIRMED_BYTES` (ours): the bytes a connection's publishers may have
    /// handed over unanswered. Defaults to 8 MiB.
    pub max_unconfirmed_bytes: usize,
    /// `ACEMQ_CONSUMER__*`: what every consumer starts with.
    pub consumer: ConsumerSettings,
    /// `ACEMQ_TLS__*`: how an `amqps://` broker is checked and what is presented to it.
    pub tls: TlsSettings,
    /// `ACEMQ_ACTUATOR__*` (ours): where the actuator listens.
    pub actuator: ActuatorSettings,
}

/// `ACEMQ_CONSUMER__*`: what every consumer starts with.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ConsumerSettings {
    /// `ACEMQ_CONSUMER__PREFETCH` (or Python's `ACEMQ_PREFETCH`): unsettled deliveries at once,
    /// 1 to 65535. Defaults to 32.
    pub prefetch: u16,
    /// `ACEMQ_CONSUMER__CONCURRENCY`: worker threads running the handler. Defaults to 1.
    pub concurrency: usize,
    /// `ACEMQ_CONSUMER__SHUTDOWN_TIMEOUT`: how long closing waits for running handlers, and the
    /// service's drain ([`Settings::drain_timeout`]). Defaults to the family's 20 s (a bare
    /// [`ConsumerOptions`](crate::ConsumerOptions) waits 30 s): it fits inside Kubernetes'
    /// 30 s grace with time to close the connection.
    pub shutdown_timeout: Duration,
    /// `ACEMQ_CONSUMER__DECLARE`: declare the failure topology (`{queue}.dlq`, `.parked`, the
    /// rungs) when the consumer is made. Defaults to true.
    pub declare: bool,
    /// `ACEMQ_CONSUMER__RETRY__*`: the retry ladder.
    pub retry: RetrySettings,
}

/// The two shapes of the family's retry policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryKind {
    /// [`RetryPolicy::exponential`](crate::RetryPolicy::exponential): each wait doubles (by
    /// the multiplier), with ±20 % jitter.
    Exponential,
    /// [`RetryPolicy::fixed`](crate::RetryPolicy::fixed): the initial delay every time, no
    /// jitter.
    Fixed,
}

/// `ACEMQ_CONSUMER__RETRY__*`: the retry ladder. Off unless enabled, as in the family (a ladder
/// declares rung queues; a service should ask for them).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RetrySettings {
    /// `…__ENABLED`: build a policy at all; off is [`RetryPolicy::none`](crate::RetryPolicy::none).
    /// Defaults to false.
    pub enabled: bool,
    /// `…__KIND`: `exponential` or `fixed`. Defaults to exponential.
    pub kind: RetryKind,
    /// `…__MAX_ATTEMPTS`: attempts in all, the first included. Defaults to 3.
    pub max_attempts: u32,
    /// `…__INITIAL_DELAY`: the wait before the second attempt (a fixed policy's every wait).
    /// Defaults to 1 s.
    pub initial_delay: Duration,
    /// `…__MAX_DELAY`: the longest wait, 0 for no ceiling (exponential only). Defaults to 60 s.
    pub max_delay: Duration,
    /// `…__MULTIPLIER` (Java's, .NET's, Ruby's): the factor each wait grows by, at least 1
    /// (exponential only). Defaults to none: 2.
    pub multiplier: Option<f64>,
    /// `…__JITTER` (Java's, .NET's, Ruby's): 0 to 1. Defaults to none: 0.2 exponential, 0
    /// fixed.
    pub jitter: Option<f64>,
    /// `…__GIVE_UP_AFTER`: a message older than this is dead-lettered whatever its attempt.
    /// Defaults to none.
    pub give_up_after: Option<Duration>,
    /// `…__BROKER_WAIT_THRESHOLD` (Ruby's, .NET's; Python's `…__WAIT_IN_BROKER_FROM`): waits
    /// at least this long are spent on a broker rung. Defaults to 30 s.
    pub broker_wait_threshold: Duration,
    /// `…__QUORUM_RUNGS` (ours): rungs as quorum queues, not the family's topology (see
    /// [`RetryPolicy::quorum_rungs`](crate::RetryPolicy::quorum_rungs)). Defaults to false.
    pub quorum_rungs: bool,
}

/// `ACEMQ_TLS__*`: for `amqps://` URLs (feature `tls`; TLS settings with an `amqp://` URL are
/// refused, not ignored).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsSettings {
    /// `…__CERTIFICATE_AUTHORITY`: a PEM file of the authorities trusted, alone. Defaults to
    /// none: the system's roots.
    pub certificate_authority: Option<PathBuf>,
    /// `…__CLIENT_CERTIFICATE`: a PEM certificate presented to the broker (with
    /// `client_key`). Defaults to none.
    pub client_certificate: Option<PathBuf>,
    /// `…__CLIENT_KEY`: its PKCS#8 PEM key, in a file of its own. Defaults to none.
    pub client_key: Option<PathBuf>,
    /// `…__SERVER_NAME`: the name checked and sent as SNI instead of the URL's host.
    /// Defaults to none.
    pub server_name: Option<String>,
    /// `…__ALLOW_DEVELOPMENT_CERTIFICATES`: accept certificates carrying the family's
    /// development marker. Defaults to false.
    pub allow_development_certificates: bool,
    /// `…__TRUST_SYSTEM_ROOTS` (ours): trust the system's roots beside the given authority.
    /// Defaults to false.
    pub trust_system_roots: bool,
}

impl TlsSettings {
    /// Whether anything here is set (refused with an `amqp://` URL).
    pub(crate) fn is_set(&self) -> bool {
        *self != TlsSettings::default()
    }
}

/// `ACEMQ_ACTUATOR__*` (ours): where the actuator (feature `actuator`) listens.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActuatorSettings {
    /// `…__ADDRESS`: `host:port`. Defaults to `127.0.0.1:9464`.
    pub address: String,
    /// `…__PREFIX`: a path the endpoints are served under (`/ops`). Defaults to none.
    pub prefix: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            urls: vec!["amqp://localhost:5672/".to_string()],
            username: None,
            password: None,
            virtual_host: None,
            client_name: None,
            connection_timeout: Duration::from_secs(10),
            heartbeat: Duration::from_secs(10),
            confirm_timeout: Duration::from_secs(30),
            max_outstanding_publishes: 1024,
            publisher_confirms: true,
            format: "json".to_string(),
            channel_max: 0,
            frame_max: 131_072,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(30),
            max_unconfirmed_bytes: 8 << 20,
            consumer: ConsumerSettings::default(),
            tls: TlsSettings::default(),
            actuator: ActuatorSettings::default(),
        }
    }
}

impl Default for ConsumerSettings {
    fn default() -> Self {
        ConsumerSettings {
            prefetch: 32,
            concurrency: 1,
            shutdown_timeout: Duration::from_secs(20),
            declare: true,
            retry: RetrySettings::default(),
        }
    }
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            enabled: false,
            kind: RetryKind::Exponential,
            max_attempts: 3,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            multiplier: None,
            jitter: None,
            give_up_after: None,
            broker_wait_threshold: crate::DEFAULT_BROKER_WAIT_THRESHOLD,
            quorum_rungs: false,
        }
    }
}

impl Default for ActuatorSettings {
    fn default() -> Self {
        ActuatorSettings {
            address: "127.0.0.1:9464".to_string(),
            prefix: String::new(),
        }
    }
}

/// A URL as `Debug` shows it: without its password.
fn shown_url(url: &str) -> String {
    match Address::parse(url) {
        Ok(a) => a.to_string(),
        Err(_) => "<invalid url>".to_string(),
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| shown_url(u)).collect();
        f.debug_struct("Settings")
            .field("urls", &urls)
            .field("username", &self.username)
            .field("password", &self.password)
            .field("virtual_host", &self.virtual_host)
            .field("client_name", &self.client_name)
            .field("connection_timeout", &self.connection_timeout)
            .field("heartbeat", &self.heartbeat)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("max_outstanding_publishes", &self.max_outstanding_publishes)
            .field("publisher_confirms", &self.publisher_confirms)
            .field("format", &self.format)
            .field("channel_max", &self.channel_max)
            .field("frame_max", &self.frame_max)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("operation_timeout", &self.operation_timeout)
            .field("max_unconfirmed_bytes", &self.max_unconfirmed_bytes)
            .field("consumer", &self.consumer)
            .field("tls", &self.tls)
            .field("actuator", &self.actuator)
            .finish()
    }
}
