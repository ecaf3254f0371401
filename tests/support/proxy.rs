//! A TCP proxy between a client and the broker that can drop every socket on demand, and
//! refuse new ones for a while: the real broker cannot be made to lose a connection on cue.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub struct FaultProxy {
    addr: SocketAddr,
    inner: Arc<Inner>,
}

struct Inner {
    sockets: Mutex<Vec<TcpStream>>,
    /// One flag per connection so far: set, that connection stops forwarding (a silent peer).
    stalls: Mutex<Vec<Arc<AtomicBool>>>,
    /// One flag per connection so far: set, the proxy stops reading from the client at all, so
    /// the client's socket backs up (a broker that stops reading, as under a memory alarm).
    freezes: Mutex<Vec<Arc<AtomicBool>>>,
    refusing: AtomicBool,
    /// While set, new connections are accepted and then left silent (a broker that never
    /// answers the handshake).
    hanging: AtomicBool,
    hung: AtomicUsize,
    /// Client-to-broker byte rewrites (same length), applied to every read.
    mangles: Mutex<Vec<(Vec<u8>, Vec<u8>)>>,
    stopped: AtomicBool,
    accepted: AtomicUsize,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (`host:port`).
    pub fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let inner = Arc::new(Inner {
            sockets: Mutex::new(Vec::new()),
            stalls: Mutex::new(Vec::new()),
            freezes: Mutex::new(Vec::new()),
            refusing: AtomicBool::new(false),
            hanging: AtomicBool::new(false),
            hung: AtomicUsize::new(0),
            mangles: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
        });
        let upstream = upstream.to_string();
        let i = inner.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if i.stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if i.refusing.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                if i.hanging.load(Ordering::SeqCst) {
                    i.hung.fetch_add(1, Ordering::SeqCst);
                    i.sockets.lock().unwrap().push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                i.accepted.fetch_add(1, Ordering::SeqCst);
                {
                    let mut s = i.sockets.lock().unwrap();
                    s.push(client.try_clone().unwrap());
                    s.push(server.try_clone().unwrap());
                }
                let stall = Arc::new(AtomicBool::new(false));
                i.stalls.lock().unwrap().push(stall.clone());
                let freeze = Arc::new(AtomicBool::new(false));
                i.freezes.lock().unwrap().push(freeze.clone());
                pump(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    stall.clone(),
                    Some((i.clone(), freeze)),
                );
                pump(server, client, stall, None);
            }
        });
        FaultProxy { addr, inner }
    }

    /// An AMQP URL that goes through the proxy.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@{}/", self.addr)
    }

    /// Drops every connection going through the proxy now.
    pub fn cut_all(&self) {
        for s in self.inner.sockets.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Every connection so far goes silent (sockets stay open, nothing is forwarded): the
    /// client can only notice through missed heartbeats. New connections are not affected.
    pub fn stall_all(&self) {
        for s in self.inner.stalls.lock().unwrap().iter() {
            s.store(true, Ordering::SeqCst);
        }
    }

    /// Every connection so far stops being read from the client side: what the client writes
    /// piles up in its own socket buffers until it cannot write any more.
    pub fn freeze_all(&self) {
        for f in self.inner.freezes.lock().unwrap().iter() {
            f.store(true, Ordering::SeqCst);
        }
    }

    /// While true, new connections are closed at once.
    pub fn refuse(&self, refusing: bool) {
        self.inner.refusing.store(refusing, Ordering::SeqCst);
    }

    /// While true, new connections are accepted and then never answered: a connect waits for
    /// its timeout.
    pub fn hang(&self, hanging: bool) {
        self.inner.hanging.store(hanging, Ordering::SeqCst);
    }

    /// Connections left hanging so far.
    pub fn hung(&self) -> usize {
        self.inner.hung.load(Ordering::SeqCst)
    }

    /// From now on, bytes the client sends that contain `from` reach the broker with `to` in
    /// its place (same length, so frames stay well formed): a way to send what no Rust client
    /// would, such as a long-string header that is not UTF-8.
    pub fn mangle(&self, from: &[u8], to: &[u8]) {
        assert_eq!(from.len(), to.len(), "a mangle keeps the length");
        self.inner
            .mangles
            .lock()
            .unwrap()
            .push((from.to_vec(), to.to_vec()));
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.inner.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
        self.cut_all();
    }
}

fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    stall: Arc<AtomicBool>,
    client_side: Option<(Arc<Inner>, Arc<AtomicBool>)>,
) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            if let Some((inner, freeze)) = &client_side {
                while freeze.load(Ordering::SeqCst) && !inner.stopped.load(Ordering::SeqCst) {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) if stall.load(Ordering::SeqCst) => {
                    // Swallow what arrives: the other side hears nothing, not even heartbeats.
                }
                Ok(n) => {
                    if let Some((inner, _)) = &client_side {
                        for (from, to) in inner.mangles.lock().unwrap().iter() {
                            let data = &mut buf[..n];
                            if let Some(at) = data.windows(from.len()).position(|w| w == &from[..])
                            {
                                data[at..at + to.len()].copy_from_slice(to);
                            }
                        }
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}
