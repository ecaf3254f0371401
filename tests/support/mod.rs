//! Test helpers: the broker's address, unique names, clean-up, a TCP fault proxy and
//! `rabbitmqctl` wrappers. Tests that need RabbitMQ fail (never skip) when it is unreachable.
#![allow(dead_code)] // each test binary uses a different part of this module

#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub mod db;
pub mod proxy;
pub mod raw;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use acemq_amqp::{Connection, ConnectionOptions};

/// The broker tests use: `ACEMQ_TEST_AMQP_URL`, default the local guest account.
pub fn amqp_url() -> String {
    std::env::var("ACEMQ_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".to_string())
}

/// Connects, or fails the test with a message saying how to start the broker.
pub fn connect() -> Connection {
    connect_with(ConnectionOptions::new().address(amqp_url()))
}

/// Connects with options, or fails the test clearly.
pub fn connect_with(options: ConnectionOptions) -> Connection {
    match options.open() {
        Ok(c) => c,
        Err(e) => panic!(
            "RabbitMQ is not reachable ({e}). These tests need a real broker at {}: \
             run `scripts/test`, which starts it",
            amqp_url()
        ),
    }
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "test.{prefix}.{}.{}.{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Deletes the named queues and exchanges when dropped (also when a test fails).
pub struct Cleanup {
    pub connection: Connection,
    pub queues: Vec<String>,
    pub exchanges: Vec<String>,
}

impl Cleanup {
    pub fn new(connection: &Connection) -> Self {
        Cleanup {
            connection: connection.clone(),
            queues: Vec::new(),
            exchanges: Vec::new(),
        }
    }
    pub fn queue(&mut self, name: &str) -> String {
        self.queues.push(name.to_string());
        name.to_string()
    }
    /// A consumed queue with its retry rungs, `.dlq` and `.parked`.
    pub fn consumed_queue(&mut self, name: &str, rungs: &[std::time::Duration]) -> String {
        for d in rungs {
            self.queues.push(acemq_amqp::retry_queue(name, *d));
        }
        self.queues.push(acemq_amqp::dead_letter_queue(name));
        self.queues.push(acemq_amqp::parked_queue(name));
        self.queue(name)
    }

    pub fn exchange(&mut self, name: &str) -> String {
        self.exchanges.push(name.to_string());
        name.to_string()
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // A fresh connection: the test's own may be closed or cut by now.
        let Ok(c) = Connection::open(&amqp_url()) else {
            return;
        };
        for q in &self.queues {
            let _ = c.delete_queue(q);
        }
        for x in &self.exchanges {
            let _ = c.delete_exchange(x);
        }
        let _ = c.close();
    }
}

/// Publishes `n` small messages to `queue` through the default exchange, confirmed, in windows;
/// returns their ids in order.
pub fn publish_n(connection: &Connection, queue: &str, n: usize, persistent: bool) -> Vec<String> {
    let publisher = connection
        .publisher_with(acemq_amqp::PublisherOptions::new().window(1000))
        .expect("publisher");
    let mut ids = Vec::with_capacity(n);
    let mut tickets = Vec::with_capacity(500);
    for i in 0..n {
        let m = acemq_amqp::Message::new(format!("{i}")).persistent(persistent);
        ids.push(m.id().to_string());
        tickets.push(publisher.publish_deferred("", queue, m).expect("publish"));
        if tickets.len() == 500 {
            for t in tickets.drain(..) {
                t.wait().expect("confirmed");
            }
        }
    }
    for t in tickets {
        t.wait().expect("confirmed");
    }
    publisher.close().expect("close publisher");
    ids
}

/// Polls `f` until it is true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// Runs `rabbitmqctl` with arguments; panics with its output if it fails.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run rabbitmqctl: {e}"));
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Closes, from the broker's side, the connections whose client-provided `information` is
/// exactly `name` (and no other test's). Returns how many were closed.
pub fn close_connections_named(name: &str) -> usize {
    let listing = rabbitmqctl(&[
        "list_connections",
        "pid",
        "client_properties",
        "-q",
        "--no-table-headers",
    ]);
    let mut closed = 0;
    for line in listing.lines().filter(|l| l.contains(name)) {
        let pid = line.split('\t').next().unwrap_or_default();
        rabbitmqctl(&["close_connection", pid, "closed by an acemq test"]);
        closed += 1;
    }
    closed
}
