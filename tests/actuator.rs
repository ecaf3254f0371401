//! The actuator (feature `actuator`) with a real HTTP client (`ureq`) against the real broker:
//! `/acemq-health` and `/readyz` (200 with the family's fields; 503 while the broker is gone or
//! the service drains, 200 again after), `/livez` (200 throughout), `/acemq-info` (no
//! password), `/acemq-metrics` (a counter this crate emitted), a hanging check holding the
//! answer only to its deadline, and slow or silent clients that hold up no probe and are
//! dropped when their time is up.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use acemq_amqp::actuator::{
    install_prometheus_recorder, Actuator, ActuatorOptions, PrometheusHandle, RunningActuator,
};
use acemq_amqp::health::{HealthCheckOptions, HealthReport};
use acemq_amqp::observe::MetricsObserver;
use acemq_amqp::testing::FaultProxy;
use acemq_amqp::{Connection, ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec};
use crossbeam_channel::Sender;
use support::http::{get, get_within};
use support::{amqp_url, connect_with, eventually, unique};

/// The process's one Prometheus recorder (the `metrics` facade takes one).
fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| install_prometheus_recorder().expect("the first recorder"))
        .clone()
}

/// The body read as JSON, or a failure showing it.
fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// An actuator on `conn` at a free loopback port, started, and its address.
fn actuator_on(conn: &Connection) -> (RunningActuator, SocketAddr) {
    let running = Actuator::new(conn, ActuatorOptions::new().bind("127.0.0.1:0"))
        .unwrap()
        .start()
        .unwrap();
    let addr = running.local_addr();
    (running, addr)
}

/// A connection to the tests' broker and an actuator on it ([`actuator_on`]).
fn actuator() -> (Connection, RunningActuator, SocketAddr) {
    let conn = connect_with(ConnectionOptions::new().address(amqp_url()));
    let (running, addr) = actuator_on(&conn);
    (conn, running, addr)
}

/// [`actuator`] on a connection with a check `name` (given `deadline`) that hangs until the
/// returned sender is dropped (a minute at the most), then answers up.
fn actuator_with_hanging_check(
    name: &str,
    deadline: Duration,
) -> (Sender<()>, Connection, RunningActuator, SocketAddr) {
    let conn = connect_with(ConnectionOptions::new().address(amqp_url()));
    let (hold, held) = crossbeam_channel::bounded::<()>(0);
    conn.add_health_check(
        name,
        HealthCheckOptions::new().deadline(deadline),
        move || {
            let _ = held.recv_timeout(Duration::from_secs(60));
            HealthReport::up()
        },
    )
    .unwrap();
    let (running, addr) = actuator_on(&conn);
    (hold, conn, running, addr)
}

/// Asserts `/livez` (under `prefix`) answers 200 `{"status":"up"}`.
fn assert_live(addr: SocketAddr, prefix: &str) {
    assert_eq!(
        get(addr, &format!("{prefix}/livez")),
        (200, r#"{"status":"up"}"#.to_string())
    );
}

/// Opens `n` connections to `addr`, sending half a request on those `half` picks by index.
fn half_requests(addr: SocketAddr, n: usize, half: impl Fn(usize) -> bool) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = TcpStream::connect(addr).unwrap();
            if half(i) {
                s.write_all(b"GET /acemq-health HTTP/1.1\r\nHost: x\r\n")
                    .unwrap();
            }
            s
        })
        .collect()
}

/// Reads what `s` is sent until the server closes it (within `timeout`): the read's outcome and
/// the text.
fn read_until_closed(mut s: TcpStream, timeout: Duration) -> (std::io::Result<usize>, String) {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut answer = Vec::new();
    let read = s.read_to_end(&mut answer);
    (read, String::from_utf8_lossy(&answer).into_owned())
}

#[test]
fn the_endpoints_answer_health_info_and_metrics_with_the_familys_fields() {
    // The recorder first: what is recorded before it is installed goes nowhere.
    let prometheus = prometheus();
    let conn = connect_with(
        ConnectionOptions::new()
            .address(amqp_url())
            .service("billing")
            .name("billing-actuator-test")
            .observer(MetricsObserver::new()),
    );
    let (_clean, q) = support::consumed_queue_on(&conn, "actuator", QueueSpec::classic);
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(|_: &Message| Ok(Outcome::Accept))
        .unwrap();
    let publisher = conn.publisher().unwrap();
    publisher.publish("", &q, Message::new("counted")).unwrap();

    let running = Actuator::new(
        &conn,
        ActuatorOptions::new()
            .bind("127.0.0.1:0")
            .prometheus(prometheus),
    )
    .unwrap()
    .start()
    .unwrap();
    let addr = running.local_addr();

    let (status, body) = get(addr, "/acemq-health");
    assert_eq!(status, 200, "{body}");
    let health = json(&body);
    assert_eq!(health["status"], "up", "{body}");
    assert!(health["checked"].is_string());
    assert_eq!(health["parts"]["broker"]["status"], "up");
    assert_eq!(health["parts"]["broker"]["parts"]["connected"], true);
    let component = &health["parts"][format!("consumer:{q}")];
    assert_eq!(component["parts"]["subscribed"], true, "{body}");
    assert!(component["parts"]["inFlight"].is_u64());

    let (status, body) = get(addr, "/acemq-info");
    assert_eq!(status, 200);
    let info = json(&body);
    assert_eq!(info["library"], "acemq-amqp");
    // The family's keys (Go's and Java's `/acemq-info`): camelCase, the transport's
    // capabilities as Go writes them.
    assert_eq!(info["libraryVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(info["name"], "billing");
    assert!(
        info.get("version").is_none(),
        "no application version was given"
    );
    assert!(info["origin"].as_str().unwrap().starts_with("billing@"));
    assert_eq!(info["connectionName"], "billing-actuator-test");
    assert_eq!(
        info["transport"],
        serde_json::json!({"publisher-confirms": true, "dead-lettering": true,
            "quorum-queues": true, "streams": true, "recovery": true}),
        "{body}"
    );
    assert!(
        info["address"]
            .as_str()
            .unwrap()
            .starts_with("amqp://guest@"),
        "{body}"
    );
    assert!(!body.contains("guest:guest"), "no password: {body}");

    assert!(
        eventually(Duration::from_secs(10), || {
            let (status, body) = get(addr, "/acemq-metrics");
            status == 200 && body.contains("acemq_consume_total")
        }),
        "{}",
        get(addr, "/acemq-metrics").1
    );
    assert_eq!(get(addr, "/nothing-here").0, 404);

    running.close().unwrap();
    consumer.close().unwrap();
    publisher.close().unwrap();
}

#[test]
fn with_the_broker_gone_health_and_readyz_are_down_503_livez_stays_up_and_all_recover() {
    let proxy = FaultProxy::start(&amqp_url()).expect("the fault proxy");
    let conn = Connection::open_with(
        ConnectionOptions::new()
            .address(proxy.url())
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(200)),
    )
    .unwrap_or_else(|e| {
        panic!("RabbitMQ is not reachable through the proxy ({e}): run `scripts/test`")
    });
    let (running, addr) = actuator_on(&conn);
    assert_eq!(get(addr, "/acemq-health").0, 200);

    proxy.refuse(true);
    proxy.cut();
    assert!(
        eventually(Duration::from_secs(20), || get(addr, "/acemq-health").0
            == 503),
        "{}",
        get(addr, "/acemq-health").1
    );
    // Readiness follows the broker; liveness never asks it (a restart would not bring it back).
    let (status, body) = get(addr, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert_eq!(json(&body)["status"], "down", "{body}");
    assert!(json(&body).get("reason").is_none(), "not draining: {body}");
    assert_live(addr, "");
    let (_, body) = get(addr, "/acemq-health");
    let health = json(&body);
    assert_eq!(health["status"], "down");
    assert_eq!(health["parts"]["broker"]["status"], "down");
    assert_eq!(health["parts"]["broker"]["parts"]["connected"], false);
    assert!(
        health["detail"].as_str().unwrap().contains("broker"),
        "{body}"
    );

    proxy.refuse(false);
    assert!(
        eventually(Duration::from_secs(30), || get(addr, "/acemq-health").0
            == 200),
        "{}",
        get(addr, "/acemq-health").1
    );
    let health = json(&get(addr, "/acemq-health").1);
    assert_eq!(get(addr, "/readyz").0, 200);
    assert_eq!(health["parts"]["broker"]["parts"]["reconnects"], 1);
    assert!(health["parts"]["broker"]["parts"]["lastReconnect"].is_string());
    running.close().unwrap();
    conn.close().unwrap();
}

#[test]
fn a_hanging_check_holds_the_answer_only_to_its_deadline() {
    // Hangs for a minute.
    let (_hold, _conn, running, addr) =
        actuator_with_hanging_check("payments-api", Duration::from_millis(500));
    let asked = Instant::now();
    let (status, body) = get(addr, "/acemq-health");
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "answered in {took:?}, not at the check's minute"
    );
    assert_eq!(status, 503, "{body}");
    let health = json(&body);
    assert_eq!(health["status"], "down");
    assert_eq!(health["parts"]["payments-api"]["status"], "down");
    assert!(
        health["parts"]["payments-api"]["detail"]
            .as_str()
            .unwrap()
            .contains("did not answer within"),
        "{body}"
    );
    assert_eq!(health["parts"]["broker"]["status"], "up");
    running.close().unwrap();
}

#[test]
fn the_actuator_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Actuator>();
    send_sync::<acemq_amqp::actuator::RunningActuator>();
    send_sync::<ActuatorOptions>();
    send_sync::<acemq_amqp::actuator::Readiness>();
    send_sync::<acemq_amqp::health::Health>();
}

/// A client that sends a whole request and never reads its answer, beside two that send half
/// a request: none of them holds up a probe (each has a thread of its own, and an answer not
/// read is given up once its write time is over).
#[test]
fn clients_that_never_finish_their_request_do_not_stop_the_actuator_answering() {
    let (_conn, running, addr) = actuator();
    let mut slow = half_requests(addr, 2, |_| true);
    let mut deaf = TcpStream::connect(addr).unwrap();
    deaf.write_all(b"GET /acemq-metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    slow.push(deaf);
    let asked = Instant::now();
    let (status, body) = get(addr, "/acemq-health");
    assert_eq!(status, 200, "{body}");
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
    drop(slow);
    running.close().unwrap();
}

/// Go's `Options.Prefix`: the five paths under a prefix (a service that serves its own routes on
/// the same port keeps them apart); the bare paths answer 404 then. `/acemq-info` carries the
/// application's version when given, and an in-process broker's capabilities (no streams).
#[test]
fn a_prefix_puts_the_five_paths_under_it_and_info_shows_the_version_and_the_transport() {
    let broker = acemq_amqp::testing::MemoryBroker::named(&unique("actuator-prefix"));
    let conn = connect_with(ConnectionOptions::new().address(broker.url()));
    let running = Actuator::new(
        &conn,
        ActuatorOptions::new()
            .bind("127.0.0.1:0")
            .prefix("/ops")
            .version("2.3.1")
            .prometheus(prometheus()),
    )
    .unwrap()
    .start()
    .unwrap();
    let addr = running.local_addr();
    assert_eq!(get(addr, "/ops/acemq-health").0, 200);
    assert_eq!(get(addr, "/ops/readyz").0, 200);
    assert_live(addr, "/ops");
    assert_eq!(get(addr, "/ops/acemq-metrics").0, 200);
    let (status, body) = get(addr, "/ops/acemq-info");
    assert_eq!(status, 200);
    let info = json(&body);
    assert_eq!(info["version"], "2.3.1");
    assert_eq!(info["transport"]["streams"], false, "{body}");
    assert_eq!(info["transport"]["publisher-confirms"], true, "{body}");
    for bare in [
        "/acemq-health",
        "/readyz",
        "/livez",
        "/acemq-info",
        "/acemq-metrics",
    ] {
        let (status, body) = get(addr, bare);
        assert_eq!(status, 404, "{bare}: {body}");
        assert!(body.contains("/ops/acemq-health"), "{body}");
    }
    running.close().unwrap();
    for bad in ["ops", "/ops/", "/o?ps", "/o ps"] {
        let e = Actuator::new(&conn, ActuatorOptions::new().prefix(bad)).unwrap_err();
        assert!(e.to_string().contains("prefix"), "{bad}: {e}");
    }
}

/// Issue 50, item 5: a Kubernetes probe that times out restarts a healthy service, so slow
/// clients must not hold it back. A hundred clients each open a connection and send half a
/// request (or nothing) and hold it; the probe is answered at once all the same. (Three seconds
/// for a busy two-core box; on an idle one it takes milliseconds. Before the fix the probe
/// waited behind them until they went away.)
#[test]
fn a_probe_is_answered_while_a_hundred_clients_hold_half_finished_requests() {
    let (_conn, running, addr) = actuator();
    // Half of them send half a request, the others nothing.
    let slow = half_requests(addr, 100, |n| n % 2 == 0);
    let asked = Instant::now();
    let (status, body) =
        get_within(addr, "/acemq-health", Duration::from_secs(3)).unwrap_or_else(|e| {
            panic!(
                "the probe was not answered within 3 s ({:?}) while 100 clients held \
                 half-finished requests: {e}",
                asked.elapsed()
            )
        });
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["status"], "up", "{body}");
    // Closing does not wait for them to send the rest.
    let closing = Instant::now();
    running.close().unwrap();
    assert!(
        closing.elapsed() < Duration::from_secs(3),
        "close took {:?} with the slow clients held",
        closing.elapsed()
    );
    drop(slow);
}

/// Connections are bounded in time: a client that sends half a request and then nothing, and
/// one that sends nothing at all, are answered `408` and closed once the request's time (5 s by
/// default) is up, not held for as long as they like.
#[test]
fn a_client_that_never_finishes_its_request_is_dropped_when_its_time_is_up() {
    let (_conn, running, addr) = actuator();
    let clients = half_requests(addr, 2, |n| n == 0);
    let opened = Instant::now();
    for (what, s) in ["half a request", "nothing"].into_iter().zip(clients) {
        let (read, answer) = read_until_closed(s, Duration::from_secs(30));
        let took = opened.elapsed();
        assert!(
            read.is_ok(),
            "the client that sent {what} was not dropped within 30 s: {read:?}"
        );
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "{what}: {answer:?} after {took:?}"
        );
        assert!(
            took >= Duration::from_secs(4) && took < Duration::from_secs(15),
            "{what}: dropped after {took:?}, not at about 5 s"
        );
    }
    running.close().unwrap();
}

/// Open connections are bounded (256): past that, a new client is answered `503` at once and
/// closed, without a thread of its own; once a held connection goes away, probes are answered
/// again.
#[test]
fn past_256_open_connections_a_new_client_is_answered_503_at_once() {
    let (_conn, running, addr) = actuator();
    let mut held = half_requests(addr, 256, |_| false);
    let extra = TcpStream::connect(addr).unwrap();
    let (read, answer) = read_until_closed(extra, Duration::from_secs(3));
    assert!(read.is_ok(), "not closed within 3 s: {read:?} {answer:?}");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    held.truncate(200);
    assert!(
        eventually(Duration::from_secs(10), || {
            matches!(
                get_within(addr, "/acemq-health", Duration::from_secs(3)),
                Ok((200, _))
            )
        }),
        "no probe answered once 56 of the connections went away"
    );
    drop(held);
    running.close().unwrap();
}

/// Readiness for a host that shuts down (issue 50, item 2): while draining, `/readyz` and
/// `/acemq-health` answer 503 with `"status":"down"` and `"reason":"draining"` (the family's
/// health JSON otherwise, the broker up in it) and `/livez` still answers 200; the flag is
/// flipped from another thread through the cloneable `Readiness`, and ending the drain brings
/// 200 back.
#[test]
fn while_draining_readyz_and_health_answer_503_draining_and_livez_stays_up() {
    let (_conn, running, addr) = actuator();
    for path in ["/readyz", "/acemq-health"] {
        let (status, body) = get(addr, path);
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(json(&body)["status"], "up", "{path}: {body}");
        assert!(json(&body).get("reason").is_none(), "{path}: {body}");
    }
    assert_live(addr, "");

    let readiness = running.readiness();
    assert!(!readiness.is_draining());
    std::thread::spawn(move || readiness.set_draining(true))
        .join()
        .unwrap();
    assert!(running.readiness().is_draining());
    for path in ["/readyz", "/acemq-health"] {
        let (status, body) = get(addr, path);
        assert_eq!(status, 503, "{path}: {body}");
        let health = json(&body);
        assert_eq!(health["status"], "down", "{path}: {body}");
        assert_eq!(health["reason"], "draining", "{path}: {body}");
        assert!(health["checked"].is_string(), "{path}: {body}");
        assert_eq!(health["parts"]["broker"]["status"], "up", "{path}: {body}");
    }
    assert_live(addr, "");

    running.set_draining(false);
    for path in ["/readyz", "/acemq-health"] {
        let (status, body) = get(addr, path);
        assert_eq!(status, 200, "{path}: {body}");
        assert!(json(&body).get("reason").is_none(), "{path}: {body}");
    }
    running.close().unwrap();
}

/// At most four answers are worked out at once: while four probes wait on a hanging check, the
/// next one is answered 503 at once (not queued behind them), and `/livez` is still answered.
#[test]
fn while_four_answers_wait_on_a_check_the_next_probe_is_busy_503_and_livez_answers() {
    // Hangs until the test lets go.
    let (hold, _conn, running, addr) =
        actuator_with_hanging_check("slow-dependency", Duration::from_secs(15));
    let waiting: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || get(addr, "/readyz")))
        .collect();
    // Each probe that is not turned away takes a place until the check answers, so within a
    // few tries every place is taken (a try that times out here holds one too).
    assert!(
        eventually(Duration::from_secs(10), || {
            matches!(
                get_within(addr, "/acemq-health", Duration::from_secs(1)),
                Ok((503, body)) if body.starts_with("busy")
            )
        }),
        "no probe was turned away while four waited"
    );
    let asked = Instant::now();
    assert_eq!(
        get_within(addr, "/livez", Duration::from_secs(3)).unwrap(),
        (200, r#"{"status":"up"}"#.to_string())
    );
    assert!(asked.elapsed() < Duration::from_secs(3));
    drop(hold); // the check answers up
    for probe in waiting {
        // Each waited for the check, unless a try above took its place first.
        let (status, body) = probe.join().unwrap();
        assert!(
            status == 200 || (status == 503 && body.starts_with("busy")),
            "{status} {body}"
        );
    }
    assert_eq!(get(addr, "/readyz").0, 200);
    running.close().unwrap();
}
