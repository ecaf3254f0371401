//! The development certificate authority (`acemq_amqp::test_ca`, feature `test-ca`): the
//! family's files and names, and a TLS connection to the real broker (through a TLS-terminating
//! proxy holding the generated broker certificate) verified against the generated authority —
//! once development certificates are allowed: its marker is refused by default.

mod support;

use std::io::Write;
use std::time::Duration;

use acemq_amqp::test_ca::{TestCa, AUTHORITY_NAME, CLIENT_NAME, DEVELOPMENT_MARKER};
use acemq_amqp::{ConnectionOptions, Error, Message};
use support::tls_proxy::tls_proxy;

/// `openssl x509 -noout -text` of a PEM certificate.
fn describe(pem: &str) -> String {
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-text"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the openssl command is needed to read a certificate");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(pem.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn writes_the_familys_files_names_and_marker() {
    let dir = tempfile::tempdir().unwrap();
    let made = TestCa::new().generate(dir.path().join("certs")).unwrap();
    let names: Vec<String> = made
        .files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "ca.crt",
            "ca.key",
            "server.crt",
            "server.key",
            "client.crt",
            "client.key",
            "rabbitmq.conf"
        ]
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |n: &str| {
            std::fs::metadata(made.directory.join(n))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("ca.key"), 0o600);
        assert_eq!(mode("server.crt"), 0o644);
    }
    let ca = describe(&made.ca_cert);
    assert!(
        ca.contains(AUTHORITY_NAME) && ca.contains(DEVELOPMENT_MARKER),
        "{ca}"
    );
    assert!(ca.contains("CA:TRUE"), "{ca}");
    let server = describe(&made.server_cert);
    assert!(
        server.contains("CN = localhost") || server.contains("CN=localhost"),
        "{server}"
    );
    assert!(
        server.contains("DNS:localhost, DNS:rabbitmq, IP Address:127.0.0.1"),
        "{server}"
    );
    assert!(server.contains("TLS Web Server Authentication"), "{server}");
    assert!(
        server.contains("prime256v1") || server.contains("P-256"),
        "{server}"
    );
    let client = describe(&made.client_cert);
    assert!(client.contains(CLIENT_NAME) && client.contains("TLS Web Client Authentication"));
    let conf = std::fs::read_to_string(made.directory.join("rabbitmq.conf")).unwrap();
    assert!(
        conf.contains("ssl_options.cacertfile = /certs/ca.crt"),
        "{conf}"
    );
    assert!(!format!("{made:?}").contains("PRIVATE KEY"));
    // An IP address is named as an address; a validity under a day is refused.
    let ip = TestCa::new()
        .broker_host("10.0.0.4")
        .broker_configuration(false)
        .generate(dir.path().join("ip"))
        .unwrap();
    assert_eq!(ip.files.len(), 6);
    assert!(describe(&ip.server_cert).contains("IP Address:10.0.0.4"));
    assert!(TestCa::new()
        .validity(Duration::from_secs(3600))
        .generate(dir.path().join("short"))
        .is_err());
}

#[test]
fn a_tls_connection_verifies_the_broker_against_the_generated_authority() {
    let dir = tempfile::tempdir().unwrap();
    let made = TestCa::new().generate(dir.path()).unwrap();
    let port = tls_proxy(made.server_cert.as_bytes(), made.server_key.as_bytes());
    let url = format!("amqps://guest:guest@localhost:{port}/");
    // Not trusted without the authority.
    let e = acemq_amqp::Connection::open_with(ConnectionOptions::new().address(url.clone()))
        .unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    // The authority carries the family's development marker: refused as given, before any
    // connection is tried, until development certificates are allowed.
    let e = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(url.clone())
            .tls_root_certificate(made.ca_cert.clone()),
    )
    .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(DEVELOPMENT_MARKER) && text.contains("allow_development_certificates(true)"),
        "{text}"
    );
    let conn = support::connect_with(
        ConnectionOptions::new()
            .address(url)
            .tls_root_certificate(made.ca_cert.clone())
            .allow_development_certificates(true),
    );
    let (_clean, q) = support::queue_on(&conn, "test-ca", |spec| spec);
    let publisher = conn.publisher().unwrap();
    publisher
        .publish("", &q, Message::new("through the test CA"))
        .unwrap();
    assert_eq!(conn.get(&q).unwrap().unwrap().body, b"through the test CA");
    publisher.close().unwrap();
    conn.close().unwrap();
}
