//! Connection options. Passwords are kept in [`Address`] and never shown.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::address::Address;
use crate::codec::{Codec, JsonCodec};
use crate::error::{Error, Result};
use crate::intercept::{ConsumeInterceptor, PublishInterceptor};
use crate::observe::{LogObserver, Observer};

/// The `frame_max` asked for by default: RabbitMQ's own default.
const DEFAULT_FRAME_MAX: u32 = 131_072;

/// AMQP 0-9-1's smallest `frame_max` (`frame-min-size`).
const MIN_FRAME_MAX: u32 = 4096;

/// Options for [`Connection`](crate::Connection): addresses, heartbeat, timeouts, reconnect
/// backoff, name, default codec and observer.
///
/// ```no_run
/// use acemq_amqp::ConnectionOptions;
/// use std::time::Duration;
/// # fn main() -> acemq_amqp::Result<()> {
/// let options = ConnectionOptions::new()
///     .address("amqp://guest:guest@rabbit-1:5672/")
///     .address("amqp://guest:guest@rabbit-2:5672/")
///     .heartbeat(Duration::from_secs(10))
///     .name("billing-service");
/// let connection = acemq_amqp::Connection::open_with(options)?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ConnectionOptions {
    pub(crate) urls: Vec<String>,
    pub(crate) heartbeat: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) channel_max: u16,
    pub(crate) frame_max: u32,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) name: Option<String>,
    pub(crate) service: String,
    pub(crate) max_unconfirmed_bytes: usize,
    pub(crate) codec: Arc<dyn Codec>,
    pub(crate) observer: Arc<dyn Observer>,
    /// Where the login comes from, asked at each connect (replaces the URLs' user and password).
    pub(crate) credentials: Option<crate::credentials::SharedSource>,
    /// Run around every publish, outermost first (run by `Publisher::publish_deferred`).
    pub(crate) publish_interceptors: Vec<Arc<dyn PublishInterceptor>>,
    /// Run around every handler, outermost first (run by `consume/worker/step.rs`).
    pub(crate) consume_interceptors: Vec<Arc<dyn ConsumeInterceptor>>,
    /// How `amqps://` addresses are checked and what they present.
    #[cfg(feature = "tls")]
    pub(crate) tls: super::tls::TlsSettings,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        ConnectionOptions {
            urls: Vec::new(),
            heartbeat: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            channel_max: 0,
            frame_max: DEFAULT_FRAME_MAX,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(30),
            name: None,
            service: "acemq".into(),
            max_unconfirmed_bytes: 8 << 20,
            codec: Arc::new(JsonCodec),
            observer: Arc::new(LogObserver),
            credentials: None,
            publish_interceptors: Vec::new(),
            consume_interceptors: Vec::new(),
            #[cfg(feature = "tls")]
            tls: super::tls::TlsSettings::default(),
        }
    }
}

impl fmt::Debug for ConnectionOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addresses: Vec<String> = self
            .urls
            .iter()
            .map(|u| match Address::parse(u) {
                Ok(a) => a.to_string(),
                Err(_) => "<invalid url>".to_string(),
            })
            .collect();
        let mut d = f.debug_struct("ConnectionOptions");
        d.field("addresses", &addresses)
            .field("heartbeat", &self.heartbeat)
            .field("connect_timeout", &self.connect_timeout)
            .field("channel_max", &self.channel_max)
            .field("frame_max", &self.frame_max)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("operation_timeout", &self.operation_timeout)
            .field("name", &self.name)
            .field("service", &self.service)
            .field("codec", &self.codec)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<source>"),
            )
            .field("publish_interceptors", &self.publish_interceptors.len())
            .field("consume_interceptors", &self.consume_interceptors.len());
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls.summary());
        d.finish()
    }
}

impl ConnectionOptions {
    /// Options with no address yet and every default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a broker address (`amqp://user:pass@host:port/vhost`). Several addresses form a
    /// cluster: each is tried in turn when connecting and reconnecting.
    #[must_use]
    pub fn address(mut self, url: impl Into<String>) -> Self {
        self.urls.push(url.into());
        self
    }

    /// The AMQP heartbeat: a silent peer is noticed after about two intervals. Defaults to 10 s;
    /// zero disables it (not recommended: a dead peer then goes unnoticed).
    #[must_use]
    pub fn heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// The most channels this connection may have open at once: the lower of this and the
    /// broker's own limit (RabbitMQ's default is 2047) is agreed in the handshake. Defaults to 0,
    /// which means the broker's limit. A [`Publisher`](crate::Publisher) holds a channel while
    /// connected, a running consumer one for its deliveries and its copy publisher's; opening
    /// one past the limit fails with an [`Error::Amqp`](crate::Error::Amqp) saying "no more
    /// channel ids are available", and the connection stays up.
    #[must_use]
    pub fn channel_max(mut self, channel_max: u16) -> Self {
        self.channel_max = channel_max;
        self
    }

    /// The largest AMQP frame this connection asks for in the handshake, in bytes (at least
    /// 4096, AMQP's minimum). Defaults to 131,072, RabbitMQ's own default `frame_max`.
    ///
    /// The broker and the client agree on the lower of their two values; amiquip does not say
    /// which was agreed, so this crate asks for a value it knows and checks every publish
    /// against it ([`Connection::frame_max`](crate::Connection::frame_max)). A body is split
    /// across frames, but a message's **header frame** (its properties and header table) must
    /// fit in one: a publish whose header frame is larger is refused before anything is sent
    /// ([`Error::FrameTooLarge`](crate::Error::FrameTooLarge)) — sent, RabbitMQ would close the
    /// whole connection (`FRAME_ERROR`). Raise it for larger headers when the broker allows
    /// them (its `frame_max` setting); never set it above the broker's own value, which would
    /// make the agreed limit lower than the one checked.
    #[must_use]
    pub fn frame_max(mut self, frame_max: u32) -> Self {
        self.frame_max = frame_max;
        self
    }

    /// Time allowed for the TCP connect and the AMQP handshake. Defaults to 10 s.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// First delay before reconnecting; it doubles per failed attempt, with jitter, up to
    /// [`backoff_max`](Self::backoff_max). Defaults to 100 ms.
    #[must_use]
    pub fn backoff_min(mut self, delay: Duration) -> Self {
        self.backoff_min = delay;
        self
    }

    /// Longest delay between reconnection attempts. Defaults to 10 s.
    #[must_use]
    pub fn backoff_max(mut self, delay: Duration) -> Self {
        self.backoff_max = delay;
        self
    }

    /// How long a declaration or channel open waits for a connection that is recovering.
    /// Defaults to 30 s.
    #[must_use]
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The connection's name, sent to the broker as the client property `information` (amiquip
    /// offers no `connection_name`) and shown by `rabbitmqctl list_connections client_properties`.
    /// Defaults to none.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The name of the service publishing, stamped on every message as
    /// `x-acemq-origin: {service}@{host}` (the host is this machine's hostname), as the Java and
    /// Go libraries stamp it. Defaults to `acemq`.
    #[must_use]
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = service.into();
        self
    }

    /// The most bytes this connection's publishers together may have handed over without an
    /// answer from the broker; a publish beyond it waits for room (up to its timeout). It keeps
    /// every publish out of amiquip's blocking path when the broker stops reading (a memory
    /// alarm, a stalled socket): amiquip's buffer is sized at twice this, at least 16 MiB. A
    /// single larger message goes alone. Defaults to 8 MiB.
    #[must_use]
    pub fn max_unconfirmed_bytes(mut self, bytes: usize) -> Self {
        self.max_unconfirmed_bytes = bytes;
        self
    }

    /// `{service}@{host}`: what [`service`](Self::service) stamps as `x-acemq-origin`.
    pub fn origin(&self) -> String {
        let host = gethostname::gethostname();
        let host = host.to_string_lossy();
        let host = if host.is_empty() { "localhost" } else { &host };
        format!("{}@{host}", self.service)
    }

    /// The default codec for publishers and consumers on this connection. Defaults to
    /// [`JsonCodec`].
    #[must_use]
    pub fn codec(mut self, codec: impl Codec + 'static) -> Self {
        self.codec = Arc::new(codec);
        self
    }

    /// The observer of this connection and everything on it. A panic in it is caught and
    /// logged (at error the first time); the engine's threads go on. Defaults to
    /// [`LogObserver`].
    #[must_use]
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = crate::observe::Guarded::wrap(observer);
        self
    }

    /// Trusts this certificate authority (PEM; a bundle of several is read in full) for
    /// `amqps://` addresses — **alone**: once one is given, the system's roots are not consulted
    /// (a broker with a certificate from a public authority is not your broker), unless
    /// [`tls_trust_system_roots(true)`](Self::tls_trust_system_roots). May be called more than
    /// once. With none, the system's roots are trusted. The URL's host (or
    /// [`tls_server_name`](Self::tls_server_name)) is checked against the broker's certificate.
    ///
    /// A PEM holding no certificate is refused when the connection is opened
    /// ([`Error::InvalidArgument`]), as is an authority carrying the family's development
    /// marker unless [`allow_development_certificates`](Self::allow_development_certificates).
    ///
    /// The family's TLS, in full: the URL's scheme decides whether the connection is encrypted
    /// (TLS settings with an `amqp://` address are refused, not ignored); TLS 1.2 at least; a
    /// failed handshake says which case it was ([`TlsError`](crate::TlsError)).
    ///
    /// ```no_run
    /// use acemq_amqp::ConnectionOptions;
    /// # fn main() -> acemq_amqp::Result<()> {
    /// let options = ConnectionOptions::new()
    ///     // Reached by address; its certificate is for rabbit.internal.
    ///     .address("amqps://10.0.0.7:5671/")
    ///     .tls_root_certificate_file("/etc/acemq/ca.crt")
    ///     .tls_client_certificate_files("/etc/acemq/client.crt", "/etc/acemq/client.key")
    ///     .tls_server_name("rabbit.internal")
    ///     .credentials(acemq_amqp::credentials::from_default_environment());
    /// let connection = acemq_amqp::Connection::open_with(options)?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.roots.push(super::tls::Pem::Bytes(pem.into()));
        self
    }

    /// As [`tls_root_certificate`](Self::tls_root_certificate), read from a PEM file each time
    /// a connection is made (a renewed authority is picked up by the next reconnect); a file
    /// that cannot be read is an [`Error::Io`] naming it.
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_root_certificate_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.roots.push(super::tls::Pem::File(path.into()));
        self
    }

    /// Whether the system's roots are trusted beside the authorities given with
    /// [`tls_root_certificate`](Self::tls_root_certificate). Defaults to no (with none given,
    /// the system's roots are all there is to trust, and are).
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_trust_system_roots(mut self, trust: bool) -> Self {
        self.tls.system_roots = trust;
        self
    }

    /// Presents this client certificate (PEM, with any intermediates after it) and its private
    /// key (PKCS#8 PEM, `-----BEGIN PRIVATE KEY-----`) to the broker, for mutual TLS (RabbitMQ's
    /// `ssl_options.verify = verify_peer` with `fail_if_no_peer_cert = true`). A PEM that
    /// cannot be read, a key of another format or one that is not the certificate's is refused
    /// when the connection is opened ([`Error::InvalidArgument`]).
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((
            super::tls::Pem::Bytes(certificate_pem.into()),
            super::tls::Pem::Bytes(key_pem.into()),
        ));
        self
    }

    /// As [`tls_client_certificate`](Self::tls_client_certificate), read from PEM files each
    /// time a connection is made (a renewed certificate is picked up by the next reconnect).
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_client_certificate_files(
        mut self,
        certificate: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls.client = Some((
            super::tls::Pem::File(certificate.into()),
            super::tls::Pem::File(key.into()),
        ));
        self
    }

    /// The name checked against the broker's certificate and sent as SNI, instead of the URL's
    /// host: for a broker reached by IP address, through a tunnel, or at a container's internal
    /// name. Defaults to the URL's host.
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls.server_name = Some(name.into());
        self
    }

    /// Whether certificates carrying the family's development marker
    /// (`ACEMQ DEVELOPMENT ONLY - DO NOT TRUST`, stamped by [`test_ca`](crate::test_ca) and the
    /// other libraries' generators) are accepted: the broker's, and the authorities and client
    /// certificate given here. Defaults to no, as in every library of the family: a refused
    /// broker certificate fails the connect with a [`TlsError`](crate::TlsError) of
    /// [`TlsFailure::DevelopmentCertificate`](crate::TlsFailure::DevelopmentCertificate). Say
    /// yes on a developer's machine or in a test only: the signing key of a generated authority
    /// is wherever the certificates were committed.
    #[cfg(feature = "tls")]
    #[must_use]
    pub fn allow_development_certificates(mut self, allow: bool) -> Self {
        self.tls.allow_development = allow;
        self
    }

    /// Adds a publish interceptor, run around every publish of this connection's publishers,
    /// inside those added before it (see [`intercept`](crate::intercept)).
    #[must_use]
    pub fn intercept_publish(mut self, interceptor: impl PublishInterceptor) -> Self {
        self.publish_interceptors.push(Arc::new(interceptor));
        self
    }

    /// Adds a consume interceptor, run around every handler of this connection's consumers,
    /// inside those added before it (see [`intercept`](crate::intercept)).
    #[must_use]
    pub fn intercept_consume(mut self, interceptor: impl ConsumeInterceptor) -> Self {
        self.consume_interceptors.push(Arc::new(interceptor));
        self
    }

    /// Takes the broker login from `source` (see [`credentials`](crate::credentials)), asked
    /// each time a connection is made, instead of the addresses' user and password. Defaults
    /// to the addresses' (`guest`/`guest` when they have none).
    #[must_use]
    pub fn credentials(mut self, source: impl crate::credentials::CredentialsSource) -> Self {
        self.credentials = Some(Arc::new(source));
        self
    }

    /// Checks the options and parses the addresses.
    pub(crate) fn validate(&self) -> Result<Vec<Address>> {
        if self.urls.is_empty() {
            return Err(Error::invalid("no broker address given"));
        }
        if self.max_unconfirmed_bytes == 0 {
            return Err(Error::invalid("max_unconfirmed_bytes must be at least 1"));
        }
        if self.service.is_empty() {
            return Err(Error::invalid(
                "the service name must not be empty (it is stamped as x-acemq-origin)",
            ));
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return Err(Error::invalid(
                "backoff_min must be above zero and at most backoff_max",
            ));
        }
        if self.frame_max < MIN_FRAME_MAX {
            return Err(Error::invalid(format!(
                "frame_max {} is below AMQP's minimum of {MIN_FRAME_MAX} bytes",
                self.frame_max
            )));
        }
        if self.heartbeat.as_secs() > u64::from(u16::MAX) {
            return Err(Error::invalid("heartbeat is over 65535 s"));
        }
        let addresses = self
            .urls
            .iter()
            .map(|u| Address::parse(u))
            .collect::<Result<Vec<_>>>()?;
        #[cfg(not(feature = "tls"))]
        if let Some(a) = addresses.iter().find(|a| a.tls) {
            return Err(Error::invalid(format!(
                "{a} needs TLS: build acemq-amqp with the `tls` feature"
            )));
        }
        #[cfg(feature = "tls")]
        if self.tls.describes_tls() {
            if let Some(a) = addresses.iter().find(|a| !a.tls) {
                return Err(Error::invalid(format!(
                    "TLS settings are given but {a} is not encrypted: nothing here can make a \
                     plaintext connection safe; change the address to amqps:// or take the TLS \
                     settings off"
                )));
            }
        }
        #[cfg(feature = "tls")]
        if addresses.iter().any(|a| a.tls) {
            // Every PEM read and checked now, so a bad one fails the open, not each reconnect.
            self.tls.connector()?;
        }
        if let Some(other) = addresses
            .iter()
            .find(|a| a.transport != addresses[0].transport)
        {
            let scheme = |a: &Address| a.transport.unwrap_or("amqp").to_string();
            return Err(Error::invalid(format!(
                "a connection's addresses are all of one transport, not {}:// and {}://: \
                 memory://name is an in-process broker, not a node of the cluster the other \
                 addresses name",
                scheme(&addresses[0]),
                scheme(other)
            )));
        }
        Ok(addresses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_hides_the_password() {
        let a = Address::parse("amqp://bob:s3cr%40t@broker:5673/prod%2fone").unwrap();
        assert_eq!(a.user, "bob");
        assert_eq!(a.password, "s3cr@t");
        assert_eq!(a.port, 5673);
        assert_eq!(a.vhost, "prod/one");
        let shown = format!("{a} {a:?}");
        assert!(!shown.contains("s3cr"), "{shown}");
        assert!(shown.contains("bob@broker:5673"), "{shown}");
        let opts = ConnectionOptions::new().address("amqp://bob:hunter2@h/");
        assert!(!format!("{opts:?}").contains("hunter2"));
    }
}
