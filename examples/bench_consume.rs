//! Raw amiquip consume + ack (prefetch 100, one ack per message) against acemq's consumer with
//! an accept-everything handler at concurrency 1 and 8, in one run, on the same backlog of
//! 200-byte messages (published with acemq's envelope, so both read the same frames).
//! Run: `cargo run --release --example bench_consume [messages]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome, QueueSpec};
#[path = "common/mod.rs"]
mod common;

const BODY: [u8; 200] = [b'x'; 200];

fn raw(queue: &str, n: usize) -> Duration {
    common::raw_consume(queue, n, 100)
}

fn fill(conn: &Connection, queue: &str, n: usize) {
    common::fill_queue(conn, queue, n, |_| BODY.to_vec()).expect("fill the queue");
}

fn ours(conn: &Connection, queue: &str, n: usize, concurrency: usize) -> Duration {
    let count = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = crossbeam_channel::bounded(1);
    let c = count.clone();
    let start = Instant::now();
    let consumer = conn
        .consumer(
            queue,
            ConsumerOptions::new()
                .prefetch(100)
                .concurrency(concurrency)
                .declare(false),
        )
        .unwrap()
        .start(move |_: &Message| {
            if c.fetch_add(1, Ordering::Relaxed) + 1 == n {
                let _ = tx.try_send(Instant::now());
            }
            Ok(Outcome::Accept)
        })
        .unwrap();
    let end = rx.recv().unwrap();
    consumer.close().unwrap();
    end - start
}

#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(bench);
}

fn bench() -> acemq_amqp::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50_000);
    let conn = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
    let queue = format!("bench.consume.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())
        .unwrap();
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let (mut r, mut o1, mut o8) = (0f64, 0f64, 0f64);
    for _ in 0..3 {
        fill(&conn, &queue, n);
        r = r.max(rate(raw(&queue, n)));
        fill(&conn, &queue, n);
        o1 = o1.max(rate(ours(&conn, &queue, n, 1)));
        fill(&conn, &queue, n);
        o8 = o8.max(rate(ours(&conn, &queue, n, 8)));
    }
    println!("{n} messages of 200 bytes, prefetch 100, best of 3 alternating rounds");
    println!("{:<36} {:>12} {:>8}", "case", "msg/s", "vs raw");
    println!(
        "{:<36} {r:>12.0} {:>7.2}x",
        "raw amiquip consume + ack", 1.0
    );
    println!(
        "{:<36} {o1:>12.0} {:>7.2}x",
        "acemq consumer, concurrency 1",
        o1 / r
    );
    println!(
        "{:<36} {o8:>12.0} {:>7.2}x",
        "acemq consumer, concurrency 8",
        o8 / r
    );
    conn.delete_queue(&queue).unwrap();
    conn.close().unwrap();
    Ok(())
}
