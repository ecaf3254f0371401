//! The actuator (feature `actuator`) with a real HTTP client (`ureq`) against the real broker:
//! `/acemq-health` (200 with the family's fields; 503 while the broker is gone, 200 again
//! after), `/acemq-info` (no password), `/acemq-metrics` (a counter this crate emitted), and a
//! hanging check holding the answer only to its deadline.

mod support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use acemq_amqp::actuator::{
    install_prometheus_recorder, Actuator, ActuatorOptions, PrometheusHandle,
};
use acemq_amqp::health::{HealthCheckOptions, HealthReport};
use acemq_amqp::observe::MetricsObserver;
use acemq_amqp::testing::FaultProxy;
use acemq_amqp::{Connection, ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec};
use support::{amqp_url, connect_with, eventually, unique};

/// The process's one Prometheus recorder (the `metrics` facade takes one).
fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| install_prometheus_recorder().expect("the first recorder"))
        .clone()
}

/// GET `path`: the status and the body (any status, within 20 s).
fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into();
    let mut response = agent
        .get(&format!("http://{addr}{path}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().expect("a text body");
    (status, body)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
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
fn with_the_broker_gone_health_is_down_503_and_up_again_when_it_is_back() {
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
    let running = Actuator::new(&conn, ActuatorOptions::new().bind("127.0.0.1:0"))
        .unwrap()
        .start()
        .unwrap();
    let addr = running.local_addr();
    assert_eq!(get(addr, "/acemq-health").0, 200);

    proxy.refuse(true);
    proxy.cut();
    assert!(
        eventually(Duration::from_secs(20), || get(addr, "/acemq-health").0
            == 503),
        "{}",
        get(addr, "/acemq-health").1
    );
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
    assert_eq!(health["parts"]["broker"]["parts"]["reconnects"], 1);
    assert!(health["parts"]["broker"]["parts"]["lastReconnect"].is_string());
    running.close().unwrap();
    conn.close().unwrap();
}

#[test]
fn a_hanging_check_holds_the_answer_only_to_its_deadline() {
    let conn = connect_with(ConnectionOptions::new().address(amqp_url()));
    let (_hold, held) = crossbeam_channel::bounded::<()>(0);
    conn.add_health_check(
        "payments-api",
        HealthCheckOptions::new().deadline(Duration::from_millis(500)),
        move || {
            let _ = held.recv_timeout(Duration::from_secs(60)); // hangs for a minute
            HealthReport::up()
        },
    )
    .unwrap();
    let running = Actuator::new(&conn, ActuatorOptions::new().bind("127.0.0.1:0"))
        .unwrap()
        .start()
        .unwrap();
    let asked = Instant::now();
    let (status, body) = get(running.local_addr(), "/acemq-health");
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
    send_sync::<acemq_amqp::health::Health>();
}

#[test]
fn clients_that_never_finish_their_request_do_not_stop_the_actuator_answering() {
    use std::io::Write;
    let conn = connect_with(ConnectionOptions::new().address(amqp_url()));
    let running = Actuator::new(&conn, ActuatorOptions::new().bind("127.0.0.1:0"))
        .unwrap()
        .start()
        .unwrap();
    let addr = running.local_addr();
    // Two clients that send half a request and then nothing (slowloris), and one that sends a
    // whole request and never reads the answer: each holds one of tiny_http's threads. Three,
    // not more: tiny_http's pool starts with four idle threads, and when connections come
    // faster than a woken thread takes its task, it can queue a new one behind a busy thread
    // instead of starting another (its `waiting_tasks` count is dropped only once the woken
    // thread runs) — so more slow clients than that can hold a request back until one of them
    // goes away (seen once in a whole run with twenty; said in the module docs).
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /acemq-health HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        slow.push(s);
    }
    let mut deaf = std::net::TcpStream::connect(addr).unwrap();
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

/// Go's `Options.Prefix`: the three paths under a prefix (a service that serves its own routes on
/// the same port keeps them apart); the bare paths answer 404 then. `/acemq-info` carries the
/// application's version when given, and an in-process broker's capabilities (no streams).
#[test]
fn a_prefix_puts_the_three_paths_under_it_and_info_shows_the_version_and_the_transport() {
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
    assert_eq!(get(addr, "/ops/acemq-metrics").0, 200);
    let (status, body) = get(addr, "/ops/acemq-info");
    assert_eq!(status, 200);
    let info = json(&body);
    assert_eq!(info["version"], "2.3.1");
    assert_eq!(info["transport"]["streams"], false, "{body}");
    assert_eq!(info["transport"]["publisher-confirms"], true, "{body}");
    for bare in ["/acemq-health", "/acemq-info", "/acemq-metrics"] {
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
