//! Metrics for Prometheus: a `MetricsObserver` on the connection, the `metrics-exporter-prometheus`
//! recorder, and a scrape endpoint on a std `TcpListener` (no async runtime).
//!
//! ```text
//! cargo run --example advanced_metrics --features metrics -- 127.0.0.1:9464 30
//! curl -s http://127.0.0.1:9464/metrics | grep acemq_
//! ```
//!
//! It publishes, consumes, relays an outbox record and makes a request/reply round trip so that
//! every family name has a sample, then serves for the given seconds (default 30) and exits.

#[path = "common/fail.rs"]
mod fail;
#[path = "common/prometheus_http.rs"]
mod prometheus_http;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    let handle = prometheus_http::install();
    let listener = std::net::TcpListener::bind(&listen)
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let addr = listener.local_addr()?;
    prometheus_http::serve(listener, handle);
    println!("serving metrics on http://{addr}/metrics for {serve_for:?}");

    // 2. The observer on the connection: everything on it is counted.
    let connection = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(url)
            .observer(MetricsObserver::new()),
    )?;
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

    println!("scrape it now: curl -s http://{addr}/metrics | grep acemq_");
    std::thread::sleep(serve_for);
    publisher.close()?;
    for q in [&queue, &prices] {
        for suffix in ["", ".dlq", ".parked"] {
            connection.delete_queue(&format!("{q}{suffix}"))?;
        }
    }
    connection.close()?;
    Ok(())
}
