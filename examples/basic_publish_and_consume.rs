//! Publish three orders and consume them: a confirmed publish, the envelope that travels with
//! each message, a handler that accepts, and a clean close.
//! Run: `cargo run --example basic_publish_and_consume`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use acemq_amqp::{JsonCodec, Message, Outcome, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let queue = ex::name("orders");
    connection.declare_queue(&QueueSpec::new(&queue))?;
    println!("declared {queue} (durable, so a quorum queue)");

    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let consumer = connection.consume(&queue, move |m: &Message| {
        let order: serde_json::Value = m.payload()?;
        println!(
            "  handler: order {} for {} cents (message {}, type {:?}, attempt {})",
            order["order_id"],
            order["total_cents"],
            m.id(),
            m.envelope.message_type.as_deref().unwrap_or("-"),
            m.envelope.attempt
        );
        h.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Accept)
    })?;

    let publisher = connection.publisher()?;
    for (id, cents) in [("o-1", 4200), ("o-2", 999), ("o-3", 15000)] {
        let order = serde_json::json!({"order_id": id, "total_cents": cents});
        let message = Message::encode(&JsonCodec, &order)?.with_type("order.placed");
        publisher.publish("", &queue, message)?;
        println!("published {id}: the broker confirmed it before publish returned");
    }
    ex::wait_for("three orders handled", || {
        handled.load(Ordering::SeqCst) == 3
    });
    let report = consumer.close()?;
    println!(
        "consumer closed: {} handled, {} requeued, {} abandoned",
        handled.load(Ordering::SeqCst),
        report.requeued,
        report.abandoned
    );
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
