//! A development certificate authority for tests: an authority, a broker certificate and a
//! client certificate, written as PEM with a `rabbitmq.conf` pointing a broker at them — the
//! family's `devcerts` (Python `devcerts.py`, Go's `acemq-certs`), for a TLS broker in a test or
//! on a laptop, never in production.
//!
//! What is written, as the family writes it:
//!
//! - files `ca.crt`, `ca.key`, `server.crt`, `server.key`, `client.crt`, `client.key` (PEM; keys
//!   PKCS#8, mode 0600 on Unix) and, unless turned off, `rabbitmq.conf`;
//! - ECDSA P-256 keys, SHA-256 signatures;
//! - every subject carries [`DEVELOPMENT_MARKER`] as its organisation (`O=`); the authority is
//!   `CN=AceMQ development CA` (CA, path length 0, key usage cert-sign and CRL-sign); the broker
//!   certificate `CN=<broker host>` for server authentication, valid for the host (an IP
//!   address as an address) and, for a name, also `localhost`, `rabbitmq`, `127.0.0.1` and
//!   `::1`; the client certificate `CN=acemq-client` for client authentication;
//! - valid from an hour ago (clocks differ between a container and its host) for 30 days unless
//!   told otherwise.
//!
//! Trust the authority with
//! [`ConnectionOptions::tls_root_certificate`](crate::ConnectionOptions::tls_root_certificate)
//! (feature `tls`) **and** say that development certificates are meant with
//! [`ConnectionOptions::allow_development_certificates(true)`](crate::ConnectionOptions::allow_development_certificates):
//! as in every library of the family, a certificate carrying the marker — an authority given
//! to trust, a client certificate, or the certificate a broker presents — is refused otherwise
//! (the marker is found in the certificate's encoding, the subject's or the issuer's name, as
//! Python's `is_development_certificate` finds it). That is the marker's whole point: a
//! certificate whose signing key sits in a repository cannot quietly end up trusted in
//! production.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::error::{Error, Result};

/// In the organisation of every certificate written here (the family's marker).
pub const DEVELOPMENT_MARKER: &str = crate::connection::DEVELOPMENT_MARKER;
/// The authority's common name.
pub const AUTHORITY_NAME: &str = "AceMQ development CA";
/// The client certificate's common name.
pub const CLIENT_NAME: &str = "acemq-client";
/// How long certificates last unless told otherwise.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// Where a broker finds the files unless told otherwise (inside its container).
pub const DEFAULT_BROKER_CERTIFICATE_PATH: &str = "/certs";

/// What to generate.
#[derive(Clone, Debug)]
pub struct TestCa {
    broker_host: String,
    validity: Duration,
    broker_certificate_path: String,
    broker_configuration: bool,
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa {
            broker_host: "localhost".into(),
            validity: DEFAULT_VALIDITY,
            broker_certificate_path: DEFAULT_BROKER_CERTIFICATE_PATH.into(),
            broker_configuration: true,
        }
    }
}

/// The PEM texts made, and where they were written.
#[derive(Clone)]
pub struct Generated {
    /// The directory written to.
    pub directory: PathBuf,
    /// `ca.crt`.
    pub ca_cert: String,
    /// `ca.key` (PKCS#8).
    pub ca_key: String,
    /// `server.crt`.
    pub server_cert: String,
    /// `server.key` (PKCS#8).
    pub server_key: String,
    /// `client.crt`.
    pub client_cert: String,
    /// `client.key` (PKCS#8).
    pub client_key: String,
    /// The files written, in order.
    pub files: Vec<PathBuf>,
}

impl std::fmt::Debug for Generated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys stay out of logs, development ones included.
        f.debug_struct("Generated")
            .field("directory", &self.directory)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::invalid(format!("could not make the {what}: {e}"))
}

fn subject(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, DEVELOPMENT_MARKER);
    dn
}

impl TestCa {
    /// Defaults: broker host `localhost`, 30 days, broker paths under `/certs`, with a
    /// `rabbitmq.conf`.
    pub fn new() -> TestCa {
        TestCa::default()
    }

    /// The name (or IP address) the broker certificate is for.
    pub fn broker_host(mut self, host: impl Into<String>) -> Self {
        self.broker_host = host.into();
        self
    }

    /// How long the certificates last (at least a day).
    pub fn validity(mut self, validity: Duration) -> Self {
        self.validity = validity;
        self
    }

    /// Where the broker finds the files, for `rabbitmq.conf`.
    pub fn broker_certificate_path(mut self, path: impl Into<String>) -> Self {
        self.broker_certificate_path = path.into();
        self
    }

    /// Whether to write `rabbitmq.conf` (default yes).
    pub fn broker_configuration(mut self, write: bool) -> Self {
        self.broker_configuration = write;
        self
    }

    /// Makes the three certificates and writes them to `directory` (created if missing).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a validity under a day or a host that cannot be named in
    /// a certificate; [`Error::Io`] when a file cannot be written.
    pub fn generate(&self, directory: impl AsRef<Path>) -> Result<Generated> {
        if self.validity < Duration::from_secs(24 * 3600) {
            return Err(Error::invalid("a certificate has to last at least a day"));
        }
        let now = time::OffsetDateTime::now_utc();
        let not_before = now - time::Duration::hours(1);
        let not_after = now + time::Duration::seconds(self.validity.as_secs() as i64);
        let dated = |mut p: CertificateParams| {
            p.not_before = not_before;
            p.not_after = not_after;
            p
        };

        let ca_key = KeyPair::generate().map_err(|e| failed("authority key", e))?;
        let mut ca = dated(CertificateParams::default());
        ca.distinguished_name = subject(AUTHORITY_NAME);
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let ca_cert = ca
            .self_signed(&ca_key)
            .map_err(|e| failed("authority", e))?;
        let ca_pem = ca_cert.pem();
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = Issuer::new(ca, ca_key);

        let leaf = |common_name: &str,
                    purpose: ExtendedKeyUsagePurpose,
                    names: Vec<SanType>|
         -> Result<(String, String)> {
            let key = KeyPair::generate().map_err(|e| failed("key", e))?;
            let mut p = dated(CertificateParams::default());
            p.distinguished_name = subject(common_name);
            p.is_ca = IsCa::ExplicitNoCa;
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            p.extended_key_usages = vec![purpose];
            p.subject_alt_names = names;
            let cert = p
                .signed_by(&key, &issuer)
                .map_err(|e| failed(common_name, e))?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_pem, server_key_pem) = leaf(
            &self.broker_host,
            ExtendedKeyUsagePurpose::ServerAuth,
            self.names()?,
        )?;
        let (client_pem, client_key_pem) =
            leaf(CLIENT_NAME, ExtendedKeyUsagePurpose::ClientAuth, Vec::new())?;

        let dir = directory.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| Error::Io {
            context: format!("creating {}", dir.display()),
            source: e,
        })?;
        let mut files = Vec::new();
        for (name, text, secret) in [
            ("ca.crt", &ca_pem, false),
            ("ca.key", &ca_key_pem, true),
            ("server.crt", &server_pem, false),
            ("server.key", &server_key_pem, true),
            ("client.crt", &client_pem, false),
            ("client.key", &client_key_pem, true),
        ] {
            files.push(write(&dir.join(name), text, secret)?);
        }
        if self.broker_configuration {
            let conf = broker_configuration(&self.broker_certificate_path);
            files.push(write(&dir.join("rabbitmq.conf"), &conf, false)?);
        }
        Ok(Generated {
            directory: dir,
            ca_cert: ca_pem,
            ca_key: ca_key_pem,
            server_cert: server_pem,
            server_key: server_key_pem,
            client_cert: client_pem,
            client_key: client_key_pem,
            files,
        })
    }

    fn names(&self) -> Result<Vec<SanType>> {
        let dns = |n: &str| {
            n.try_into()
                .map(SanType::DnsName)
                .map_err(|e| failed("broker certificate's names", e))
        };
        if let Ok(ip) = self.broker_host.parse::<std::net::IpAddr>() {
            return Ok(vec![SanType::IpAddress(ip)]);
        }
        let mut names = vec![dns(&self.broker_host)?];
        for extra in ["localhost", "rabbitmq"] {
            if self.broker_host != extra {
                names.push(dns(extra)?);
            }
        }
        names.push(SanType::IpAddress([127, 0, 0, 1].into()));
        names.push(SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()));
        Ok(names)
    }
}

fn write(path: &Path, text: &str, secret: bool) -> Result<PathBuf> {
    let io = |e| Error::Io {
        context: format!("writing {}", path.display()),
        source: e,
    };
    std::fs::write(path, text).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if secret { 0o600 } else { 0o644 };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io)?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    Ok(path.to_path_buf())
}

/// A `rabbitmq.conf` pointing a broker at the files under `certificate_path` (TLS on 5671 beside
/// plain 5672; a client certificate checked when presented, not required).
pub fn broker_configuration(certificate_path: &str) -> String {
    format!(
        "# Written by acemq_amqp::test_ca. Development only.\n\
         listeners.tcp.default = 5672\n\
         listeners.ssl.default = 5671\n\
         \n\
         ssl_options.cacertfile = {certificate_path}/ca.crt\n\
         ssl_options.certfile   = {certificate_path}/server.crt\n\
         ssl_options.keyfile    = {certificate_path}/server.key\n\
         \n\
         # A client that presents a certificate has it checked; one that presents none\n\
         # logs in with a password. Setting fail_if_no_peer_cert to true is what turns\n\
         # this into mutual TLS.\n\
         ssl_options.verify               = verify_peer\n\
         ssl_options.fail_if_no_peer_cert = false\n"
    )
}
