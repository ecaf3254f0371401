//! Raw amiquip (with TCP_NODELAY) against acemq's `Publisher`, in one run, on the same broker:
//! 200-byte persistent messages to a durable queue, (1) waiting for each confirm, (2) in windows
//! of 100 confirms. Run: `cargo run --release --example bench_publish [messages]`.

use std::time::{Duration, Instant};

use acemq_amqp::{Connection, Message, PublisherOptions, QueueSpec};
use amiquip::{
    AmqpProperties, Auth, Confirm, ConfirmSmoother, ConnectionOptions, ConnectionTuning, Publish,
};

const BODY: [u8; 200] = [b'x'; 200];

fn raw_connection() -> amiquip::Connection {
    let s = std::net::TcpStream::connect("127.0.0.1:5672").expect("RabbitMQ at 127.0.0.1:5672");
    s.set_nodelay(true).unwrap();
    let s = mio::net::TcpStream::from_stream(s).unwrap();
    amiquip::Connection::insecure_open_stream(
        s,
        ConnectionOptions::<Auth>::default(),
        ConnectionTuning::default(),
    )
    .unwrap()
}

fn raw(queue: &str, n: usize, window: usize) -> Duration {
    let mut conn = raw_connection();
    let ch = conn.open_channel(None).unwrap();
    let confirms = ch.listen_for_publisher_confirms().unwrap();
    ch.enable_publisher_confirms().unwrap();
    let mut smoother = ConfirmSmoother::new();
    let props = AmqpProperties::default()
        .with_delivery_mode(2)
        .with_message_id("raw".to_string());
    let start = Instant::now();
    let mut sent = 0;
    while sent < n {
        let batch = window.min(n - sent);
        for _ in 0..batch {
            ch.basic_publish("", Publish::with_properties(&BODY, queue, props.clone()))
                .unwrap();
        }
        let mut acked = 0;
        while acked < batch {
            for c in smoother.process(confirms.recv().unwrap()) {
                assert!(matches!(c, Confirm::Ack(_)));
                acked += 1;
            }
        }
        sent += batch;
    }
    let took = start.elapsed();
    conn.close().unwrap();
    took
}

fn ours(conn: &Connection, queue: &str, n: usize, window: usize) -> Duration {
    let publisher = conn
        .publisher_with(PublisherOptions::new().window(window.max(1)))
        .unwrap();
    let start = Instant::now();
    let mut sent = 0;
    while sent < n {
        let batch = window.min(n - sent);
        if batch == 1 {
            publisher
                .publish("", queue, Message::new(&BODY[..]))
                .unwrap();
        } else {
            let tickets: Vec<_> = (0..batch)
                .map(|_| {
                    publisher
                        .publish_deferred("", queue, Message::new(&BODY[..]))
                        .unwrap()
                })
                .collect();
            for t in tickets {
                t.wait().unwrap();
            }
        }
        sent += batch;
    }
    let took = start.elapsed();
    publisher.close().unwrap();
    took
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn main() {
    let scale: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let conn =
        Connection::open("amqp://guest:guest@127.0.0.1:5672/").expect("RabbitMQ at 127.0.0.1:5672");
    let queue = format!("bench.publish.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue)).unwrap();
    println!(
        "200-byte persistent messages to a durable classic queue; best of 3 rounds, alternating"
    );
    println!(
        "{:<28} {:>14} {:>14} {:>8}",
        "case", "raw amiquip/s", "acemq/s", "ratio"
    );
    for (name, n, window) in [
        ("confirm per message", 3_000 * scale, 1usize),
        ("windows of 100 confirms", 50_000 * scale, 100),
    ] {
        let (mut best_raw, mut best_ours) = (0f64, 0f64);
        for _ in 0..3 {
            conn.purge_queue(&queue).unwrap();
            best_raw = best_raw.max(rate(n, raw(&queue, n, window)));
            conn.purge_queue(&queue).unwrap();
            best_ours = best_ours.max(rate(n, ours(&conn, &queue, n, window)));
        }
        println!(
            "{name:<28} {best_raw:>14.0} {best_ours:>14.0} {:>7.2}x",
            best_ours / best_raw
        );
    }
    conn.delete_queue(&queue).unwrap();
    conn.close().unwrap();
}
