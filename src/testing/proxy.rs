//! [`FaultProxy`]: a loopback TCP proxy in front of the broker that loses, holds or refuses
//! connections on cue.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How long the proxy waits to reach the upstream for a new connection.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A loopback TCP proxy between a client and the broker that can cut, hold or refuse its
/// connections on demand: the real broker cannot be made to lose a connection on cue.
///
/// Point a [`Connection`](crate::Connection) at [`url`](Self::url) instead of the broker, then:
///
/// * [`cut`](Self::cut) closes every socket through the proxy now (both sides see the
///   connection drop, as when a load balancer or the broker's host goes away);
/// * [`stall`](Self::stall) holds every connection open now: nothing is forwarded either way,
///   the sockets stay open, so the client can notice only through missed heartbeats (about two
///   heartbeat intervals); what was sent is held, not lost, and [`resume`](Self::resume) lets it
///   through. Connections made after the stall are not held, so a client that gives up on the
///   silent one reconnects through the proxy;
/// * [`close_client_side`](Self::close_client_side) ends every connection for the client at
///   once and keeps it open on the broker until the broker gives it up (its heartbeat
///   timeout), as when the client's host vanished: the broker still holds the old connection's
///   exclusive queues when the client reconnects;
/// * [`refuse(true)`](Self::refuse) closes new connections as soon as they arrive (a connect
///   fails) until `refuse(false)`; open ones are not touched;
/// * [`connections`](Self::connections), [`open_connections`](Self::open_connections),
///   [`bytes_upstream`](Self::bytes_upstream) and [`bytes_downstream`](Self::bytes_downstream)
///   count what went through.
///
/// Dropping the proxy (or [`stop`](Self::stop)) closes every connection, stops its threads
/// (it blocks until they are joined) and frees its port.
///
/// ```no_run
/// use std::time::Duration;
/// use acemq_amqp::testing::{wait_until, FaultProxy};
/// use acemq_amqp::ConnectionOptions;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // The broker the test run is given (each RabbitMQ major in turn).
/// let proxy = FaultProxy::start(&std::env::var("ACEMQ_TEST_AMQP_URL")?)?;
/// let connection = acemq_amqp::Connection::open_with(ConnectionOptions::new().address(proxy.url()))?;
/// proxy.cut();
/// wait_until(Duration::from_secs(10), || connection.generation() == Some(2))?;
/// # Ok(()) }
/// ```
///
/// # Threads
///
/// `acemq-fault-proxy` accepts; each connection has two `acemq-fault-proxy-pump` threads (one
/// per direction). All end when the proxy is dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    url: String,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("connections", &self.connections())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

struct Shared {
    upstream: String,
    state: Mutex<State>,
    changed: Condvar,
    connections: AtomicUsize,
    hung: AtomicUsize,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

#[derive(Default)]
struct State {
    links: BTreeMap<u64, Link>,
    next_link: u64,
    refusing: bool,
    hanging: bool,
    stopped: bool,
    /// Client-to-upstream rewrites of the same length.
    mangles: Vec<(Vec<u8>, Vec<u8>)>,
    /// Connections accepted while hanging: never answered, closed by `cut` or drop.
    hung: Vec<TcpStream>,
    pumps: Vec<JoinHandle<()>>,
}

/// One proxied connection.
struct Link {
    client: TcpStream,
    server: TcpStream,
    /// Nothing is forwarded either way.
    held: bool,
    /// Nothing is read from the client.
    frozen: bool,
    /// The client's side is closed and the broker's kept open, what it sends read and dropped,
    /// until the broker closes it ([`FaultProxy::close_client_side`]).
    orphaned: bool,
    /// Pumps still running for it.
    pumps: u8,
}

impl Link {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`: an AMQP URL
    /// (`amqp://user:password@host:port/vhost`, whose credentials and virtual host
    /// [`url`](Self::url) keeps) or a plain `host:port` (then `url` uses `guest`/`guest` and the
    /// default virtual host). A URL without a port means 5672 (`amqps`: 5671).
    ///
    /// # Errors
    ///
    /// When `upstream` has no host, or no loopback port can be bound, or the thread cannot be
    /// started.
    pub fn start(upstream: &str) -> io::Result<FaultProxy> {
        let (target, url_parts) = parse_upstream(upstream)?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let url = match url_parts {
            Some((scheme, credentials, rest)) => format!("{scheme}://{credentials}{addr}{rest}"),
            None => format!("amqp://guest:guest@{addr}/"),
        };
        let shared = Arc::new(Shared {
            upstream: target,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            connections: AtomicUsize::new(0),
            hung: AtomicUsize::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
        });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name("acemq-fault-proxy".into())
            .spawn(move || accept_loop(&listener, &s))?;
        Ok(FaultProxy {
            addr,
            url,
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The proxy's own address (`127.0.0.1:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The AMQP URL that goes through the proxy: the upstream URL with its host and port
    /// replaced by the proxy's.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// Closes every connection through the proxy now, both sides (and those left hanging by
    /// [`hang`](Self::hang)). New connections are accepted as before.
    pub fn cut(&self) {
        let mut state = self.shared.state.lock();
        for (_, link) in std::mem::take(&mut state.links) {
            link.close();
        }
        for s in state.hung.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.shared.changed.notify_all();
    }

    /// Closes the client's side of every connection through the proxy now and keeps the
    /// broker's side open and silent, as when the client's host went away without a word: the
    /// client sees its connection end at once; the broker holds it (and its exclusive queues)
    /// until its heartbeat timeout. What the broker sends meanwhile is read and dropped; the
    /// connection counts in [`open_connections`](Self::open_connections) until the broker closes
    /// it (or [`cut`](Self::cut), or the proxy is dropped). New connections are accepted as
    /// before.
    pub fn close_client_side(&self) {
        let mut state = self.shared.state.lock();
        for link in state.links.values_mut() {
            link.orphaned = true;
            let _ = link.client.shutdown(Shutdown::Both);
        }
    }

    /// Holds every connection open now: nothing is forwarded in either direction and the
    /// sockets stay open (a silent peer, noticed by the client only through missed
    /// heartbeats). Bytes already sent wait in the proxy and the kernel's buffers; they are
    /// forwarded, unchanged and in order, after [`resume`](Self::resume). Connections made
    /// after this call are not held.
    pub fn stall(&self) {
        let mut state = self.shared.state.lock();
        for link in state.links.values_mut() {
            link.held = true;
        }
    }

    /// Lets every held ([`stall`](Self::stall)) or frozen ([`freeze`](Self::freeze)) connection
    /// forward again. A connection the client or the broker closed meanwhile then ends.
    pub fn resume(&self) {
        let mut state = self.shared.state.lock();
        for link in state.links.values_mut() {
            link.held = false;
            link.frozen = false;
        }
        self.shared.changed.notify_all();
    }

    /// Stops reading from the client on every connection open now (the broker's side still
    /// flows): what the client writes piles up in its socket buffers until it cannot write any
    /// more, as when a broker under a memory alarm stops reading. Undone by
    /// [`resume`](Self::resume).
    pub fn freeze(&self) {
        let mut state = self.shared.state.lock();
        for link in state.links.values_mut() {
            link.frozen = true;
        }
    }

    /// While `true`, each new connection is closed as soon as it is accepted, so a connect
    /// through the proxy fails; open connections are not touched. `false` accepts again.
    pub fn refuse(&self, refusing: bool) {
        self.shared.state.lock().refusing = refusing;
    }

    /// While `true`, new connections are accepted and then never answered (a broker that
    /// does not finish the handshake): a connect waits for its own timeout. `false` forwards
    /// new connections again; [`cut`](Self::cut) closes the hanging ones.
    pub fn hang(&self, hanging: bool) {
        self.shared.state.lock().hanging = hanging;
    }

    /// From now on, client-to-upstream bytes that contain `from` (within one read) reach the
    /// upstream with `to` in its place: a way to send what no well-behaved client would, such
    /// as a long-string header that is not UTF-8.
    ///
    /// # Panics
    ///
    /// When `from` and `to` differ in length (a frame would no longer be well formed) or
    /// `from` is empty.
    pub fn mangle(&self, from: &[u8], to: &[u8]) {
        assert_eq!(from.len(), to.len(), "a mangle keeps the length");
        assert!(!from.is_empty(), "a mangle replaces at least one byte");
        self.shared
            .state
            .lock()
            .mangles
            .push((from.to_vec(), to.to_vec()));
    }

    /// Connections forwarded to the upstream so far (refused and hanging ones are not
    /// counted).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.shared.state.lock().links.len()
    }

    /// Connections accepted and left hanging by [`hang`](Self::hang) so far.
    pub fn hung(&self) -> usize {
        self.shared.hung.load(Ordering::SeqCst)
    }

    /// Bytes forwarded from clients to the upstream so far.
    pub fn bytes_upstream(&self) -> u64 {
        self.shared.bytes_up.load(Ordering::SeqCst)
    }

    /// Bytes forwarded from the upstream to clients so far.
    pub fn bytes_downstream(&self) -> u64 {
        self.shared.bytes_down.load(Ordering::SeqCst)
    }

    /// Stops the proxy as dropping it does: closes every connection, joins its threads and
    /// frees the port.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(acceptor) = self.acceptor.take() else {
            return;
        };
        self.shared.state.lock().stopped = true;
        self.cut();
        // Wake the accept loop; it sees `stopped` and drops the listener.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        let _ = acceptor.join();
        let pumps = std::mem::take(&mut self.shared.state.lock().pumps);
        for p in pumps {
            let _ = p.join();
        }
    }
}

impl Drop for FaultProxy {
    /// Stops the proxy: closes every connection and joins its threads (it blocks for that,
    /// which takes no longer than closing the sockets), freeing the port.
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// `(host:port to connect to, Some((scheme, "user:pass@" or "", "/vhost?query")))` for a URL.
type UrlParts = (String, String, String);

fn parse_upstream(upstream: &str) -> io::Result<(String, Option<UrlParts>)> {
    let bad = |why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the fault proxy's upstream {why}"),
        )
    };
    let Some((scheme, rest)) = upstream.split_once("://") else {
        if upstream.is_empty() {
            return Err(bad("is empty"));
        }
        return Ok((upstream.to_string(), None));
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (credentials, host_port) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    if host_port.is_empty() {
        return Err(bad("URL has no host"));
    }
    // A port follows the last ':' outside an IPv6 literal's brackets.
    let after_brackets = host_port
        .rfind(']')
        .map_or(host_port, |i| &host_port[i + 1..]);
    let has_port = after_brackets.contains(':');
    let target = if has_port {
        host_port.to_string()
    } else if scheme == "amqps" {
        format!("{host_port}:5671")
    } else {
        format!("{host_port}:5672")
    };
    let tail = if tail.is_empty() { "/" } else { tail };
    Ok((
        target,
        Some((
            scheme.to_string(),
            credentials.to_string(),
            tail.to_string(),
        )),
    ))
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.state.lock().stopped {
            return;
        }
        let client = match client {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors or similar: wait a little rather than spin.
                log::warn!("acemq: the fault proxy could not accept a connection: {e}");
                let mut state = shared.state.lock();
                if !state.stopped {
                    shared
                        .changed
                        .wait_for(&mut state, Duration::from_millis(50));
                }
                continue;
            }
        };
        {
            let mut state = shared.state.lock();
            if state.refusing {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            if state.hanging {
                shared.hung.fetch_add(1, Ordering::SeqCst);
                state.hung.push(client);
                continue;
            }
        }
        let server = match connect_upstream(&shared.upstream) {
            Ok(s) => s,
            Err(e) => {
                log::warn!(
                    "acemq: the fault proxy could not reach {}: {e}",
                    shared.upstream
                );
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
        };
        if let Err(e) = start_link(shared, client, server) {
            log::warn!("acemq: the fault proxy could not start a connection: {e}");
        }
    }
}

fn connect_upstream(upstream: &str) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for addr in upstream.to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, UPSTREAM_CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn start_link(shared: &Arc<Shared>, client: TcpStream, server: TcpStream) -> io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let link = Link {
        client: client.try_clone()?,
        server: server.try_clone()?,
        held: false,
        frozen: false,
        orphaned: false,
        pumps: 2,
    };
    let (client_read, server_read) = (client.try_clone()?, server.try_clone()?);
    let mut state = shared.state.lock();
    if state.stopped {
        link.close();
        return Ok(());
    }
    let id = state.next_link;
    state.next_link += 1;
    state.links.insert(id, link);
    shared.connections.fetch_add(1, Ordering::SeqCst);
    for (from, to, up) in [(client_read, server, true), (server_read, client, false)] {
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("acemq-fault-proxy-pump".into())
            .spawn(move || pump(&s, id, from, to, up));
        match spawned {
            Ok(handle) => {
                // Finished pumps are pruned here, so the list stays as long as the open links.
                state.pumps.retain(|p| !p.is_finished());
                state.pumps.push(handle);
            }
            Err(e) => {
                if let Some(link) = state.links.remove(&id) {
                    link.close();
                }
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Waits while link `id` may not forward (held, or frozen for the client side). False when the
/// link is gone (cut) or the proxy stopped.
fn may_forward(shared: &Shared, id: u64, up: bool) -> bool {
    let mut state = shared.state.lock();
    loop {
        if state.stopped {
            return false;
        }
        match state.links.get(&id) {
            None => return false,
            Some(link) if link.held || (up && link.frozen) => shared.changed.wait(&mut state),
            Some(_) => return true,
        }
    }
}

/// Whether link `id`'s client side was closed by [`FaultProxy::close_client_side`].
fn orphaned(shared: &Shared, id: u64) -> bool {
    shared
        .state
        .lock()
        .links
        .get(&id)
        .is_some_and(|link| link.orphaned)
}

fn pump(shared: &Shared, id: u64, mut from: TcpStream, mut to: TcpStream, up: bool) {
    let mut buf = vec![0u8; 16 * 1024];
    while may_forward(shared, id, up) {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // The client's side is gone: the broker's bytes go nowhere.
        if !up && orphaned(shared, id) {
            continue;
        }
        // Held while it was reading: keep the bytes until resumed.
        if !may_forward(shared, id, up) {
            break;
        }
        let data = &mut buf[..n];
        if up {
            let state = shared.state.lock();
            for (pattern, replacement) in &state.mangles {
                if let Some(at) = data.windows(pattern.len()).position(|w| w == &pattern[..]) {
                    data[at..at + replacement.len()].copy_from_slice(replacement);
                }
            }
        }
        if to.write_all(data).is_err() {
            break;
        }
        let counter = if up {
            &shared.bytes_up
        } else {
            &shared.bytes_down
        };
        counter.fetch_add(n as u64, Ordering::SeqCst);
    }
    let mut state = shared.state.lock();
    // The client's side closed on purpose: the broker's stays open until the broker closes it.
    if let Some(link) = state.links.get_mut(&id).filter(|l| up && l.orphaned) {
        link.pumps -= 1;
        return;
    }
    drop(state);
    // One side ended: end the connection on both.
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
    let mut state = shared.state.lock();
    let gone = match state.links.get_mut(&id) {
        Some(link) => {
            link.pumps -= 1;
            link.pumps == 0
        }
        None => false,
    };
    if gone {
        state.links.remove(&id);
    }
    // The other pump may be waiting on a hold.
    if let Some(link) = state.links.get_mut(&id) {
        link.held = false;
        link.frozen = false;
    }
    shared.changed.notify_all();
}

#[cfg(test)]
mod tests {
    use super::parse_upstream;

    #[test]
    fn upstream_forms() {
        // (An address is only parsed here, never dialled.)
        let (t, p) = parse_upstream("192.0.2.7:5680").unwrap();
        assert_eq!(t, "192.0.2.7:5680");
        assert!(p.is_none());
        let (t, p) = parse_upstream("amqp://bob:pw@rabbit:5673/prod?heartbeat=5").unwrap();
        assert_eq!(t, "rabbit:5673");
        let (scheme, cred, tail) = p.unwrap();
        assert_eq!(
            (scheme.as_str(), cred.as_str(), tail.as_str()),
            ("amqp", "bob:pw@", "/prod?heartbeat=5")
        );
        let (t, p) = parse_upstream("amqps://rabbit").unwrap();
        assert_eq!(t, "rabbit:5671");
        assert_eq!(p.unwrap().2, "/");
        let (t, _) = parse_upstream("amqp://[::1]:5672/").unwrap();
        assert_eq!(t, "[::1]:5672");
        let (t, _) = parse_upstream("amqp://[::1]/").unwrap();
        assert_eq!(t, "[::1]:5672");
        assert!(parse_upstream("amqp:///").is_err());
        assert!(parse_upstream("").is_err());
    }
}
