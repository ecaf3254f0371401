//! A tour of acemq-amqp against the local broker. Run: `cargo run --example tour`.
//!
//! Each section is one pattern; later releases add theirs here.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq_amqp::{
    dead_letter_queue, Connection, ConsumerOptions, ExchangeKind, ExchangeSpec, Message, Outcome,
    QueueSpec, Result, RetryPolicy,
};

fn main() -> Result<()> {
    let url = std::env::var("ACEMQ_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".into());
    let connection = Connection::open(&url)?;
    println!("connected (generation {:?})", connection.generation());

    // Topology: declared once, re-declared by the connection after every recovery.
    let run = std::process::id();
    let exchange = format!("tour.orders.{run}");
    let queue = format!("tour.orders.placed.{run}");
    connection.declare_exchange(&ExchangeSpec::new(&exchange, ExchangeKind::Topic))?;
    connection.declare_queue(&QueueSpec::new(&queue))?;
    connection.bind_queue(&queue, &exchange, "order.placed")?;

    // A confirmed publish: `publish` returns once the broker has the message.
    let publisher = connection.publisher()?;
    let order = serde_json::json!({"order_id": "o-1", "total_cents": 4200});
    let message = Message::encode(publisher.codec().as_ref(), &order)?.message_type("order.placed");
    let id = message.id().to_string();
    publisher.publish(&exchange, "order.placed", message)?;
    println!("published order.placed {id}: confirmed by the broker");

    // The envelope travels with it.
    if let Some(got) = connection.get(&queue)? {
        println!(
            "read back {} (type {:?}, attempt {}, correlation {:?})",
            got.id(),
            got.envelope.message_type,
            got.envelope.attempt,
            got.envelope.correlation_id
        );
    }

    // Mandatory publishing: a message no queue is bound for is refused, not silently dropped.
    match publisher.publish(&exchange, "order.cancelled", Message::new("nobody listens")) {
        Err(e) if e.is_unroutable() => println!("refused as expected: {e}"),
        other => println!("unexpected: {other:?}"),
    }

    // Consumers: a handler returns an outcome; an error is a retry on the ladder. A short ladder
    // here (200 ms, 400 ms; three attempts) so the tour is quick; the default is 1 s, 10 s, 1 min,
    // 10 min over five attempts.
    let ladder = RetryPolicy::ladder([Duration::from_millis(200), Duration::from_millis(400)]);
    let flaky = format!("tour.flaky.{run}");
    connection.declare_queue(&QueueSpec::new(&flaky))?;
    let done = std::sync::Arc::new(AtomicU32::new(0));
    let d = done.clone();
    let consumer = connection
        .consumer(&flaky, ConsumerOptions::new().retry(ladder.clone()))?
        .start(move |m: &Message| {
            if m.envelope.attempt < 3 {
                println!("  flaky handler: attempt {} fails", m.envelope.attempt);
                return Err("the payment service timed out".into());
            }
            println!("  flaky handler: attempt {} succeeds", m.envelope.attempt);
            d.store(m.envelope.attempt, Ordering::SeqCst);
            Ok(Outcome::Accept)
        })?;
    publisher.publish("", &flaky, Message::new("charge o-1"))?;
    wait_until(|| done.load(Ordering::SeqCst) == 3);
    consumer.close()?;

    let doomed = format!("tour.doomed.{run}");
    connection.declare_queue(&QueueSpec::new(&doomed))?;
    let consumer = connection
        .consumer(&doomed, ConsumerOptions::new().retry(ladder))?
        .start(|m: &Message| {
            println!("  doomed handler: attempt {} fails", m.envelope.attempt);
            Err("the customer does not exist".into())
        })?;
    publisher.publish("", &doomed, Message::new("charge o-2"))?;
    let mut dead = None;
    wait_until(|| {
        dead = connection.get(&dead_letter_queue(&doomed)).ok().flatten();
        dead.is_some()
    });
    consumer.close()?;
    if let Some(dead) = dead {
        println!(
            "dead-lettered to {} after attempt {}: {}",
            dead_letter_queue(&doomed),
            dead.envelope.attempt,
            dead.envelope.error.unwrap_or_default()
        );
    }

    publisher.close()?;
    for q in [&flaky, &doomed] {
        for suffix in ["", ".retry.200ms", ".retry.400ms", ".dlq", ".parked"] {
            connection.delete_queue(&format!("{q}{suffix}"))?;
        }
    }
    connection.delete_queue(&queue)?;
    connection.delete_exchange(&exchange)?;
    connection.close()
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}
