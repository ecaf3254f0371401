//! `MetricsObserver` through the `metrics` facade into the Prometheus exporter, scraped over
//! loopback from the endpoint the `advanced_health_and_metrics` example serves. Its own test binary: it
//! installs the process's metrics recorder.

mod support;

#[path = "../examples/common/prometheus_http.rs"]
mod prometheus_http;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_amqp::observe::MetricsObserver;
use acemq_amqp::patterns::outbox::{
    record_message, InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions,
};
use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions,
};
use acemq_amqp::{ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec};
use support::{eventually, Cleanup};

/// The sample lines of `name` (Prometheus spelling) in a scrape.
fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name).is_some_and(|rest| {
                rest.starts_with('{') || rest.starts_with(' ') || rest.starts_with('_')
            })
        })
        .collect()
}

#[test]
fn a_scrape_finds_every_family_name_after_a_publish_a_consume_a_sweep_and_a_request() {
    let handle = prometheus_http::install();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    prometheus_http::serve(listener, handle);

    let connection = support::connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(MetricsObserver::new()),
    );
    let mut cleanup = Cleanup::new(&connection);
    let q = cleanup.consumed_queue(&support::unique("metrics"), &[]);
    let prices = cleanup.queue(&format!("{q}.prices"));
    connection
        .declare_queue(&QueueSpec::new(&q).classic())
        .unwrap();
    connection
        .declare_queue(&QueueSpec::new(&prices).classic())
        .unwrap();

    // A publish (confirmed) and a consume (one accepted, one rejected to the .dlq).
    let publisher = connection.publisher().unwrap();
    publisher.publish("", &q, Message::new("ok")).unwrap();
    publisher.publish("", &q, Message::new("bad")).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let consumer = connection
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(move |m: &Message| {
            s.fetch_add(1, Ordering::SeqCst);
            if m.body == b"bad" {
                Ok(Outcome::reject("not a real order"))
            } else {
                Ok(Outcome::Accept)
            }
        })
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || seen
        .load(Ordering::SeqCst)
        == 2));
    consumer.close().unwrap();

    // A relay sweep.
    let store = InMemoryOutboxStore::new();
    store
        .add(&record_message("", &q, &Message::new("from the outbox")).unwrap())
        .unwrap();
    let relay = OutboxRelay::new(&connection, store, OutboxRelayOptions::new()).unwrap();
    assert_eq!(relay.sweep().unwrap(), 1);
    relay.close().unwrap();

    // A request/reply round trip.
    let responder = Responder::new(&connection, &prices, ResponderOptions::new())
        .and_then(|responder| {
            responder.start(|_: &Message| Ok::<_, acemq_amqp::BoxError>(Message::new("42")))
        })
        .unwrap();
    let requester = Requester::new(&connection, RequesterOptions::new().routing_key(&prices))
        .and_then(Requester::start)
        .unwrap();
    requester.ask(Message::new("price?")).unwrap();
    requester.close().unwrap();
    responder.close().unwrap();
    publisher.close().unwrap();

    let text = prometheus_http::scrape(addr).expect("scrape the endpoint over loopback");
    eprintln!("{text}");
    let has = |name: &str, labels: &[&str]| {
        let found = samples(&text, name);
        assert!(
            found
                .iter()
                .any(|l| labels.iter().all(|want| l.contains(want))),
            "no sample of {name} with {labels:?} in the scrape:\n{text}"
        );
    };
    let queue_label = format!("queue=\"{q}\"");
    let routing_label = format!("routing_key=\"{q}\"");
    has(
        "acemq_publish_total",
        &["exchange=\"\"", &routing_label, "outcome=\"confirmed\""],
    );
    has(
        "acemq_publish_duration",
        &["exchange=\"\"", &routing_label, "outcome=\"confirmed\""],
    );
    has("acemq_consume_total", &[&queue_label, "outcome=\"acked\""]);
    has(
        "acemq_consume_total",
        &[&queue_label, "outcome=\"rejected\""],
    );
    has("acemq_consume_duration", &[&queue_label]);
    has("acemq_consume_attempts", &[&queue_label]);
    has("acemq_consume_in_flight", &[&queue_label]);
    has(
        "acemq_messages_dead_lettered_total",
        &[&queue_label, "outcome=\"dead_lettered\""],
    );
    has(
        "acemq_outbox_total",
        &["exchange=\"\"", &routing_label, "outcome=\"published\""],
    );
    has("acemq_outbox_lag", &["exchange=\"\"", &routing_label]);
    has(
        "acemq_request_duration",
        &["outcome=\"answered\"", "routing_key="],
    );
    has("acemq_request_total", &["outcome=\"answered\""]);
    connection.close().unwrap();
}

/// The example itself, as its users run it: built with its feature, started as a process on a
/// free port, scraped over loopback until every family name has a sample, then stopped.
#[test]
fn the_metrics_example_serves_every_family_name_on_its_endpoint() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(&cargo)
        .args([
            "build",
            "--quiet",
            "--all-features",
            "--example",
            "advanced_health_and_metrics",
            "--message-format",
            "short",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo build for the example");
    assert!(built.success(), "the example builds");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let exe = target.join("debug/examples/advanced_health_and_metrics");
    // Port 0: the example prints the address it bound.
    let mut child = std::process::Command::new(&exe)
        .args(["127.0.0.1:0", "60"])
        .env("ACEMQ_AMQP_URL", support::amqp_url())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", exe.display()));
    // Killed before it cleans up after itself: its queues (named after its process id) are
    // deleted here.
    let connection = support::connect();
    let mut cleanup = Cleanup::new(&connection);
    let queue = format!("metrics.example.{}", child.id());
    cleanup.consumed_queue(&queue, &[]);
    cleanup.consumed_queue(&format!("{queue}.prices"), &[]);
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
    // The rest of what it prints, read so that it never writes to a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let addr: std::net::SocketAddr = first
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the address in {first:?}"));
    let wanted = [
        "acemq_publish_total",
        "acemq_consume_total",
        "acemq_consume_duration",
        "acemq_consume_attempts",
        "acemq_publish_duration",
        "acemq_outbox_total",
        "acemq_outbox_lag",
        "acemq_request_duration",
        "acemq_request_total",
    ];
    let mut text = String::new();
    let complete = eventually(Duration::from_secs(60), || {
        text = prometheus_http::scrape_path(addr, "/acemq-metrics").unwrap_or_default();
        wanted.iter().all(|name| !samples(&text, name).is_empty())
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(complete, "every family name has a sample:\n{text}");
}
