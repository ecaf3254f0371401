//! The actuator's listener on `std::net`, bounded in connections, time and bytes:
//! `acemq-actuator` accepts; each connection gets a thread of its own, `acemq-actuator-client`,
//! up to [`MAX_CONNECTIONS`] open at once (past that a new one is answered 503 on the accepting
//! thread and closed); each has [`CLIENT_TIMEOUT`] to send its request head and as long again
//! for its answer to be written (`request.rs`). `acemq-actuator-stop` waits for the stop and
//! wakes the accepting thread.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::request::{self, NoRequest, Request, Response};
use crate::error::{Error, Result};
use crate::stop::StopHandle;

/// The most client connections open at once.
pub(super) const MAX_CONNECTIONS: usize = 256;

/// How long a client has to send its request head from its connect, and again for its answer
/// to be written.
pub(super) const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// The pause after a failed accept that is not the client's (out of file descriptors), so the
/// accepting thread does not spin.
const ACCEPT_PAUSE: Duration = Duration::from_millis(200);

/// What answers a request; called on the connection's own thread.
pub(super) trait Answer: Send + Sync + 'static {
    fn answer(&self, request: &Request) -> Response;
}

/// A listening server. [`shut`](Self::shut) stops and waits for it.
pub(super) struct Server {
    local_addr: SocketAddr,
    stop: StopHandle,
    accept: Option<JoinHandle<()>>,
    watcher: Option<JoinHandle<bool>>,
    clients: Arc<Clients>,
}

/// The open connections: a clone of each socket (to stop reading it on close), and whether a
/// connection's thread panicked.
#[derive(Default)]
struct Clients {
    state: Mutex<ClientsState>,
    changed: Condvar,
}

#[derive(Default)]
struct ClientsState {
    next: u64,
    open: HashMap<u64, Option<TcpStream>>,
    panicked: bool,
}

impl Clients {
    fn lock(&self) -> MutexGuard<'_, ClientsState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn close(&self, id: u64) {
        let mut state = self.lock();
        state.open.remove(&id);
        state.panicked |= std::thread::panicking();
        self.changed.notify_all();
    }
}

/// Held by a connection's thread: its entry goes when the thread ends, however it ends.
struct Open {
    clients: Arc<Clients>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.clients.close(self.id);
    }
}

fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name.into()).spawn(f)
}

impl Server {
    /// Binds `bind` and starts accepting; each request is answered by `answer`.
    pub(super) fn start(bind: &str, answer: Arc<dyn Answer>) -> Result<Server> {
        let io = |context: String| {
            move |source| Error::Io {
                context: context.clone(),
                source,
            }
        };
        let listener =
            TcpListener::bind(bind).map_err(io(format!("binding the actuator to {bind}")))?;
        let local_addr = listener.local_addr().map_err(io(format!(
            "reading the address the actuator bound ({bind})"
        )))?;
        let stopped = Arc::new(AtomicBool::new(false));
        let (wake, woken) = crossbeam_channel::bounded::<()>(1);
        let stop = StopHandle::with_waker(Arc::clone(&stopped), wake);
        let clients = Arc::new(Clients::default());
        let spawning = io("spawning the actuator's threads".into());
        let watcher = spawn("acemq-actuator-stop", move || {
            let _ = woken.recv();
            wake_listener(local_addr)
        })
        .map_err(&spawning)?;
        let accept = {
            let clients = Arc::clone(&clients);
            spawn("acemq-actuator", move || {
                accept_loop(&listener, &stopped, &clients, &answer)
            })
        };
        let accept = match accept {
            Ok(a) => a,
            Err(e) => {
                stop.stop();
                let _ = watcher.join();
                return Err(spawning(e));
            }
        };
        Ok(Server {
            local_addr,
            stop,
            accept: Some(accept),
            watcher: Some(watcher),
            clients,
        })
    }

    pub(super) fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub(super) fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Stops accepting and closes the listener; stops reading the requests of clients that
    /// have not sent theirs; waits for the requests being answered to be answered (each answer
    /// written within [`CLIENT_TIMEOUT`]). True when a thread panicked.
    pub(super) fn shut(&mut self) -> bool {
        self.stop.stop();
        let mut panicked = false;
        let woke = match self.watcher.take().map(JoinHandle::join) {
            Some(Ok(woke)) => woke,
            Some(Err(_)) => {
                panicked = true;
                false
            }
            None => true,
        };
        if let Some(accept) = self.accept.take() {
            if woke {
                panicked |= accept.join().is_err();
            } else {
                log::warn!(
                    "acemq: the actuator's listener on {} could not be woken; it closes at its \
                     next connection",
                    self.local_addr
                );
            }
        }
        let mut state = self.clients.lock();
        for socket in state.open.values().flatten() {
            // A thread waiting for a request head reads its end now; one answering is not
            // disturbed (its socket still writes).
            let _ = socket.shutdown(Shutdown::Read);
        }
        while !state.open.is_empty() {
            state = self
                .clients
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        panicked | state.panicked
    }
}

/// Connects to the listener so its blocked `accept` returns and sees the stop (the unspecified
/// address replaced by loopback). False when that fails.
fn wake_listener(addr: SocketAddr) -> bool {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    TcpStream::connect_timeout(&SocketAddr::new(ip, addr.port()), Duration::from_secs(1)).is_ok()
}

/// `acemq-actuator`: accepts until stopped; the listener closes when it returns.
fn accept_loop(
    listener: &TcpListener,
    stopped: &AtomicBool,
    clients: &Arc<Clients>,
    answer: &Arc<dyn Answer>,
) {
    loop {
        let accepted = listener.accept();
        if stopped.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, _)) => admit(stream, clients, answer),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted | ErrorKind::Interrupted
                ) => {}
            Err(e) => {
                log::warn!("acemq: the actuator could not accept a connection: {e}");
                std::thread::sleep(ACCEPT_PAUSE);
            }
        }
    }
}

/// Gives `stream` a thread of its own, or answers it 503 when [`MAX_CONNECTIONS`] are open.
fn admit(stream: TcpStream, clients: &Arc<Clients>, answer: &Arc<dyn Answer>) {
    let accepted = Instant::now();
    let id = {
        let mut state = clients.lock();
        if state.open.len() >= MAX_CONNECTIONS {
            drop(state);
            refuse(stream);
            return;
        }
        let id = state.next;
        state.next += 1;
        state.open.insert(id, stream.try_clone().ok());
        id
    };
    let open = Open {
        clients: Arc::clone(clients),
        id,
    };
    let answer = Arc::clone(answer);
    // On a failed spawn the closure, and with it `open` and the socket, is dropped: the entry
    // goes and the client sees the connection close.
    if let Err(e) = spawn("acemq-actuator-client", move || {
        let _open = open;
        serve(stream, accepted, &*answer);
    }) {
        log::warn!("acemq: the actuator could not start a thread for a connection: {e}");
    }
}

/// Answers 503 on the accepting thread, without waiting: what the client sent already is read
/// (so closing does not reset the connection under the answer), the answer written if the
/// socket takes it at once.
fn refuse(mut stream: TcpStream) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let mut chunk = [0u8; 2048];
    let mut read = 0;
    while read < request::MAX_HEAD {
        match stream.read(&mut chunk) {
            Ok(n) if n > 0 => read += n,
            _ => break,
        }
    }
    let busy = Response::text(
        503,
        format!("busy: {MAX_CONNECTIONS} connections are open already\n"),
    );
    let _ = stream.write_all(&request::encode(&busy, false));
    let _ = stream.shutdown(Shutdown::Write);
}

/// `acemq-actuator-client`: reads one request within [`CLIENT_TIMEOUT`] of the connect,
/// answers it within as long again, and closes.
fn serve(mut stream: TcpStream, accepted: Instant, answer: &dyn Answer) {
    let (response, head_only, path) =
        match request::read_head(&mut stream, accepted + CLIENT_TIMEOUT) {
            Ok(head) => match request::parse(&head) {
                Ok(request) => (answer.answer(&request), request.head_only, request.path),
                Err(response) => (response, false, String::new()),
            },
            Err(NoRequest::TimedOut) => (
                Response::text(
                    408,
                    format!("the request did not arrive within {CLIENT_TIMEOUT:?}\n"),
                ),
                false,
                String::new(),
            ),
            Err(NoRequest::TooLarge) => (
                Response::text(
                    431,
                    format!(
                        "the request line and headers are over {} bytes\n",
                        request::MAX_HEAD
                    ),
                ),
                false,
                String::new(),
            ),
            Err(NoRequest::Gone) => return,
        };
    let bytes = request::encode(&response, head_only);
    if let Err(e) = request::send(&mut stream, &bytes, Instant::now() + CLIENT_TIMEOUT) {
        log::debug!(
            "acemq: the actuator's answer ({}) to {path:?} was not delivered: {e}",
            response.status
        );
    }
}
