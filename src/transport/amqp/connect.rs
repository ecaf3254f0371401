//! Making an AMQP connection: TCP (Nagle off), TLS, the login, the handshake (its password kept
//! out of the logs), and amiquip's tuning.

use std::net::{SocketAddr, ToSocketAddrs};

use amiquip::{Auth, ConnectionTuning};
use crossbeam_channel::Receiver;
use parking_lot::Mutex;

use crate::connection::{Address, ConnectionOptions};

/// Opens an amiquip connection to `address` (`amqp://` or `amqps://`) with `options`.
pub(super) fn open(
    options: &ConnectionOptions,
    address: &Address,
) -> std::result::Result<
    (
        amiquip::Connection,
        Receiver<amiquip::ConnectionBlockedNotification>,
    ),
    crate::error::BoxError,
> {
    let socket_addrs: Vec<SocketAddr> = (address.host.as_str(), address.port)
        .to_socket_addrs()?
        .collect();
    let mut last: Option<std::io::Error> = None;
    let mut stream = None;
    for sa in socket_addrs {
        match std::net::TcpStream::connect_timeout(&sa, options.connect_timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let stream = match stream {
        Some(s) => s,
        None => {
            return Err(last
                .map(Into::into)
                .unwrap_or_else(|| "the host resolved to no address".into()))
        }
    };
    // amiquip's own URL opener leaves Nagle on: a publish that waits for its confirm then takes
    // ~25 ms instead of well under one.
    stream.set_nodelay(true)?;
    let heartbeat = u16::try_from(options.heartbeat.as_secs()).unwrap_or(u16::MAX);
    let (username, password) = match &options.credentials {
        // Asked now, at each connect: a rotated secret is picked up by the next reconnect.
        Some(source) => {
            let c = source.credentials()?;
            (c.username().to_string(), c.secret().to_string())
        }
        None => (address.user.clone(), address.password.clone()),
    };
    let amqp_options = amiquip::ConnectionOptions::<Auth>::default()
        .auth(Auth::Plain { username, password })
        .virtual_host(address.vhost.clone())
        .heartbeat(heartbeat)
        .channel_max(options.channel_max)
        .frame_max(options.frame_max)
        .connection_timeout(Some(options.connect_timeout))
        .information(options.name.clone());
    let mut conn = {
        let _quiet = HandshakeLogGuard::enter();
        open_stream(options, address, stream, amqp_options)?
    };
    let blocked = conn.listen_for_connection_blocked()?;
    Ok((conn, blocked))
}

/// amiquip 0.4 logs the `connection.start-ok` it sends — the SASL response with the password in
/// it — at debug level. While any handshake is under way, the `log` crate's maximum level is
/// held at `Info`, then restored when the last handshake ends.
struct HandshakeLogGuard;

static HANDSHAKES: Mutex<(usize, Option<log::LevelFilter>)> = Mutex::new((0, None));

impl HandshakeLogGuard {
    fn enter() -> HandshakeLogGuard {
        let mut h = HANDSHAKES.lock();
        if h.0 == 0 {
            let level = log::max_level();
            if level > log::LevelFilter::Info {
                h.1 = Some(level);
                log::set_max_level(log::LevelFilter::Info);
            }
        }
        h.0 += 1;
        HandshakeLogGuard
    }
}

impl Drop for HandshakeLogGuard {
    fn drop(&mut self) {
        let mut h = HANDSHAKES.lock();
        h.0 -= 1;
        if h.0 == 0 {
            if let Some(level) = h.1.take() {
                log::set_max_level(level);
            }
        }
    }
}

#[cfg(not(feature = "tls"))]
fn open_stream(
    ours: &ConnectionOptions,
    _address: &Address,
    stream: std::net::TcpStream,
    options: amiquip::ConnectionOptions<Auth>,
) -> std::result::Result<amiquip::Connection, crate::error::BoxError> {
    Ok(amiquip::Connection::insecure_open_stream(
        mio::net::TcpStream::from_stream(stream)?,
        options,
        tuning(ours),
    )?)
}

#[cfg(feature = "tls")]
fn open_stream(
    ours: &ConnectionOptions,
    address: &Address,
    stream: std::net::TcpStream,
    options: amiquip::ConnectionOptions<Auth>,
) -> std::result::Result<amiquip::Connection, crate::error::BoxError> {
    if !address.tls {
        return Ok(amiquip::Connection::insecure_open_stream(
            mio::net::TcpStream::from_stream(stream)?,
            options,
            tuning(ours),
        )?);
    }
    // The handshake is made here (`tls/stream.rs`), so that the broker's certificate can be
    // checked before amiquip speaks AMQP over the stream.
    let connector = ours.tls.connector()?;
    let peer = stream.peer_addr()?;
    let tls = crate::connection::tls::handshake(
        &ours.tls,
        &connector,
        &address.host,
        stream,
        ours.connect_timeout,
    )?;
    amiquip::Connection::insecure_open_stream(tls, options, tuning(ours)).map_err(|e| {
        // A TLS 1.3 broker refuses a client certificate (or its absence) only after the
        // handshake: named when amiquip read its alert; when amiquip, writing first, saw the
        // socket reset instead, asked again on a new connection that waits for the broker's
        // word (only then: a refused login is not worth a second connection).
        let presented = ours.tls.client.is_some();
        let dropped = matches!(
            e,
            amiquip::Error::IoErrorReadingSocket { .. }
                | amiquip::Error::IoErrorWritingSocket { .. }
                | amiquip::Error::UnexpectedSocketClose
        );
        let named =
            crate::connection::tls::TlsError::classify_after_handshake(Box::new(e), presented);
        if named.is_about_the_client_certificate() || !dropped {
            return named.or_cause();
        }
        let again = std::net::TcpStream::connect_timeout(&peer, ours.connect_timeout).ok();
        let refusal = again.and_then(|s| {
            crate::connection::tls::client_certificate_refusal(
                &ours.tls,
                &connector,
                &address.host,
                s,
                ours.connect_timeout,
                ours.connect_timeout.min(std::time::Duration::from_secs(2)),
            )
        });
        match refusal {
            Some(refusal) => Box::new(refusal),
            None => named.or_cause(),
        }
    })
}

/// amiquip's tuning: its I/O thread keeps taking frames (never blocking a publishing thread) up
/// to well above what this connection's publishers may leave unconfirmed.
fn tuning(ours: &ConnectionOptions) -> ConnectionTuning {
    let high_water = (16usize << 20).max(ours.max_unconfirmed_bytes.saturating_mul(2));
    ConnectionTuning::default().buffered_writes_high_water(high_water)
}

/// The TLS stream made in `connection/tls/stream.rs` is handed to amiquip as a plain one.
#[cfg(feature = "tls")]
impl amiquip::IoStream for crate::connection::tls::TlsIo {}
