//! Test helpers: the broker's address, unique names, clean-up, a TCP fault proxy,
//! `rabbitmqctl` wrappers and a broker memory alarm ([`alarm::Watermark`]). Tests that need RabbitMQ fail (never skip) when it is unreachable.
#![allow(dead_code)] // each test binary uses a different part of this module

#[cfg(feature = "sqlite")]
pub mod ack;
pub mod alarm;
pub mod both;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub mod db;
#[cfg(feature = "actuator")]
pub mod http;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub mod idem;
pub mod keyed;
pub mod logs;
pub mod observe;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
pub mod outbox;
pub mod pipe;
pub mod proxy;
pub mod raw;
pub mod slip;
#[cfg(feature = "tls")]
pub mod tls_proxy;
pub mod users;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use acemq_amqp::{Connection, ConnectionOptions, QueueSpec};

/// The broker tests use: `ACEMQ_TEST_AMQP_URL` (scripts/test sets it for each RabbitMQ major).
/// Unset, the test fails saying so: a test must reach the broker it is given, not whichever
/// one happens to listen on 5672.
pub fn amqp_url() -> String {
    match std::env::var("ACEMQ_TEST_AMQP_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "ACEMQ_TEST_AMQP_URL is not set: run the tests with `scripts/test`, which starts \
             each RabbitMQ major and sets it, or set it to the broker to test against"
        ),
    }
}

/// Connects, or fails the test with a message saying how to start the broker.
pub fn connect() -> Connection {
    connect_with(ConnectionOptions::new().address(amqp_url()))
}

/// Connects with options, or fails the test clearly.
pub fn connect_with(options: ConnectionOptions) -> Connection {
    match acemq_amqp::Connection::open_with(options) {
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

/// A connection to the tests' broker, its clean-up, and a queue of the test's own named after
/// `prefix`, declared with the library's defaults. Hold the clean-up while the queue is used.
pub fn declared_queue(prefix: &str) -> (Connection, Cleanup, String) {
    declared_queue_with(prefix, |spec| spec)
}

/// [`declared_queue`] with the spec shaped by `spec` (`QueueSpec::classic`, [`full_at_one`], …).
pub fn declared_queue_with(
    prefix: &str,
    spec: impl FnOnce(QueueSpec) -> QueueSpec,
) -> (Connection, Cleanup, String) {
    let conn = connect();
    let (clean, q) = queue_on(&conn, prefix, spec);
    (conn, clean, q)
}

/// [`declared_queue`] for a queue a consumer runs on: its `.dlq` / `.parked` cleaned up too.
pub fn declared_consumed_queue(prefix: &str) -> (Connection, Cleanup, String) {
    declared_consumed_queue_with(prefix, |spec| spec)
}

/// [`declared_consumed_queue`] with the spec shaped by `spec`.
pub fn declared_consumed_queue_with(
    prefix: &str,
    spec: impl FnOnce(QueueSpec) -> QueueSpec,
) -> (Connection, Cleanup, String) {
    let conn = connect();
    let (clean, q) = consumed_queue_on(&conn, prefix, spec);
    (conn, clean, q)
}

/// On a connection of the test's own (its options): the clean-up and a queue named after
/// `prefix`, declared with the spec shaped by `spec`.
pub fn queue_on(
    conn: &Connection,
    prefix: &str,
    spec: impl FnOnce(QueueSpec) -> QueueSpec,
) -> (Cleanup, String) {
    let mut clean = Cleanup::new(conn);
    let q = clean.queue(&unique(prefix));
    conn.declare_queue(&spec(QueueSpec::new(&q))).unwrap();
    (clean, q)
}

/// [`queue_on`] for a queue a consumer runs on: its `.dlq` / `.parked` cleaned up too.
pub fn consumed_queue_on(
    conn: &Connection,
    prefix: &str,
    spec: impl FnOnce(QueueSpec) -> QueueSpec,
) -> (Cleanup, String) {
    let mut clean = Cleanup::new(conn);
    let q = clean.consumed_queue(&unique(prefix), &[]);
    conn.declare_queue(&spec(QueueSpec::new(&q))).unwrap();
    (clean, q)
}

/// A classic queue that holds one message and makes the broker nack (`x-overflow:
/// reject-publish`) any publish that does not fit.
pub fn full_at_one(spec: QueueSpec) -> QueueSpec {
    spec.classic()
        .max_length(1)
        .argument("x-overflow", "reject-publish")
}

/// A connection to the tests' broker that reports to `observer`.
pub fn connect_observed(observer: std::sync::Arc<dyn acemq_amqp::observe::Observer>) -> Connection {
    connect_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .observer(observer),
    )
}

/// Waits (up to `timeout`) for the first dead letter of `queue` in its `.dlq` and takes it.
pub fn first_dead_letter(conn: &Connection, queue: &str, timeout: Duration) -> acemq_amqp::Message {
    let dlq = acemq_amqp::dead_letter_queue(queue);
    let mut dead = None;
    assert!(
        eventually(timeout, || {
            dead = conn.get(&dlq).unwrap();
            dead.is_some()
        }),
        "no dead letter in {dlq}"
    );
    dead.unwrap()
}

/// This test binary run again in a child process, to run only its ignored `crash_child` test
/// (which the child's environment directs); add `.env(…)` and run it.
pub fn crash_child() -> std::process::Command {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child.args([
        "crash_child",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    child
}

/// The headers the scheduler addresses a message with, none of which the delivered message
/// keeps (with the broker's `x-death`).
pub const SCHEDULE_ONLY_HEADERS: [&str; 5] = [
    acemq_amqp::headers::SCHEDULE_EXCHANGE,
    acemq_amqp::headers::SCHEDULE_ROUTING_KEY,
    acemq_amqp::headers::SCHEDULE_DUE_AT,
    acemq_amqp::headers::SCHEDULE_CONTENT_TYPE,
    "x-death",
];

/// The TLS node's test certificates (`ACEMQ_TLS_DIR`, default `/var/tmp/acemq-tls`), or a
/// failure saying how to start the node for the `test` binary.
pub fn tls_certs(test: &str) -> std::path::PathBuf {
    let base = std::env::var("ACEMQ_TLS_DIR").unwrap_or_else(|_| "/var/tmp/acemq-tls".into());
    let dir = std::path::PathBuf::from(base).join("certs");
    assert!(
        dir.join("ca.crt").exists(),
        "no test certificates in {}: the TLS node is not running. Run `scripts/test`, or \
         `scripts/tls-node start` before `cargo test --features tls --test {test}`",
        dir.display()
    );
    dir
}

/// The public `acemq_amqp::testing::Cleanup` on the tests' broker, made from a connection as
/// older tests do; dereferences to it (`queue`, `consumed_queue`, `exchange`, `table`, …).
pub struct Cleanup(acemq_amqp::testing::Cleanup);

impl Cleanup {
    pub fn new(_connection: &Connection) -> Self {
        Cleanup(acemq_amqp::testing::Cleanup::new(amqp_url()))
    }
}

impl std::ops::Deref for Cleanup {
    type Target = acemq_amqp::testing::Cleanup;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Cleanup {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

/// A request queue (classic, for speed) named after `prefix`, declared, with the responder's
/// `.dlq` / `.parked` cleaned up.
pub fn request_queue(connection: &Connection, clean: &mut Cleanup, prefix: &str) -> String {
    let q = clean.consumed_queue(&unique(prefix), &[]);
    connection
        .declare_queue(&acemq_amqp::QueueSpec::new(&q).classic())
        .expect("declare the request queue");
    q
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
        let m = acemq_amqp::Message::new(format!("{i}")).with_persistent(persistent);
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

/// A consumer (no declarations) that keeps every message of `queue`, and what it kept so far.
pub fn collect(
    conn: &Connection,
    queue: &str,
) -> (
    acemq_amqp::RunningConsumer,
    std::sync::Arc<std::sync::Mutex<Vec<acemq_amqp::Message>>>,
) {
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let g = got.clone();
    let consumer = conn
        .consumer(queue, acemq_amqp::ConsumerOptions::new().declare(false))
        .expect("a consumer")
        .start(move |m: &acemq_amqp::Message| {
            g.lock().unwrap().push(m.clone());
            Ok(acemq_amqp::Outcome::Accept)
        })
        .expect("the consumer starts");
    (consumer, got)
}

/// Polls `f` until it is true or `timeout` passes (`acemq_amqp::testing::wait_until`).
pub fn eventually(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    acemq_amqp::testing::wait_until(timeout, f).is_ok()
}

/// Waits (up to `timeout`) until `queue` holds exactly `n` messages; fails the test, saying how
/// many it holds, if it does not.
pub fn wait_for_count(conn: &Connection, queue: &str, n: u32, timeout: Duration) {
    assert!(
        eventually(timeout, || conn.queue_info(queue).unwrap().message_count
            == n),
        "{queue} holds {:?} messages, not {n}",
        conn.queue_info(queue).map(|info| info.message_count)
    );
}

/// Sets its flag when dropped. Inside `std::thread::scope`, a failed assertion in the scope's
/// own body still waits for every spawned thread: threads that loop until a stop flag would keep
/// it waiting for ever, turning a failure into a hang. Hold one of these first in the body.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The `rabbitmqctl` command for the tests' broker: `ACEMQ_TEST_RABBITMQCTL` (a command line,
/// split on whitespace, e.g. `scripts/rabbit4 ctl` for the RabbitMQ 4.x node), default
/// `rabbitmqctl` (the local node). Every test that asks the broker something goes through it, so
/// the suite runs against whichever node `ACEMQ_TEST_AMQP_URL` names.
pub fn rabbitmqctl_command() -> std::process::Command {
    let line = std::env::var("ACEMQ_TEST_RABBITMQCTL").unwrap_or_else(|_| "rabbitmqctl".into());
    let mut words = line.split_whitespace();
    let program = words.next().unwrap_or("rabbitmqctl");
    // A relative path is the project's own script: resolve it from the workspace root.
    let program = if program.contains('/') && !program.starts_with('/') {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = if root.join("scripts").is_dir() {
            root.to_path_buf()
        } else {
            root.join("..")
        };
        root.join(program).to_string_lossy().into_owned()
    } else {
        program.to_string()
    };
    let mut command = std::process::Command::new(program);
    command.args(words);
    command
}

/// Runs `rabbitmqctl` (for the tests' broker, [`rabbitmqctl_command`]) with arguments; panics
/// with its output if it fails.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let out = rabbitmqctl_command()
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

/// The tests' broker's `host:port` (from [`amqp_url`], read by the library's own parser), for
/// fault proxies and raw sockets. A URL it cannot read fails the test, saying so.
pub fn broker_addr() -> String {
    let url = amqp_url();
    acemq_amqp::Address::parse(&url)
        .unwrap_or_else(|e| panic!("ACEMQ_TEST_AMQP_URL {url:?} cannot be read: {e}"))
        .host_port()
}

/// The tests' broker's major version (3 or 4), as the broker announced it to a connection
/// (`Connection::broker_major`), once per test binary. A test whose expectation differs between
/// majors asserts the one it runs against: no test is skipped for it.
pub fn broker_major() -> u32 {
    static MAJOR: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *MAJOR.get_or_init(|| {
        let conn = connect();
        let major = conn.broker_major().unwrap_or_else(|| {
            panic!(
                "the broker at {} did not announce its version ({:?})",
                amqp_url(),
                conn.broker_version()
            )
        });
        let _ = conn.close();
        major
    })
}

/// The broker's pids of the connections whose client-provided `information` is exactly `name`.
pub fn connection_pids_named(name: &str) -> Vec<String> {
    let listing = rabbitmqctl(&[
        "list_connections",
        "pid",
        "client_properties",
        "-q",
        "--no-table-headers",
    ]);
    listing
        .lines()
        .filter(|l| l.contains(name))
        .map(|line| line.split('\t').next().unwrap_or_default().to_string())
        .collect()
}

/// Closes, from the broker's side, the connections whose client-provided `information` is
/// exactly `name` (and no other test's). Returns how many were closed.
pub fn close_connections_named(name: &str) -> usize {
    let pids = connection_pids_named(name);
    for pid in &pids {
        rabbitmqctl(&["close_connection", pid, "closed by an acemq test"]);
    }
    pids.len()
}

/// A fault proxy in front of the tests' broker and a connection through it that reconnects
/// quickly (backoff from 50 ms up to `backoff_max`). Hold both: the proxy is the way in.
pub fn through_proxy(backoff_max: Duration) -> (acemq_amqp::testing::FaultProxy, Connection) {
    through_proxy_with(
        ConnectionOptions::new()
            .backoff_min(Duration::from_millis(50))
            .backoff_max(backoff_max),
    )
}

/// A fault proxy in front of the tests' broker and a connection through it with `options`
/// (their address replaced by the proxy's).
pub fn through_proxy_with(
    options: ConnectionOptions,
) -> (acemq_amqp::testing::FaultProxy, Connection) {
    let proxy = acemq_amqp::testing::FaultProxy::start(&amqp_url()).expect("fault proxy");
    let conn = connect_with(options.address(proxy.url()));
    (proxy, conn)
}

/// A started requester on `conn` whose requests go to `queue` through the default exchange.
pub fn requester(
    conn: &Connection,
    queue: &str,
) -> acemq_amqp::patterns::request_reply::RunningRequester {
    use acemq_amqp::patterns::request_reply::{Requester, RequesterOptions};
    Requester::new(conn, RequesterOptions::new().routing_key(queue))
        .and_then(Requester::start)
        .expect("a started requester")
}

/// The test responders' reply: `pong:` and the request's body.
pub fn pong(request: &acemq_amqp::Message) -> acemq_amqp::Message {
    acemq_amqp::Message::new(format!("pong:{}", String::from_utf8_lossy(&request.body)))
}

/// `handler`, counting its calls, and the count.
pub fn counted(
    handler: impl Fn(&acemq_amqp::Message) -> acemq_amqp::HandlerResult + Send + Sync + 'static,
) -> (
    std::sync::Arc<AtomicU64>,
    impl Fn(&acemq_amqp::Message) -> acemq_amqp::HandlerResult + Send + Sync + 'static,
) {
    let calls = std::sync::Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    let counting = move |m: &acemq_amqp::Message| {
        c.fetch_add(1, Ordering::SeqCst);
        handler(m)
    };
    (calls, counting)
}
