//! The TLS handshake on the connection's socket, made here with a timeout, then the broker's
//! certificate checked for the development marker, then the stream handed to amiquip as a plain
//! `IoStream` (amiquip's own TLS path keeps the stream to itself, so the certificate could not be
//! read there).

use std::io::{self, Read, Write};
use std::time::Duration;

use mio::{Evented, Poll, PollOpt, Ready, Token};
use native_tls::HandshakeError;

use super::failure::{TlsError, TlsFailure};
use super::settings::TlsSettings;
use crate::connection::marker::is_development_certificate;

/// A finished TLS stream over the connection's socket, for amiquip's I/O loop.
pub(crate) struct TlsIo(native_tls::TlsStream<Socket>);

/// The connection's socket: blocking (with timeouts) for the handshake, then moved, the same
/// socket, into mio for amiquip's I/O loop (a mio 0.6 socket registered with one poll cannot be
/// registered with another, so the handshake cannot be polled here and the rest there).
pub(crate) enum Socket {
    Blocking(std::net::TcpStream),
    Polled(mio::net::TcpStream),
    Moving,
}

impl Socket {
    fn moved() -> io::Error {
        io::Error::other("the socket is being handed to the I/O loop")
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Blocking(s) => s.read(buf),
            Socket::Polled(s) => s.read(buf),
            Socket::Moving => Err(Socket::moved()),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Blocking(s) => s.write(buf),
            Socket::Polled(s) => s.write(buf),
            Socket::Moving => Err(Socket::moved()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Socket::Blocking(s) => s.flush(),
            Socket::Polled(s) => s.flush(),
            Socket::Moving => Err(Socket::moved()),
        }
    }
}

/// Runs the TLS handshake on `stream` for `host` (or the settings' server name), each read and
/// write of it bounded by `timeout`, and refuses a broker certificate carrying the development
/// marker unless allowed.
pub(crate) fn handshake(
    settings: &TlsSettings,
    connector: &native_tls::TlsConnector,
    host: &str,
    stream: std::net::TcpStream,
    timeout: Duration,
) -> Result<TlsIo, TlsError> {
    let mut tls = blocking_handshake(settings, connector, host, stream, timeout)?;
    let socket = std::mem::replace(tls.get_mut(), Socket::Moving);
    let Socket::Blocking(std) = socket else {
        unreachable!("the handshake ran on the blocking socket")
    };
    std.set_read_timeout(None).map_err(io_failed)?;
    std.set_write_timeout(None).map_err(io_failed)?;
    *tls.get_mut() = Socket::Polled(mio::net::TcpStream::from_stream(std).map_err(io_failed)?);
    Ok(TlsIo(tls))
}

/// Why a broker that finished the TLS handshake then dropped the connection did so, if it was
/// the client certificate: a TLS 1.3 broker says so (`certificate required`, `unknown ca`) only
/// after the handshake, and an AMQP client that writes first may see a reset instead. Asked
/// only after such a failure, on a new connection: handshake, then wait up to `wait` for the
/// broker's word before sending anything.
pub(crate) fn client_certificate_refusal(
    settings: &TlsSettings,
    connector: &native_tls::TlsConnector,
    host: &str,
    stream: std::net::TcpStream,
    timeout: Duration,
    wait: Duration,
) -> Option<TlsError> {
    let mut tls = blocking_handshake(settings, connector, host, stream, timeout).ok()?;
    if let Socket::Blocking(s) = tls.get_ref() {
        s.set_read_timeout(Some(wait)).ok()?;
    }
    let mut byte = [0u8; 1];
    match tls.read(&mut byte) {
        Err(e) => {
            let e = TlsError::classify_after_handshake(Box::new(e), settings.client.is_some());
            e.is_about_the_client_certificate().then_some(e)
        }
        // Anything read (or a close) is not a refusal of the client certificate.
        Ok(_read) => None,
    }
}

fn io_failed(e: io::Error) -> TlsError {
    TlsError::new(TlsFailure::Other, Some(Box::new(e)))
}

fn blocking_handshake(
    settings: &TlsSettings,
    connector: &native_tls::TlsConnector,
    host: &str,
    stream: std::net::TcpStream,
    timeout: Duration,
) -> Result<native_tls::TlsStream<Socket>, TlsError> {
    let presented = settings.client.is_some();
    let failed = |e: native_tls::Error| TlsError::classify(Box::new(e), presented);
    let domain = settings.server_name.as_deref().unwrap_or(host);
    stream.set_read_timeout(Some(timeout)).map_err(io_failed)?;
    stream.set_write_timeout(Some(timeout)).map_err(io_failed)?;
    let tls = match connector.connect(domain, Socket::Blocking(stream)) {
        Ok(tls) => tls,
        Err(HandshakeError::Failure(e)) => return Err(failed(e)),
        // A blocking socket's timeout reads as "would block".
        Err(HandshakeError::WouldBlock(_)) => {
            return Err(io_failed(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the broker did not answer the TLS handshake within {timeout:?}"),
            )))
        }
    };
    if !settings.allow_development {
        let leaf = tls.peer_certificate().map_err(failed)?;
        if let Some(cert) = leaf {
            let der = cert.to_der().map_err(failed)?;
            // The leaf's encoding holds its issuer's name too: a certificate signed by a marked
            // authority is caught as well.
            if is_development_certificate(&der) {
                return Err(TlsError::development(Some(format!("for {domain}"))));
            }
        }
    }
    Ok(tls)
}

impl TlsIo {
    fn polled(&self) -> io::Result<&mio::net::TcpStream> {
        match self.0.get_ref() {
            Socket::Polled(s) => Ok(s),
            _ => Err(Socket::moved()),
        }
    }
}

impl Read for TlsIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for TlsIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Evented for TlsIo {
    fn register(
        &self,
        poll: &Poll,
        token: Token,
        interest: Ready,
        opts: PollOpt,
    ) -> io::Result<()> {
        self.polled()?.register(poll, token, interest, opts)
    }

    fn reregister(
        &self,
        poll: &Poll,
        token: Token,
        interest: Ready,
        opts: PollOpt,
    ) -> io::Result<()> {
        self.polled()?.reregister(poll, token, interest, opts)
    }

    fn deregister(&self, poll: &Poll) -> io::Result<()> {
        self.polled()?.deregister(poll)
    }
}
