//! A real three-node RabbitMQ cluster on this machine (`scripts/cluster start`: nodes
//! `acemq-a`, `-b`, `-c` on 127.0.0.1:5673–5675; the broker on 5672 is not involved).
//!
//! These tests fail — never skip — when the cluster cannot be started. They stop and restart
//! nodes, so they run one at a time. The nodes are RabbitMQ 3.10 or, in `scripts/test`'s 4.x
//! run, RabbitMQ 4.x (`ACEMQ_NODES_MAJOR=4`); either way they are asked through the run's
//! rabbitmqctl (`support::rabbitmqctl_command`, with `-n node`).

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::{
    retry_queue, Connection, ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec,
    RetryPolicy,
};
use support::{eventually, unique};

const NODES: [(&str, u16); 3] = [
    ("acemq-a@localhost", 5673),
    ("acemq-b@localhost", 5674),
    ("acemq-c@localhost", 5675),
];

/// One test at a time (they stop nodes), and the cluster started once.
static SERIAL: Mutex<()> = Mutex::new(());

fn url(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/")
}

fn reachable(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    )
    .is_ok()
}

/// The cluster is up (started here if `scripts/test` did not start it), or the test fails
/// saying why.
fn ensure_cluster() {
    if NODES.iter().all(|(_, port)| reachable(*port)) {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster");
    let out = std::process::Command::new(script)
        .arg("start")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {script}: {e}"));
    assert!(
        out.status.success() && NODES.iter().all(|(_, port)| reachable(*port)),
        "the three-node cluster did not start ({script} start): {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ctl(node: &str, args: &[&str]) -> String {
    let out = support::rabbitmqctl_command()
        .arg("-n")
        .arg(node)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run rabbitmqctl: {e}"));
    assert!(
        out.status.success(),
        "rabbitmqctl -n {node} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Restarts a stopped node's application when dropped (also when the test fails), and waits
/// until it is back in the cluster.
struct StoppedNode(&'static str);

impl StoppedNode {
    fn stop(node: &'static str) -> StoppedNode {
        ctl(node, &["stop_app"]);
        StoppedNode(node)
    }
}

impl Drop for StoppedNode {
    fn drop(&mut self) {
        let _ = support::rabbitmqctl_command()
            .args(["-n", self.0, "start_app"])
            .output();
        let _ = support::rabbitmqctl_command()
            .args(["-n", self.0, "await_startup"])
            .output();
    }
}

/// The node a named connection is on (by the server port it reached), asked of a running node.
fn node_of(name: &str, ask: &str) -> &'static str {
    let mut listing = String::new();
    let mut line = None;
    let listed = eventually(Duration::from_secs(20), || {
        listing = ctl(
            ask,
            &[
                "list_connections",
                "port",
                "client_properties",
                "-q",
                "--no-table-headers",
            ],
        );
        line = listing
            .lines()
            .find(|l| l.contains(name))
            .map(str::to_string);
        line.is_some()
    });
    assert!(listed, "connection {name} is on no node: {listing}");
    let line = line.unwrap_or_default();
    let port: u16 = line
        .split('\t')
        .next()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    NODES
        .iter()
        .find(|(_, p)| *p == port)
        .map(|(n, _)| *n)
        .unwrap_or_else(|| panic!("connection {name} is on port {port}, not a node"))
}

fn another(node: &str) -> &'static str {
    NODES.iter().map(|(n, _)| *n).find(|n| *n != node).unwrap()
}

fn cluster_connection(name: &str) -> Connection {
    let mut options = ConnectionOptions::new()
        .name(name)
        .heartbeat(Duration::from_secs(2))
        .backoff_min(Duration::from_millis(100))
        .backoff_max(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(5));
    for (_, port) in NODES {
        options = options.address(url(port));
    }
    acemq_amqp::Connection::open_with(options)
        .unwrap_or_else(|e| panic!("cannot connect to the cluster on 5673–5675: {e}"))
}

/// Deletes the test's queues through any running node when dropped.
struct ClusterCleanup(Vec<String>);

impl Drop for ClusterCleanup {
    fn drop(&mut self) {
        for (_, port) in NODES {
            if let Ok(c) = Connection::open(&url(port)) {
                for q in &self.0 {
                    let _ = c.delete_queue(q);
                }
                let _ = c.close();
                return;
            }
        }
    }
}

/// Publishes `ids` confirmed, publishing again whatever failed (a connection lost during a
/// failover), until every one is confirmed; returns how many publishes were repeated.
fn publish_all(
    conn: &Connection,
    queue: &str,
    ids: &[String],
    confirmed: &AtomicU64,
    pace: Duration,
) -> u64 {
    let publisher = conn.publisher().expect("publisher");
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut repeated = 0;
    for chunk in ids.chunks(50) {
        let mut todo: Vec<&String> = chunk.iter().collect();
        while !todo.is_empty() {
            assert!(
                Instant::now() < deadline,
                "publishes not confirmed within 120 s"
            );
            let mut failed = Vec::new();
            let mut tickets = Vec::new();
            for id in &todo {
                let m = Message::new(id.as_bytes().to_vec())
                    .with_id(id.as_str())
                    .with_persistent(true);
                match publisher.publish_deferred("", queue, m) {
                    Ok(t) => tickets.push((*id, t)),
                    Err(e) => {
                        assert!(e.is_retriable(), "publish failed for good: {e}");
                        failed.push(*id);
                    }
                }
            }
            for (id, t) in tickets {
                match t.wait() {
                    Ok(()) => {
                        confirmed.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => {
                        assert!(e.is_retriable(), "publish failed for good: {e}");
                        failed.push(id);
                    }
                }
            }
            if !failed.is_empty() {
                repeated += failed.len() as u64;
                // The connection is failing over: wait for it rather than spin.
                let _ = conn.wait_connected(Duration::from_secs(30));
            }
            todo = failed;
        }
        // Spread the run out so that publishes are in flight while a node stops.
        std::thread::sleep(pace);
    }
    let _ = publisher.close();
    repeated
}

/// A connection given all three addresses is on one node; that node's application is stopped
/// mid-run. The connection fails over to another address, the consumer resumes, every publish
/// is confirmed (those lost in the failover published again), and every message arrives.
#[test]
fn the_connection_fails_over_to_another_node_and_nothing_is_lost() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    ensure_cluster();
    let n = 3000usize;
    let name = unique("cluster-failover");
    let q = name.clone();
    let _clean = ClusterCleanup(vec![q.clone(), format!("{q}.dlq"), format!("{q}.parked")]);
    let conn = cluster_connection(&name);
    conn.declare_queue(&QueueSpec::new(&q))
        .expect("declare a quorum queue on the cluster");

    let seen = Arc::new(Mutex::new(HashSet::new()));
    let deliveries = Arc::new(AtomicU64::new(0));
    let (s, d) = (seen.clone(), deliveries.clone());
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(2).prefetch(50))
        .unwrap()
        .start(move |m: &Message| {
            d.fetch_add(1, Ordering::SeqCst);
            s.lock().unwrap().insert(m.id().to_string());
            Ok(Outcome::Accept)
        })
        .unwrap();

    let ids: Vec<String> = (0..n).map(|i| format!("{name}-{i}")).collect();
    let confirmed = AtomicU64::new(0);
    let before = conn.generation();
    let started = Instant::now();
    let (stopped, repeated, failover) = std::thread::scope(|scope| {
        let publishing =
            scope.spawn(|| publish_all(&conn, &q, &ids, &confirmed, Duration::from_millis(50)));
        let a_third = eventually(Duration::from_secs(60), || {
            assert!(!publishing.is_finished(), "publishing ended early");
            confirmed.load(Ordering::SeqCst) >= (n / 3) as u64
        });
        assert!(a_third, "a third of the messages not confirmed within 60 s");
        let node = node_of(&name, NODES[0].0);
        let stopped_at = Instant::now();
        let guard = StoppedNode::stop(node);
        // The connection notices and reconnects to another address.
        let failed_over = eventually(Duration::from_secs(60), || {
            conn.generation() != before && conn.is_connected()
        });
        let failover = stopped_at.elapsed();
        assert!(failed_over, "no failover within 60 s of stopping {node}");
        let now_on = node_of(&name, another(node));
        assert_ne!(now_on, node, "still on the stopped node");
        let repeated = publishing.join().expect("publishing failed");
        (guard, repeated, failover)
    });
    // Fails below, with the figures, when they do not all arrive.
    eventually(Duration::from_secs(120), || seen.lock().unwrap().len() >= n);
    let got = seen.lock().unwrap().len();
    println!(
        "cluster failover: {n} messages in {:.1} s, node {} stopped, reconnected in {:.1} s; \
         publishes repeated {repeated}; deliveries {}, duplicates {}, lost {}",
        started.elapsed().as_secs_f64(),
        stopped.0,
        failover.as_secs_f64(),
        deliveries.load(Ordering::SeqCst),
        deliveries.load(Ordering::SeqCst).saturating_sub(got as u64),
        n - got
    );
    assert_eq!(got, n, "lost messages");
    assert!(
        ids.iter().all(|id| seen.lock().unwrap().contains(id)),
        "an id that was not sent"
    );
    consumer.close().expect("close the consumer");
    drop(stopped);
    let _ = conn.close();
}

/// Opt-in quorum rungs (`RetryPolicy::quorum_rungs`): messages waiting out a retry on a rung
/// whose leader node is stopped are still dead-lettered home and retried; none is lost.
#[test]
fn a_retry_waiting_on_a_quorum_rung_survives_the_loss_of_a_node() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    ensure_cluster();
    let n = 50usize;
    let name = unique("cluster-rung");
    let q = name.clone();
    let wait = Duration::from_secs(10);
    let rung = retry_queue(&q, wait);
    let _clean = ClusterCleanup(vec![
        q.clone(),
        rung.clone(),
        format!("{q}.dlq"),
        format!("{q}.parked"),
    ]);
    let conn = cluster_connection(&name);
    conn.declare_queue(&QueueSpec::new(&q))
        .expect("declare a quorum queue on the cluster");
    let policy = RetryPolicy::fixed(2, wait)
        .broker_wait_threshold(Duration::from_secs(1))
        .quorum_rungs(true);
    let retried = Arc::new(Mutex::new(HashSet::new()));
    let first = Arc::new(AtomicU64::new(0));
    let (r, f) = (retried.clone(), first.clone());
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(policy))
        .unwrap()
        .start(move |m: &Message| {
            if m.envelope.attempt == 1 {
                f.fetch_add(1, Ordering::SeqCst);
                return Ok(Outcome::retry("first attempt fails"));
            }
            r.lock().unwrap().insert(m.id().to_string());
            Ok(Outcome::Accept)
        })
        .unwrap();
    let ids: Vec<String> = (0..n).map(|i| format!("{name}-{i}")).collect();
    publish_all(&conn, &q, &ids, &AtomicU64::new(0), Duration::ZERO);

    // All of them wait on the rung; stop the node that leads it.
    assert!(
        eventually(Duration::from_secs(30), || {
            conn.queue_info(&rung).map(|i| i.message_count).unwrap_or(0) >= n as u32
        }),
        "the messages did not reach the rung {rung}"
    );
    let listing = ctl(
        NODES[0].0,
        &[
            "list_queues",
            "name",
            "type",
            "leader",
            "-q",
            "--no-table-headers",
        ],
    );
    let line = listing
        .lines()
        .find(|l| l.split('\t').next() == Some(rung.as_str()))
        .unwrap_or_else(|| panic!("rung {rung} not listed: {listing}"));
    assert!(
        line.contains("quorum"),
        "the rung is not a quorum queue: {line}"
    );
    let leader = NODES
        .iter()
        .map(|(n, _)| *n)
        .find(|n| line.contains(n))
        .unwrap_or_else(|| panic!("no leader in {line:?}"));
    let stopped = StoppedNode::stop(leader);

    // Fails below, with the figures, when they do not all come back.
    eventually(Duration::from_secs(90), || {
        retried.lock().unwrap().len() >= n
    });
    let got = retried.lock().unwrap().len();
    println!(
        "quorum rung: {n} messages waited {wait:?} on {rung}; its leader {leader} stopped while \
         they waited; retried and accepted {got}, lost {}",
        n - got
    );
    assert_eq!(got, n, "messages lost from the rung with its leader");
    assert!(first.load(Ordering::SeqCst) >= n as u64);
    consumer.close().expect("close the consumer");
    drop(stopped);
    let _ = conn.close();
}
