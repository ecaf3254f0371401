//! `amqps://` against the real broker, through a TLS-terminating proxy made here (the broker on
//! this machine listens without TLS; the proxy holds a certificate made for this test by the
//! `openssl` command). The client verifies the certificate against the root it is given.

mod support;

use acemq_amqp::{ConnectionOptions, Error, Message};
use support::tls_proxy::tls_proxy;

/// A self-signed certificate for localhost: (cert PEM, PKCS#8 key PEM).
fn certificate(dir: &std::path::Path) -> (Vec<u8>, Vec<u8>) {
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .stderr(std::process::Stdio::null())
        .status()
        .expect("the openssl command is needed to make a test certificate");
    assert!(status.success(), "openssl could not make a certificate");
    (
        std::fs::read(dir.join("cert.pem")).unwrap(),
        std::fs::read(dir.join("key.pem")).unwrap(),
    )
}

#[test]
fn amqps_publishes_confirmed_through_a_verified_tls_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path());
    let port = tls_proxy(&cert, &key);
    let url = format!("amqps://guest:guest@localhost:{port}/");

    // Without the root, the certificate is refused: a clear connect error, no password in it.
    let e = acemq_amqp::Connection::open_with(ConnectionOptions::new().address(url.clone()))
        .unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("guest:guest"));

    let conn = support::connect_with(
        ConnectionOptions::new()
            .address(url)
            .tls_root_certificate(cert),
    );
    let (_clean, q) = support::queue_on(&conn, "tls", |spec| spec);
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("over tls")).unwrap();
    assert_eq!(conn.get(&q).unwrap().unwrap().body, b"over tls");
    publisher.close().unwrap();
    conn.close().unwrap();
}
