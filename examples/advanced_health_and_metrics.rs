//! Health and metrics as the family serves them: a `MetricsObserver` on the connection, the
//! `metrics-exporter-prometheus` recorder, and the actuator (feature `actuator`) serving
//! `/acemq-health`, `/acemq-info` and `/acemq-metrics` on a small blocking listener (no async
//! runtime), with one application check of its own.
//!
//! ```text
//! cargo run --example advanced_health_and_metrics --features actuator -- 127.0.0.1:9464 30
//! curl -s http://127.0.0.1:9464/acemq-metrics | grep acemq_
//! curl -s http://127.0.0.1:9464/acemq-health
//! ```
//!
//! It publishes, consumes, relays an outbox record and makes a request/reply round trip so that
//! every family name has a sample, prints the health JSON, then serves for the given seconds
//! (default 30) and exits.

#[path = "common/fail.rs"]
mod fail;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::actuator::{install_prometheus_recorder, Actuator, ActuatorOptions};
use acemq_amqp::health::{HealthCheckOptions, HealthReport};
use acemq_amqp::observe::MetricsObserver;
use acemq_amqp::patterns::outbox::{
    record_message, InMemoryOutboxStore, OutboxRelay, OutboxRelayOptions,
};
use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions,
};
use acemq_amqp::{ConnectionOptions, ConsumerOptions, Message, Outcome, QueueSpec};

fn main() {
    fail::run(run);
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:9464".into());
    let serve_for = Duration::from_secs(args.next().and_then(|s| s.parse().ok()).unwrap_or(30));
    let url = std::env::var("ACEMQ_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".into());

    // 1. The recorder, before anything records.
    let prometheus = install_prometheus_recorder()?;

    // 2. The observer on the connection: everything on it is counted.
    let connection = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(url)
            .service("metrics-example")
            .observer(MetricsObserver::new()),
    )?;

    // 3. One of the application's own checks, and the endpoints.
    connection.add_health_check(
        "projections",
        HealthCheckOptions::new().deadline(Duration::from_secs(2)),
        || HealthReport::up().part("up_to_date", 12),
    )?;
    let actuator = Actuator::new(
        &connection,
        ActuatorOptions::new().bind(&listen).prometheus(prometheus),
    )?
    .start()?;
    let addr = actuator.local_addr();
    println!(
        "serving http://{addr}/acemq-metrics, /acemq-health and /acemq-info for {serve_for:?}"
    );
    let queue = format!("metrics.example.{}", std::process::id());
    connection.declare_queue(&QueueSpec::new(&queue).classic())?;

    // A publish and a consume.
    let publisher = connection.publisher()?;
    publisher.publish("", &queue, Message::new("hello"))?;
    let seen = Arc::new(AtomicUsize::new(0));
    let s = seen.clone();
    let consumer =
        connection
            .consumer(&queue, ConsumerOptions::new())?
            .start(move |_: &Message| {
                s.fetch_add(1, Ordering::SeqCst);
                Ok(Outcome::Accept)
            })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    consumer.close()?;

    // An outbox sweep.
    let store = InMemoryOutboxStore::new();
    store.add(&record_message(
        "",
        &queue,
        &Message::new("from the outbox"),
    )?)?;
    let relay = OutboxRelay::new(&connection, store, OutboxRelayOptions::new())?;
    relay.sweep()?;
    relay.close()?;

    // A request/reply round trip.
    let prices = format!("{queue}.prices");
    connection.declare_queue(&QueueSpec::new(&prices).classic())?;
    let responder = Responder::new(&connection, &prices, ResponderOptions::new())?
        .start(|_: &Message| Ok::<_, acemq_amqp::BoxError>(Message::new("42")))?;
    let requester =
        Requester::new(&connection, RequesterOptions::new().routing_key(&prices))?.start()?;
    requester.ask(Message::new("price?"))?;
    requester.close()?;
    responder.close()?;

    let health = connection.health();
    println!("health: {health}");
    println!("{}", health.to_json());
    println!("scrape it now: curl -s http://{addr}/acemq-metrics | grep acemq_");
    std::thread::sleep(serve_for);
    actuator.close()?;
    publisher.close()?;
    for q in [&queue, &prices] {
        for suffix in ["", ".dlq", ".parked"] {
            connection.delete_queue(&format!("{q}{suffix}"))?;
        }
    }
    connection.close()?;
    Ok(())
}
