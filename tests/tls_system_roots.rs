//! A given authority is trusted alone: the system's roots are not consulted unless
//! `tls_trust_system_roots(true)`. The "system's roots" here are the test authority of the TLS
//! node (`scripts/tls-node`, started by scripts/test), put there with OpenSSL's `SSL_CERT_FILE`
//! before any connection is made — in a test binary of its own, so that no other test sees it.

mod support;

use acemq_amqp::{Connection, ConnectionOptions, TlsError, TlsFailure};

fn certs() -> std::path::PathBuf {
    support::tls_certs("tls_system_roots")
}

#[test]
fn a_given_authority_is_trusted_alone_unless_the_system_roots_are_asked_for() {
    let dir = certs();
    // Set before this binary (this one test) makes any connection: nothing else reads it.
    std::env::set_var("SSL_CERT_FILE", dir.join("ca.crt"));
    std::env::remove_var("SSL_CERT_DIR");
    let url = "amqps://guest:guest@localhost:5676/";
    let other = std::fs::read(dir.join("other-ca.crt")).unwrap();

    // No authority given: the system's roots (here the test authority) are trusted.
    let conn = Connection::open_with(ConnectionOptions::new().address(url)).unwrap_or_else(|e| {
        panic!("the TLS node should be trusted through the system's roots ({e}); is it running? `scripts/tls-node start`")
    });
    conn.close().unwrap();

    // Another authority given: it alone is trusted, and the broker's is not any more.
    let e = Connection::open_with(
        ConnectionOptions::new()
            .address(url)
            .tls_root_certificate(other.clone()),
    )
    .unwrap_err();
    let failure = TlsError::find(&e).map(TlsError::failure);
    assert_eq!(failure, Some(TlsFailure::UnknownAuthority), "{e}");

    // Asked for, the system's roots are trusted beside the one given.
    let conn = Connection::open_with(
        ConnectionOptions::new()
            .address(url)
            .tls_root_certificate(other)
            .tls_trust_system_roots(true),
    )
    .unwrap_or_else(|e| panic!("the system's roots were asked for: {e}"));
    conn.close().unwrap();
}
