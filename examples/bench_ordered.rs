//! Ordered dispatch against unordered, in one run: 2,000 messages over 20 keys (header `k`),
//! handlers taking 1 ms, prefetch 200 — ordered at concurrency 8, unordered at concurrency 8
//! and at 1, and raw amiquip running the same 1 ms handler on its consuming thread (acking each).
//! Best of 3 alternating rounds.
//! Run: `cargo run --release --example bench_ordered [messages]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::patterns::{by_header, ordered};
use acemq_amqp::{Connection, ConsumerOptions, Handler, Message, Outcome, QueueSpec};
use amiquip::ConsumerMessage;

#[path = "common/mod.rs"]
mod common;
#[path = "common/fail.rs"]
mod fail;

const PREFETCH: u16 = 200;
const WORK: Duration = Duration::from_millis(1);

fn fill(conn: &Connection, queue: &str, n: usize) -> acemq_amqp::Result<()> {
    let p = conn.publisher_with(acemq_amqp::PublisherOptions::new().window(2000))?;
    let mut tickets = Vec::with_capacity(1000);
    for i in 0..n {
        let m = Message::new(vec![b'x'; 200])
            .persistent(false)
            .header("k", format!("key-{}", i % 20));
        tickets.push(p.publish_deferred("", queue, m)?);
        if tickets.len() == 1000 {
            for t in tickets.drain(..) {
                t.wait()?;
            }
        }
    }
    for t in tickets {
        t.wait()?;
    }
    p.close()
}

fn raw(queue: &str, n: usize) -> Duration {
    let mut conn = common::raw_connection();
    let ch = conn.open_channel(None).expect("channel");
    ch.qos(0, PREFETCH, false).expect("qos");
    let start = Instant::now();
    let consumer = ch
        .basic_consume(queue, Default::default())
        .expect("consume");
    let mut got = 0;
    for m in consumer.receiver().iter() {
        if let ConsumerMessage::Delivery(d) = m {
            std::thread::sleep(WORK);
            d.ack(&ch).expect("ack");
            got += 1;
            if got == n {
                break;
            }
        }
    }
    let took = start.elapsed();
    consumer.cancel().expect("cancel");
    for m in consumer.receiver().iter() {
        if !matches!(m, ConsumerMessage::Delivery(_)) {
            break;
        }
    }
    drop(consumer);
    conn.close().expect("close");
    took
}

fn ours<H>(
    conn: &Connection,
    queue: &str,
    n: usize,
    concurrency: usize,
    make: impl FnOnce(Box<dyn Fn(&Message) -> acemq_amqp::HandlerResult + Send + Sync>) -> H,
) -> Duration
where
    H: Handler + Send + Sync + 'static,
{
    let count = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = crossbeam_channel::bounded(1);
    let c = count.clone();
    let work: Box<dyn Fn(&Message) -> acemq_amqp::HandlerResult + Send + Sync> =
        Box::new(move |_: &Message| {
            std::thread::sleep(WORK);
            if c.fetch_add(1, Ordering::Relaxed) + 1 == n {
                let _ = tx.try_send(Instant::now());
            }
            Ok(Outcome::Accept)
        });
    let start = Instant::now();
    let consumer = conn
        .consumer(
            queue,
            ConsumerOptions::new()
                .prefetch(PREFETCH)
                .concurrency(concurrency)
                .declare(false),
        )
        .unwrap()
        .start(make(work))
        .unwrap();
    let end = rx.recv().unwrap();
    consumer.close().unwrap();
    end - start
}

fn main() {
    fail::run(bench);
}

fn bench() -> acemq_amqp::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000);
    let conn = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
    let queue = format!("bench.ordered.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&queue).classic())?;
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let (mut r, mut u1, mut u8_, mut o8) = (0f64, 0f64, 0f64, 0f64);
    for _ in 0..3 {
        fill(&conn, &queue, n)?;
        r = r.max(rate(raw(&queue, n)));
        fill(&conn, &queue, n)?;
        u1 = u1.max(rate(ours(&conn, &queue, n, 1, |w| w)));
        fill(&conn, &queue, n)?;
        u8_ = u8_.max(rate(ours(&conn, &queue, n, 8, |w| w)));
        fill(&conn, &queue, n)?;
        o8 = o8.max(rate(ours(&conn, &queue, n, 8, |w| {
            ordered(by_header("k"), w)
        })));
    }
    println!(
        "{n} messages over 20 keys, 1 ms handlers, prefetch {PREFETCH}, best of 3 alternating rounds"
    );
    println!("{:<44} {:>10} {:>14}", "case", "msg/s", "vs unordered 8");
    for (case, v) in [
        ("raw amiquip, handler on its thread", r),
        ("acemq unordered, concurrency 1", u1),
        ("acemq unordered, concurrency 8", u8_),
        ("acemq ordered (20 keys), concurrency 8", o8),
    ] {
        println!("{case:<44} {v:>10.0} {:>13.2}x", v / u8_);
    }
    conn.delete_queue(&queue)?;
    conn.close()
}
