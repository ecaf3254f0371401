//! Raw amiquip (with TCP_NODELAY) against acemq's `Publisher`, in one run, on the same broker:
//! 200-byte persistent messages to a durable queue, (1) waiting for each confirm, (2) in windows
//! of 100 confirms. Run: `cargo run --release --example bench_publish [messages]`.

use std::time::{Duration, Instant};

use acemq_amqp::{Connection, Message, PublisherOptions, QueueSpec};
use amiquip::AmqpProperties;

#[path = "common/mod.rs"]
mod common;

const BODY: [u8; 200] = [b'x'; 200];

fn raw(queue: &str, n: usize, window: usize, envelope: bool) -> Duration {
    // With `envelope`, the same reserved headers acemq writes (built once, not per message):
    // that isolates the library's cost from the broker's cost of the wire contract.
    let props = if envelope {
        Message::new(&BODY[..]).to_properties_for_bench(queue, "acemq@bench")
    } else {
        AmqpProperties::default()
            .with_delivery_mode(2)
            .with_message_id("raw".to_string())
    };
    common::raw_publish(queue, n, window, &BODY, &props)
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

#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(bench);
}

fn bench() -> acemq_amqp::Result<()> {
    let scale: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let conn = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
    let queue = format!("bench.publish.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())
        .unwrap();
    println!(
        "200-byte persistent messages to a durable classic queue; best of 3 alternating rounds"
    );
    println!(
        "raw = amiquip with TCP_NODELAY; raw+env = the same, carrying acemq's envelope headers"
    );
    println!(
        "{:<26} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "case", "raw/s", "raw+env/s", "acemq/s", "vs raw", "vs raw+env"
    );
    for (name, n, window) in [
        ("confirm per message", 3_000 * scale, 1usize),
        ("windows of 100 confirms", 50_000 * scale, 100),
    ] {
        let (mut bare, mut env, mut best) = (0f64, 0f64, 0f64);
        for _ in 0..3 {
            conn.purge_queue(&queue).unwrap();
            bare = bare.max(rate(n, raw(&queue, n, window, false)));
            conn.purge_queue(&queue).unwrap();
            env = env.max(rate(n, raw(&queue, n, window, true)));
            conn.purge_queue(&queue).unwrap();
            best = best.max(rate(n, ours(&conn, &queue, n, window)));
        }
        println!(
            "{name:<26} {bare:>10.0} {env:>10.0} {best:>10.0} {:>9.2}x {:>11.2}x",
            best / bare,
            best / env
        );
    }
    conn.delete_queue(&queue).unwrap();
    conn.close().unwrap();
    Ok(())
}
