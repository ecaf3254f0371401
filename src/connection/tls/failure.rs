//! A failed TLS connect, named: which of the usual cases it was, in words a person can act on,
//! with the TLS library's own error kept as the cause.

use std::error::Error as StdError;
use std::fmt;

use crate::connection::marker::DEVELOPMENT_MARKER;
use crate::error::BoxError;

/// Which way a TLS connect failed (see [`TlsError`]).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFailure {
    /// The broker's certificate does not chain to an authority trusted here (the wrong
    /// authority given, or none given for a private one).
    UnknownAuthority,
    /// The broker's certificate is not for the name checked (the URL's host, or
    /// [`tls_server_name`](crate::ConnectionOptions::tls_server_name)).
    NameMismatch,
    /// The broker's certificate has expired.
    Expired,
    /// The broker's certificate is not valid yet (its start is in the future: a clock is off).
    NotYetValid,
    /// The broker requires a client certificate and none was presented.
    ClientCertificateRequired,
    /// The broker refused the client certificate presented (not signed by an authority it
    /// trusts, expired, or not for client authentication).
    ClientCertificateRejected,
    /// The broker presented a certificate carrying the family's development marker, refused
    /// unless [`allow_development_certificates`](crate::ConnectionOptions::allow_development_certificates).
    DevelopmentCertificate,
    /// What answered does not speak TLS (a plain AMQP port behind an `amqps://` address?).
    NotTls,
    /// Any other TLS failure: the cause says what.
    Other,
}

/// A TLS connect that failed, the source of the [`Error::Connect`](crate::Error::Connect) it
/// ends in: [`failure`](Self::failure) says which case it was, its text what to do, and
/// [`source()`](std::error::Error::source) is the TLS library's own error.
///
/// The cases are read from the TLS library's error text (OpenSSL's, on Linux); on a platform
/// whose library words them differently a failure may be [`TlsFailure::Other`], its cause still
/// kept.
///
/// ```no_run
/// # fn main() {
/// use acemq_amqp::{ConnectionOptions, TlsError, TlsFailure};
/// let options = ConnectionOptions::new().address("amqps://broker.internal/");
/// if let Err(e) = acemq_amqp::Connection::open_with(options) {
///     if TlsError::find(&e).map(TlsError::failure) == Some(TlsFailure::UnknownAuthority) {
///         eprintln!("trust the broker's authority with tls_root_certificate: {e}");
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct TlsError {
    failure: TlsFailure,
    detail: Option<String>,
    source: Option<BoxError>,
}

impl TlsError {
    pub(crate) fn new(failure: TlsFailure, source: Option<BoxError>) -> TlsError {
        TlsError {
            failure,
            detail: None,
            source,
        }
    }

    pub(crate) fn development(subject_hint: Option<String>) -> TlsError {
        TlsError {
            failure: TlsFailure::DevelopmentCertificate,
            detail: subject_hint,
            source: None,
        }
    }

    /// Which case it was.
    pub fn failure(&self) -> TlsFailure {
        self.failure
    }

    /// The `TlsError` behind an error of this crate (a failed open or reconnect), if a TLS
    /// connect is what failed.
    pub fn find<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a TlsError> {
        let mut current = Some(error);
        while let Some(e) = current {
            if let Some(t) = e.downcast_ref::<TlsError>() {
                return Some(t);
            }
            current = e.source();
        }
        None
    }

    /// A failure of a TLS connection's first exchange, read from `error`'s text and its causes'
    /// (`presented`: whether a client certificate was).
    pub(crate) fn classify(error: BoxError, presented: bool) -> TlsError {
        let failure = failure_of(&chain_text(error.as_ref()), presented);
        TlsError::new(failure, Some(error))
    }

    /// The same for a failure after the client's side of the handshake finished (TLS 1.3): the
    /// broker's check of the client's certificate is all that is left to fail then, so its
    /// `handshake failure` alert (Erlang's for a certificate not for client authentication) is
    /// about that certificate, or its absence.
    pub(crate) fn classify_after_handshake(error: BoxError, presented: bool) -> TlsError {
        let text = chain_text(error.as_ref());
        let failure = match failure_of(&text, presented) {
            TlsFailure::Other if text.contains("alert handshake failure") => {
                TlsFailure::ClientCertificateRejected
            }
            f => f,
        };
        TlsError::new(failure, Some(error))
    }
}

impl TlsError {
    /// Whether the broker refused the client certificate, or its absence.
    pub(crate) fn is_about_the_client_certificate(&self) -> bool {
        matches!(
            self.failure,
            TlsFailure::ClientCertificateRequired | TlsFailure::ClientCertificateRejected
        )
    }

    /// After the TLS handshake: this error when it names a refused client certificate, else
    /// its cause as it was (a refused login, a dropped socket are not TLS's to name).
    pub(crate) fn or_cause(self) -> BoxError {
        match self.source {
            Some(source) if !self.is_about_the_client_certificate() => source,
            _ => Box::new(self),
        }
    }
}

fn chain_text(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text.to_ascii_lowercase()
}

/// OpenSSL's words for each case: its verify results for the broker's certificate, the alerts a
/// broker sends about the client's.
fn failure_of(text: &str, presented: bool) -> TlsFailure {
    let any = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if any(&["alert certificate required"]) {
        TlsFailure::ClientCertificateRequired
    } else if any(&[
        "alert bad certificate",
        "alert unknown ca",
        "alert certificate unknown",
        "alert certificate expired",
        "alert certificate revoked",
        "alert unsupported certificate",
        "alert access denied",
    ]) {
        TlsFailure::ClientCertificateRejected
    } else if !presented && any(&["alert handshake failure"]) {
        // TLS 1.2: a broker with fail_if_no_peer_cert ends the handshake with this alert.
        TlsFailure::ClientCertificateRequired
    } else if any(&["certificate has expired"]) {
        TlsFailure::Expired
    } else if any(&["certificate is not yet valid"]) {
        TlsFailure::NotYetValid
    } else if any(&["hostname mismatch", "ip address mismatch"]) {
        TlsFailure::NameMismatch
    } else if any(&[
        "unable to get local issuer certificate",
        "unable to get issuer certificate",
        "self-signed certificate",
        "self signed certificate",
        "unable to verify the first certificate",
    ]) {
        TlsFailure::UnknownAuthority
    } else if any(&[
        "wrong version number",
        "packet length too long",
        "http request",
    ]) {
        TlsFailure::NotTls
    } else {
        TlsFailure::Other
    }
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.failure {
            TlsFailure::UnknownAuthority => {
                "the broker's certificate is not signed by an authority trusted here (unknown \
                 CA): give its authority with ConnectionOptions::tls_root_certificate (a given \
                 authority is trusted alone; tls_trust_system_roots(true) adds the system's)"
            }
            TlsFailure::NameMismatch => {
                "the broker's certificate is not for the name checked (name mismatch): connect \
                 by a name the certificate is for, or name it with \
                 ConnectionOptions::tls_server_name"
            }
            TlsFailure::Expired => "the broker's certificate has expired",
            TlsFailure::NotYetValid => {
                "the broker's certificate is not valid yet (is a clock wrong?)"
            }
            TlsFailure::ClientCertificateRequired => {
                "the broker requires a client certificate and none was presented: give one \
                 with ConnectionOptions::tls_client_certificate"
            }
            TlsFailure::ClientCertificateRejected => {
                "the broker refused the client certificate presented (not signed by an \
                 authority it trusts, expired, or not for client authentication)"
            }
            TlsFailure::DevelopmentCertificate => {
                return write!(
                    f,
                    "TLS: the broker presented a certificate marked {DEVELOPMENT_MARKER:?}{}. \
                     It was generated for development, its signing key is not a secret, and it \
                     is refused however trust is configured. If this really is a development \
                     broker, say so with ConnectionOptions::allow_development_certificates(true)",
                    self.detail
                        .as_ref()
                        .map(|d| format!(" ({d})"))
                        .unwrap_or_default()
                );
            }
            TlsFailure::NotTls => {
                "what answered does not speak TLS (is the port a plain AMQP one? amqps:// is \
                 usually 5671)"
            }
            TlsFailure::Other => "the TLS handshake failed",
        };
        write!(f, "TLS: {what}")?;
        if let Some(source) = &self.source {
            write!(f, " ({source})")?;
        }
        Ok(())
    }
}

impl StdError for TlsError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openssl_words_name_the_case() {
        let cases = [
            (
                "certificate verify failed (unable to get local issuer certificate)",
                TlsFailure::UnknownAuthority,
            ),
            (
                "certificate verify failed (hostname mismatch)",
                TlsFailure::NameMismatch,
            ),
            (
                "certificate verify failed (ip address mismatch)",
                TlsFailure::NameMismatch,
            ),
            (
                "certificate verify failed (certificate has expired)",
                TlsFailure::Expired,
            ),
            (
                "ssl3_read_bytes:tlsv13 alert certificate required",
                TlsFailure::ClientCertificateRequired,
            ),
            (
                "ssl3_read_bytes:sslv3 alert bad certificate",
                TlsFailure::ClientCertificateRejected,
            ),
            (
                "tls_get_more_records:wrong version number",
                TlsFailure::NotTls,
            ),
            ("something else", TlsFailure::Other),
        ];
        for (text, want) in cases {
            assert_eq!(failure_of(text, true), want, "{text}");
        }
        assert_eq!(
            failure_of("sslv3 alert handshake failure", false),
            TlsFailure::ClientCertificateRequired
        );
        assert_eq!(
            failure_of("sslv3 alert handshake failure", true),
            TlsFailure::Other
        );
    }
}
