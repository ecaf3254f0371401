//! A standing load something else can watch: a producer thread publishes at a steady rate
//! (confirmed, in windows) and a consumer with four workers handles it, for a while, printing
//! the rates each second — something to point a dashboard, `rabbitmqctl list_queues` or a chaos
//! tool at. Run: `cargo run --release --example advanced_standing_load [seconds] [msg/s]`
//! (default 10 s at 500 msg/s).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::{ConsumerOptions, Message, Outcome, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let rate: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(500)
        .max(1);
    let connection = ex::connect()?;
    let queue = ex::name("load");
    connection.declare_queue(&QueueSpec::new(&queue))?;
    let handled = Arc::new(AtomicU64::new(0));
    let h = handled.clone();
    let consumer = connection
        .consumer(&queue, ConsumerOptions::new().concurrency(4).prefetch(64))?
        .start(move |_: &Message| {
            h.fetch_add(1, Ordering::Relaxed);
            Ok(Outcome::Accept)
        })?;
    let published = Arc::new(AtomicU64::new(0));
    let running = Arc::new(AtomicBool::new(true));
    let producer = {
        let (publisher, queue) = (connection.publisher()?, queue.clone());
        let (published, running) = (published.clone(), running.clone());
        std::thread::spawn(move || -> Result<()> {
            let start = Instant::now();
            let mut sent = 0u64;
            while running.load(Ordering::SeqCst) {
                // Publish what the rate allows by now, in windows of up to 50, then wait for them.
                let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                let tickets: Vec<_> = (sent..due.min(sent + 50))
                    .map(|i| {
                        publisher.publish_deferred("", &queue, Message::new(format!("tick {i}")))
                    })
                    .collect::<Result<_>>()?;
                sent += tickets.len() as u64;
                for t in tickets {
                    t.wait()?;
                }
                published.store(sent, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        })
    };
    println!("a steady {rate} msg/s for {seconds} s on {queue}");
    let (mut last_p, mut last_h) = (0, 0);
    for second in 1..=seconds {
        std::thread::sleep(Duration::from_secs(1));
        let (p, h) = (
            published.load(Ordering::Relaxed),
            handled.load(Ordering::Relaxed),
        );
        println!(
            "  {second:>3} s: published {:>6}/s, handled {:>6}/s, total {h}",
            p - last_p,
            h - last_h
        );
        (last_p, last_h) = (p, h);
    }
    running.store(false, Ordering::SeqCst);
    producer.join().expect("the producer thread")?;
    let total = published.load(Ordering::Relaxed);
    ex::wait_for("the backlog to drain", || {
        handled.load(Ordering::Relaxed) >= total
    });
    consumer.close()?;
    println!(
        "published {total}, handled {}: nothing lost",
        handled.load(Ordering::Relaxed)
    );
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
