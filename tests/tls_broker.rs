//! TLS against a real RabbitMQ TLS listener: the node `scripts/tls-node` starts (scripts/test
//! starts it) on 127.0.0.1:5676, with the certificates it made in `$ACEMQ_TLS_DIR/certs`
//! (default /var/tmp/acemq-tls/certs). The name sent (SNI, `tls_server_name`) picks what the
//! broker does: `localhost` is one-way TLS, `mutual.acemq.test` requires a client certificate,
//! `expired.acemq.test` and `development.acemq.test` show those certificates.

use std::path::PathBuf;

use acemq_amqp::{Connection, ConnectionOptions, Error, Message, QueueSpec, TlsError, TlsFailure};

mod support;

const PORT: u16 = 5676;

fn certs() -> PathBuf {
    support::tls_certs("tls_broker")
}

fn pem(name: &str) -> Vec<u8> {
    std::fs::read(certs().join(name)).unwrap()
}

fn url(host: &str) -> String {
    format!("amqps://guest:guest@{host}:{PORT}/")
}

/// Options for the TLS node at `host`, trusting the test authority alone.
fn options(host: &str) -> ConnectionOptions {
    ConnectionOptions::new()
        .address(url(host))
        .tls_root_certificate(pem("ca.crt"))
}

fn with_client_certificate(options: ConnectionOptions) -> ConnectionOptions {
    let dir = certs();
    options.tls_client_certificate_files(dir.join("client.crt"), dir.join("client.key"))
}

fn open(options: ConnectionOptions) -> Connection {
    Connection::open_with(options).unwrap_or_else(|e| {
        panic!(
            "the TLS node on 127.0.0.1:{PORT} refused a connection that should pass ({e}). Is it \
             running? `scripts/test` starts it, or `scripts/tls-node start`"
        )
    })
}

/// The connect fails with a TLS error: its case and its text.
fn refused(options: ConnectionOptions) -> (TlsFailure, String) {
    let e = match Connection::open_with(options) {
        Ok(_) => panic!("the connection should have been refused"),
        Err(e) => e,
    };
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    let text = e.to_string();
    assert!(!text.contains("guest:guest"), "{text}");
    let tls = TlsError::find(&e).unwrap_or_else(|| panic!("not a TLS failure: {text}"));
    (tls.failure(), text)
}

/// Publishes one message to an exclusive queue of its own and reads it back.
fn round_trip(conn: &Connection, body: &str) {
    let q = support::unique("tls-broker");
    conn.declare_queue(&QueueSpec::new(&q).classic().durable(false).exclusive(true))
        .unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new(body)).unwrap();
    let got = support::eventually(std::time::Duration::from_secs(5), || {
        conn.get(&q)
            .unwrap()
            .map(|m| assert_eq!(m.body, body.as_bytes()))
            .is_some()
    });
    assert!(got, "the message published over TLS did not come back");
    publisher.close().unwrap();
    conn.delete_queue(&q).unwrap();
}

#[test]
fn one_way_tls_with_the_right_authority_publishes_and_consumes() {
    // The authority read from its file, as a service deployed with one would.
    let conn = open(
        ConnectionOptions::new()
            .address(url("localhost"))
            .tls_root_certificate_file(certs().join("ca.crt")),
    );
    round_trip(&conn, "over one-way tls");
    conn.close().unwrap();
}

#[test]
fn a_broker_signed_by_another_authority_is_refused_as_unknown_ca() {
    let (failure, text) = refused(
        ConnectionOptions::new()
            .address(url("localhost"))
            .tls_root_certificate(pem("other-ca.crt")),
    );
    assert_eq!(failure, TlsFailure::UnknownAuthority, "{text}");
    assert!(text.contains("unknown CA"), "{text}");
    assert!(text.contains("tls_root_certificate"), "{text}");
}

#[test]
fn mutual_tls_with_a_client_certificate_publishes_and_consumes() {
    let conn = open(with_client_certificate(
        options("localhost").tls_server_name("mutual.acemq.test"),
    ));
    round_trip(&conn, "over mutual tls");
    conn.close().unwrap();
}

#[test]
fn no_client_certificate_on_the_mutual_listener_is_refused_saying_the_broker_wants_one() {
    let (failure, text) = refused(options("localhost").tls_server_name("mutual.acemq.test"));
    assert_eq!(failure, TlsFailure::ClientCertificateRequired, "{text}");
    assert!(text.contains("requires a client certificate"), "{text}");
}

#[test]
fn a_client_certificate_from_an_authority_the_broker_does_not_trust_is_refused() {
    let dir = certs();
    let (failure, text) = refused(
        options("localhost")
            .tls_server_name("mutual.acemq.test")
            .tls_client_certificate_files(
                dir.join("other-client.crt"),
                dir.join("other-client.key"),
            ),
    );
    assert_eq!(failure, TlsFailure::ClientCertificateRejected, "{text}");
    assert!(text.contains("refused the client certificate"), "{text}");
}

#[test]
fn an_expired_broker_certificate_is_refused_as_expired() {
    let (failure, text) = refused(options("localhost").tls_server_name("expired.acemq.test"));
    assert_eq!(failure, TlsFailure::Expired, "{text}");
    assert!(text.contains("expired"), "{text}");
}

#[test]
fn a_development_certificate_is_refused_by_default_then_allowed() {
    let dev = || options("localhost").tls_server_name("development.acemq.test");
    let (failure, text) = refused(dev());
    assert_eq!(failure, TlsFailure::DevelopmentCertificate, "{text}");
    assert!(
        text.contains("ACEMQ DEVELOPMENT ONLY - DO NOT TRUST")
            && text.contains("allow_development_certificates(true)"),
        "{text}"
    );
    let conn = open(dev().allow_development_certificates(true));
    round_trip(&conn, "over a development certificate");
    conn.close().unwrap();
}

#[test]
fn a_name_mismatch_is_refused_and_the_server_name_override_makes_it_pass() {
    // The broker's certificate is for DNS:localhost only: reached at 127.0.0.1 it does not match.
    let (failure, text) = refused(options("127.0.0.1"));
    assert_eq!(failure, TlsFailure::NameMismatch, "{text}");
    assert!(
        text.contains("name mismatch") && text.contains("tls_server_name"),
        "{text}"
    );
    let conn = open(options("127.0.0.1").tls_server_name("localhost"));
    round_trip(&conn, "by address, checked by name");
    conn.close().unwrap();
}

#[test]
fn an_amqps_address_on_a_plain_port_says_it_does_not_speak_tls() {
    // The broker every other test uses listens without TLS.
    let (failure, text) = refused(
        ConnectionOptions::new()
            .address(format!("amqps://guest:guest@{}/", support::broker_addr()))
            .tls_root_certificate(pem("ca.crt")),
    );
    assert_eq!(failure, TlsFailure::NotTls, "{text}");
    assert!(text.contains("does not speak TLS"), "{text}");
}

#[test]
fn tls_settings_on_a_plain_address_are_refused() {
    let plain = || ConnectionOptions::new().address(support::amqp_url());
    for options in [
        plain().tls_root_certificate(pem("ca.crt")),
        plain().tls_server_name("localhost"),
        plain().allow_development_certificates(true),
        plain().tls_trust_system_roots(true),
        with_client_certificate(plain()),
    ] {
        let e = Connection::open_with(options).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("TLS settings are given") && text.contains("amqps://"),
            "{text}"
        );
    }
}

#[test]
fn a_bad_pem_is_refused_when_opening_naming_the_setting() {
    let dir = certs();
    let invalid = |options: ConnectionOptions| {
        let e = Connection::open_with(options).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { .. } | Error::Io { .. }),
            "{e:?}"
        );
        e.to_string()
    };
    let text = invalid(options("localhost").tls_root_certificate("not a certificate"));
    assert!(
        text.contains("certificate authority") && text.contains("holds no PEM certificate"),
        "{text}"
    );
    let text = invalid(
        ConnectionOptions::new()
            .address(url("localhost"))
            .tls_root_certificate_file(dir.join("missing.crt")),
    );
    assert!(text.contains("missing.crt"), "{text}");
    // A key that is not PKCS#8.
    let text = invalid(options("localhost").tls_client_certificate(
        pem("client.crt"),
        b"-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n".to_vec(),
    ));
    assert!(text.contains("not a PKCS#8 PEM private key"), "{text}");
    // A key that is not the certificate's.
    let text = invalid(
        options("localhost").tls_client_certificate(pem("client.crt"), pem("other-client.key")),
    );
    assert!(text.contains("client key"), "{text}");
    // A certificate where the client's should be.
    let text = invalid(
        options("localhost").tls_client_certificate(b"nothing".to_vec(), pem("client.key")),
    );
    assert!(text.contains("client certificate"), "{text}");
}

#[test]
fn a_refused_login_over_tls_is_not_called_a_tls_failure() {
    let e = Connection::open_with(
        ConnectionOptions::new()
            .address(format!("amqps://guest:not-the-password@localhost:{PORT}/"))
            .tls_root_certificate(pem("ca.crt")),
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(TlsError::find(&e).is_none(), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
}

#[test]
fn a_marked_client_certificate_is_refused_as_given_unless_allowed() {
    // development-client.crt carries the family's marker in its subject.
    let marked = || {
        options("localhost")
            .tls_client_certificate(pem("development-client.crt"), pem("development-client.key"))
    };
    let e = Connection::open_with(marked()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("client certificate")
            && text.contains("ACEMQ DEVELOPMENT ONLY - DO NOT TRUST"),
        "{text}"
    );
    // Allowed, it is presented, and the broker (which checks it against its authority) takes it.
    let conn = open(
        marked()
            .allow_development_certificates(true)
            .tls_server_name("mutual.acemq.test"),
    );
    conn.close().unwrap();
}

#[test]
fn the_options_debug_shows_the_tls_settings_never_a_key() {
    let shown = format!(
        "{:?}",
        with_client_certificate(options("localhost").tls_server_name("mutual.acemq.test"))
    );
    assert!(
        shown.contains("roots=1") && shown.contains("client_certificate"),
        "{shown}"
    );
    assert!(shown.contains("server_name=mutual.acemq.test"), "{shown}");
    assert!(
        !shown.contains("PRIVATE KEY") && !shown.contains("BEGIN"),
        "{shown}"
    );
}

#[test]
fn a_client_certificate_not_for_client_authentication_is_refused_by_the_broker() {
    // development.crt is a server certificate (serverAuth only): the broker refuses it as a
    // client's.
    let (failure, text) = refused(
        options("localhost")
            .tls_server_name("mutual.acemq.test")
            .tls_client_certificate(pem("development.crt"), pem("development.key"))
            .allow_development_certificates(true),
    );
    assert_eq!(failure, TlsFailure::ClientCertificateRejected, "{text}");
}
