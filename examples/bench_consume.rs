//! Raw amiquip consume + ack (prefetch 100, one ack per message) against acemq's consumer with
//! an accept-everything handler at concurrency 1 and 8, in one run, on the same backlog of
//! 200-byte messages (published with acemq's envelope, so both read the same frames).
//! Run: `cargo run --release --example bench_consume [messages]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome, PublisherOptions, QueueSpec};
use amiquip::{Auth, ConnectionOptions, ConnectionTuning, ConsumerMessage};

const BODY: [u8; 200] = [b'x'; 200];

fn fill(conn: &Connection, queue: &str, n: usize) {
    let p = conn
        .publisher_with(PublisherOptions::new().window(2000))
        .unwrap();
    let mut tickets = Vec::new();
    for _ in 0..n {
        tickets.push(
            p.publish_deferred("", queue, Message::new(&BODY[..]).persistent(false))
                .unwrap(),
        );
        if tickets.len() == 1000 {
            tickets.drain(..).for_each(|t| t.wait().unwrap());
        }
    }
    tickets.into_iter().for_each(|t| t.wait().unwrap());
    p.close().unwrap();
}

fn raw(queue: &str, n: usize) -> Duration {
    let s = std::net::TcpStream::connect("127.0.0.1:5672").unwrap();
    s.set_nodelay(true).unwrap();
    let s = mio::net::TcpStream::from_stream(s).unwrap();
    let mut conn = amiquip::Connection::insecure_open_stream(
        s,
        ConnectionOptions::<Auth>::default(),
        ConnectionTuning::default(),
    )
    .unwrap();
    let ch = conn.open_channel(None).unwrap();
    ch.qos(0, 100, false).unwrap();
    let start = Instant::now();
    let consumer = ch.basic_consume(queue, Default::default()).unwrap();
    let mut got = 0;
    for m in consumer.receiver().iter() {
        if let ConsumerMessage::Delivery(d) = m {
            d.ack(&ch).unwrap();
            got += 1;
            if got == n {
                break;
            }
        }
    }
    let took = start.elapsed();
    // amiquip drops the whole connection if a consumer's receiver is gone before it delivers
    // `ClientCancelled`: cancel, then read up to it, then drop.
    consumer.cancel().unwrap();
    for m in consumer.receiver().iter() {
        if !matches!(m, ConsumerMessage::Delivery(_)) {
            break;
        }
    }
    drop(consumer);
    conn.close().unwrap();
    took
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

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50_000);
    let conn =
        Connection::open("amqp://guest:guest@127.0.0.1:5672/").expect("RabbitMQ at 127.0.0.1:5672");
    let queue = format!("bench.consume.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue)).unwrap();
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
}
