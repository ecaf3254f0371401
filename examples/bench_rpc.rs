//! Request/reply round trips: acemq's `Requester` + `serve` against a hand-written raw amiquip
//! request/reply (TCP_NODELAY, exclusive server-named reply queue, no-ack reply consumer, the
//! responder acking each request after publishing the reply), in one run, alternating, a few
//! rounds. Small transient requests to a classic queue.
//! Run: `cargo run --release --example bench_rpc [requests-per-caller]`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::patterns::{serve_with, Requester};
use acemq_amqp::{BoxError, Connection, ConsumerOptions, Message, QueueSpec};
use amiquip::{AmqpProperties, ConsumerMessage, ConsumerOptions as RawConsumerOptions, Publish};

#[path = "common/mod.rs"]
mod common;
#[path = "common/fail.rs"]
mod fail;

const ROUNDS: usize = 3;
const BODY: &[u8] = b"{\"sku\":\"sku-42\"}";

/// A raw amiquip responder on its own thread and connection: reply, then ack.
fn raw_responder(queue: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut conn = common::raw_connection();
        let ch = conn.open_channel(None).expect("channel");
        ch.qos(0, 32, false).expect("qos");
        let consumer = ch
            .basic_consume(queue.clone(), RawConsumerOptions::default())
            .expect("consume");
        loop {
            let Ok(m) = consumer.receiver().recv_timeout(Duration::from_millis(100)) else {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                continue;
            };
            let ConsumerMessage::Delivery(d) = m else {
                break;
            };
            let to = d.properties.reply_to().clone().expect("reply_to");
            let mut props = AmqpProperties::default().with_delivery_mode(1);
            if let Some(c) = d.properties.correlation_id() {
                props = props.with_correlation_id(c.clone());
            }
            ch.basic_publish("", Publish::with_properties(b"{\"price\":12.5}", to, props))
                .expect("reply");
            d.ack(&ch).expect("ack");
        }
        consumer.cancel().expect("cancel");
        for m in consumer.receiver().iter() {
            if !matches!(m, ConsumerMessage::Delivery(_)) {
                break;
            }
        }
        drop(consumer);
        conn.close().expect("close");
    })
}

/// One raw caller: `n` sequential round trips; their latencies.
fn raw_caller(queue: &str, n: usize) -> Vec<Duration> {
    let mut conn = common::raw_connection();
    let ch = conn.open_channel(None).expect("channel");
    let reply = ch
        .queue_declare(
            "",
            amiquip::QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
        )
        .expect("reply queue");
    let reply_name = reply.name().to_string();
    let consumer = reply
        .consume(RawConsumerOptions {
            no_ack: true,
            exclusive: true,
            ..Default::default()
        })
        .expect("consume replies");
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let correlation = format!("c{i}");
        let start = Instant::now();
        let props = AmqpProperties::default()
            .with_delivery_mode(1)
            .with_reply_to(reply_name.clone())
            .with_correlation_id(correlation.clone());
        ch.basic_publish("", Publish::with_properties(BODY, queue, props))
            .expect("request");
        loop {
            match consumer.receiver().recv().expect("reply") {
                ConsumerMessage::Delivery(d)
                    if d.properties.correlation_id().as_deref() == Some(correlation.as_str()) =>
                {
                    break
                }
                ConsumerMessage::Delivery(_) => continue,
                other => panic!("reply consumer ended: {other:?}"),
            }
        }
        lat.push(start.elapsed());
    }
    consumer.cancel().expect("cancel");
    for m in consumer.receiver().iter() {
        if !matches!(m, ConsumerMessage::Delivery(_)) {
            break;
        }
    }
    drop(consumer);
    conn.close().expect("close");
    lat
}

/// `callers` threads asking `n` each through one requester; all latencies and the wall time.
fn acemq_callers(requester: &Requester, callers: usize, n: usize) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let lat: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|_| {
                s.spawn(move || {
                    let mut lat = Vec::with_capacity(n);
                    for _ in 0..n {
                        let t = Instant::now();
                        requester
                            .ask(Message::new(BODY).persistent(false))
                            .expect("reply");
                        lat.push(t.elapsed());
                    }
                    lat
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("caller"))
            .collect()
    });
    (lat, start.elapsed())
}

#[derive(Default)]
struct Stats {
    lat: Vec<Duration>,
    requests: usize,
    wall: Duration,
}

impl Stats {
    fn add(&mut self, lat: Vec<Duration>, wall: Duration) {
        self.requests += lat.len();
        self.lat.extend(lat);
        self.wall += wall;
    }
    fn pct(&mut self, p: f64) -> f64 {
        self.lat.sort();
        let i = ((self.lat.len() as f64 - 1.0) * p).round() as usize;
        self.lat[i].as_secs_f64() * 1e3
    }
    fn rate(&self) -> f64 {
        self.requests as f64 / self.wall.as_secs_f64()
    }
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
    let pid = std::process::id();
    let raw_q = format!("bench.rpc.raw.{pid}");
    let our_q = format!("bench.rpc.acemq.{pid}");
    for q in [&raw_q, &our_q] {
        conn.declare_queue(&QueueSpec::new(q).classic())?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let raw_thread = raw_responder(raw_q.clone(), stop.clone());
    // The responder on a connection of its own, as it would be in another service (and as the
    // raw responder is).
    let server = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
    let responder = serve_with(
        &server,
        &our_q,
        ConsumerOptions::new().concurrency(8).declare(false),
        |_: &Message| Ok::<_, BoxError>(&b"{\"price\":12.5}"[..]),
    )?;
    let requester = Requester::open(&conn, "", &our_q)?;
    // Warm up both paths.
    raw_caller(&raw_q, 200);
    acemq_callers(&requester, 1, 200);

    let (mut raw, mut one, mut eight) = (Stats::default(), Stats::default(), Stats::default());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let lat = raw_caller(&raw_q, n);
        raw.add(lat, t.elapsed());
        let (lat, wall) = acemq_callers(&requester, 1, n);
        one.add(lat, wall);
        let (lat, wall) = acemq_callers(&requester, 8, n);
        eight.add(lat, wall);
    }
    println!(
        "request/reply round trips, {ROUNDS} alternating rounds; {n} requests per caller per round"
    );
    println!(
        "{:<28} {:>9} {:>9} {:>11} {:>9}",
        "case", "p50 ms", "p99 ms", "requests/s", "vs raw"
    );
    let raw_rate = raw.rate();
    for (name, s) in [
        ("raw amiquip, 1 caller", &mut raw),
        ("acemq Requester, 1 caller", &mut one),
        ("acemq Requester, 8 callers", &mut eight),
    ] {
        let (p50, p99, r) = (s.pct(0.50), s.pct(0.99), s.rate());
        println!(
            "{name:<28} {p50:>9.3} {p99:>9.3} {r:>11.0} {:>8.2}x",
            r / raw_rate
        );
    }
    println!(
        "8 callers / 1 caller: {:.2}x; timed out {}, unmatched {}",
        eight.rate() / one.rate(),
        requester.timed_out(),
        requester.unmatched()
    );
    requester.close()?;
    responder.close()?;
    server.close()?;
    stop.store(true, Ordering::SeqCst);
    raw_thread.join().expect("raw responder");
    for q in [&raw_q, &our_q] {
        conn.delete_queue(q)?;
    }
    conn.close()
}
