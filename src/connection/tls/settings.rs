//! The TLS settings of a connection and the connector made from them for each connect.

use std::path::{Path, PathBuf};

use crate::connection::marker::{is_development_certificate, DEVELOPMENT_MARKER};
use crate::error::{Error, Result};

/// The largest certificate or key file read (a bundle of a few hundred authorities fits).
const MAX_PEM_FILE: u64 = 4 << 20;

/// A PEM text given as bytes or as a file read when the connection is opened.
#[derive(Clone)]
pub(crate) enum Pem {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl Pem {
    fn read(&self, what: &str) -> Result<Vec<u8>> {
        match self {
            Pem::Bytes(b) => Ok(b.clone()),
            Pem::File(path) => read_bounded(path, what),
        }
    }

    fn describe(&self, what: &str) -> String {
        match self {
            Pem::Bytes(_) => what.to_string(),
            Pem::File(path) => format!("{what} {}", path.display()),
        }
    }
}

fn read_bounded(path: &Path, what: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let io = |e| Error::Io {
        context: format!("reading the {what} {}", path.display()),
        source: e,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(Error::invalid(format!(
            "TLS: the {what} {} is over {} MiB: not a PEM certificate or key",
            path.display(),
            MAX_PEM_FILE >> 20
        )));
    }
    Ok(bytes)
}

/// The TLS part of [`ConnectionOptions`](crate::ConnectionOptions).
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    pub(crate) roots: Vec<Pem>,
    pub(crate) system_roots: bool,
    pub(crate) client: Option<(Pem, Pem)>,
    pub(crate) server_name: Option<String>,
    pub(crate) allow_development: bool,
}

impl TlsSettings {
    /// Whether anything here is about an encrypted connection (refused on `amqp://`).
    pub(crate) fn describes_tls(&self) -> bool {
        !self.roots.is_empty()
            || self.system_roots
            || self.client.is_some()
            || self.server_name.is_some()
            || self.allow_development
    }

    /// What `Debug` shows: which settings are made, never a key.
    pub(crate) fn summary(&self) -> String {
        let mut parts = Vec::new();
        if !self.roots.is_empty() {
            parts.push(format!("roots={}", self.roots.len()));
        }
        if self.system_roots || self.roots.is_empty() {
            parts.push("system_roots".to_string());
        }
        if self.client.is_some() {
            parts.push("client_certificate".to_string());
        }
        if let Some(name) = &self.server_name {
            parts.push(format!("server_name={name}"));
        }
        if self.allow_development {
            parts.push("development_certificates_allowed".to_string());
        }
        parts.join(", ")
    }

    /// The connector for one connect: the files read now (a renewed certificate is picked up by
    /// the next reconnect), every PEM checked, TLS 1.2 at least.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] naming the setting for a PEM that holds no certificate, a key
    /// that is not PKCS#8 or does not match its certificate, a server name that cannot be one,
    /// or a certificate given here carrying the development marker (unless allowed);
    /// [`Error::Io`] for a file that cannot be read.
    pub(crate) fn connector(&self) -> Result<native_tls::TlsConnector> {
        let mut builder = native_tls::TlsConnector::builder();
        builder.min_protocol_version(Some(native_tls::Protocol::Tlsv12));
        // A given authority is trusted alone unless the system's are asked for too.
        builder.disable_built_in_roots(!self.roots.is_empty() && !self.system_roots);
        for root in &self.roots {
            let what = root.describe("certificate authority (tls_root_certificate)");
            let pem = root.read("certificate authority")?;
            for cert in certificates(&pem, &what)? {
                self.refuse_development(&cert, &what)?;
                builder.add_root_certificate(cert);
            }
        }
        if let Some((cert, key)) = &self.client {
            let what = cert.describe("client certificate (tls_client_certificate)");
            let cert_pem = cert.read("client certificate")?;
            let key_pem = key.read("client key")?;
            for c in certificates(&cert_pem, &what)? {
                self.refuse_development(&c, &what)?;
            }
            let key_what = key.describe("client key");
            let key_pem = trim_start(&key_pem);
            if !key_pem.starts_with(b"-----BEGIN PRIVATE KEY-----") {
                return Err(Error::invalid(format!(
                    "TLS: the {key_what} is not a PKCS#8 PEM private key (-----BEGIN PRIVATE \
                     KEY-----); convert it with `openssl pkcs8 -topk8 -nocrypt -in key.pem`"
                )));
            }
            let identity = native_tls::Identity::from_pkcs8(&cert_pem, key_pem).map_err(|e| {
                Error::invalid(format!(
                    "TLS: the {what} with the {key_what} cannot be read: {e}"
                ))
            })?;
            builder.identity(identity);
        }
        if let Some(name) = &self.server_name {
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '/') {
                return Err(Error::invalid(format!(
                    "TLS: tls_server_name {name:?} is not a host name or an IP address"
                )));
            }
        }
        builder.build().map_err(|e| {
            Error::invalid(format!(
                "TLS: the settings cannot be used (is the client key the one of the client \
                 certificate?): {e}"
            ))
        })
    }

    fn refuse_development(&self, cert: &native_tls::Certificate, what: &str) -> Result<()> {
        if self.allow_development {
            return Ok(());
        }
        let der = cert
            .to_der()
            .map_err(|e| Error::invalid(format!("TLS: the {what} cannot be read: {e}")))?;
        if is_development_certificate(&der) {
            return Err(Error::invalid(format!(
                "TLS: the {what} is marked {DEVELOPMENT_MARKER:?}. It was generated for \
                 development and its signing key is not a secret, so it is not trusted here. Use \
                 a real certificate, or say so deliberately with \
                 ConnectionOptions::allow_development_certificates(true)"
            )));
        }
        Ok(())
    }
}

fn trim_start(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !c.is_ascii_whitespace())
        .unwrap_or(b.len());
    &b[start..]
}

/// Every `CERTIFICATE` block of a PEM text (a bundle or a chain holds several; anything else in
/// the text, a key or a comment, is skipped).
fn certificates(pem: &[u8], what: &str) -> Result<Vec<native_tls::Certificate>> {
    const BEGIN: &[u8] = b"-----BEGIN CERTIFICATE-----";
    const END: &[u8] = b"-----END CERTIFICATE-----";
    let mut found = Vec::new();
    let mut rest = pem;
    while let Some(start) = find(rest, BEGIN) {
        let after = &rest[start..];
        let Some(end) = find(after, END) else {
            return Err(Error::invalid(format!(
                "TLS: the {what} has a certificate with no -----END CERTIFICATE----- line"
            )));
        };
        let block = &after[..end + END.len()];
        let cert = native_tls::Certificate::from_pem(block).map_err(|e| {
            Error::invalid(format!(
                "TLS: the {what} holds a PEM certificate that cannot be read: {e}"
            ))
        })?;
        found.push(cert);
        rest = &after[end + END.len()..];
    }
    if found.is_empty() {
        return Err(Error::invalid(format!(
            "TLS: the {what} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    Ok(found)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pem_without_a_certificate_is_refused_by_name() {
        let e = certificates(
            b"-----BEGIN PRIVATE KEY-----\nabc\n",
            "certificate authority",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        let e = certificates(b"-----BEGIN CERTIFICATE-----\nabc\n", "x")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("no -----END CERTIFICATE-----"), "{e}");
    }
}
