//! `amqps://` against the real broker, through a TLS-terminating proxy made here (the broker on
//! this machine listens without TLS; the proxy holds a certificate made for this test by the
//! `openssl` command). The client verifies the certificate against the root it is given.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use acemq_amqp::{ConnectionOptions, Error, Message, QueueSpec};
use support::{unique, Cleanup};

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

/// Accepts TLS on a free port and forwards the plain bytes to the broker.
fn tls_proxy(cert: &[u8], key: &[u8]) -> u16 {
    let identity = native_tls::Identity::from_pkcs8(cert, key).unwrap();
    let acceptor = native_tls::TlsAcceptor::new(identity).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let acceptor = acceptor.clone();
            std::thread::spawn(move || {
                let Ok(mut tls) = acceptor.accept(client) else {
                    return;
                };
                let Ok(mut up) = TcpStream::connect("127.0.0.1:5672") else {
                    return;
                };
                tls.get_ref().set_nonblocking(true).unwrap();
                up.set_nonblocking(true).unwrap();
                let mut buf = [0u8; 16 * 1024];
                loop {
                    let mut idle = true;
                    match tls.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => {
                            idle = false;
                            if write_all(&mut up, &buf[..n]).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(_) => return,
                    }
                    match up.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => {
                            idle = false;
                            if write_all(&mut tls, &buf[..n]).is_err() {
                                return;
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(_) => return,
                    }
                    if idle {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            });
        }
    });
    port
}

fn write_all(w: &mut impl Write, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        match w.write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => return Err(e),
        }
    }
    w.flush().or_else(|e| {
        if e.kind() == ErrorKind::WouldBlock {
            Ok(())
        } else {
            Err(e)
        }
    })
}

#[test]
fn amqps_publishes_confirmed_through_a_verified_tls_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(dir.path());
    let port = tls_proxy(&cert, &key);
    let url = format!("amqps://guest:guest@localhost:{port}/");

    // Without the root, the certificate is refused: a clear connect error, no password in it.
    let e = ConnectionOptions::new()
        .address(url.clone())
        .open()
        .unwrap_err();
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(!format!("{e} {e:?}").contains("guest:guest"));

    let conn = support::connect_with(
        ConnectionOptions::new()
            .address(url)
            .tls_root_certificate(cert),
    );
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("tls"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("over tls")).unwrap();
    assert_eq!(conn.get(&q).unwrap().unwrap().body, b"over tls");
    publisher.close().unwrap();
    conn.close().unwrap();
}
