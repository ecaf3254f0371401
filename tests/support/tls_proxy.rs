//! A TLS-terminating proxy in front of the local broker (which listens without TLS), for the
//! tests of `amqps://` connections: it holds the certificate a test made and forwards the plain
//! bytes to the tests' broker ([`super::broker_addr`]).

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

pub fn tls_proxy(cert: &[u8], key: &[u8]) -> u16 {
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
                let Ok(mut up) = TcpStream::connect(super::broker_addr()) else {
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
