//! The family's development marker: in the subject of every certificate its development
//! tooling writes, refused by the `tls` feature unless allowed.

/// In the subject of every certificate the family's development tooling writes (`test_ca`,
/// Python `devcerts`, Go `acemq-certs`), the same string byte for byte in every library.
pub(crate) const DEVELOPMENT_MARKER: &str = "ACEMQ DEVELOPMENT ONLY - DO NOT TRUST";

/// Whether a DER certificate carries the family's [`DEVELOPMENT_MARKER`], as Python's
/// `is_development_certificate` reads it: looked for, ignoring case, in the encoded certificate
/// as a whole, which holds the subject's and the issuer's names as plain text — so a marked
/// certificate, or one signed by a marked authority, is caught without an X.509 parser.
#[cfg(feature = "tls")]
pub(crate) fn is_development_certificate(der: &[u8]) -> bool {
    let marker = DEVELOPMENT_MARKER.as_bytes();
    der.windows(marker.len())
        .any(|w| w.eq_ignore_ascii_case(marker))
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_found_in_any_case_anywhere() {
        let mut der = b"\x30\x82junk O=".to_vec();
        der.extend_from_slice(b"acemq development only - do not trust");
        der.extend_from_slice(b"\x00more");
        assert!(is_development_certificate(&der));
        assert!(!is_development_certificate(b"ACEMQ DEVELOPMENT ONLY"));
    }
}
