//! A tour of acemq-amqp against the local broker. Run: `cargo run --example tour`.
//!
//! Each section is one pattern; later releases add theirs here.

use acemq_amqp::{Connection, ExchangeKind, ExchangeSpec, Message, QueueSpec, Result};

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

    publisher.close()?;
    connection.delete_queue(&queue)?;
    connection.delete_exchange(&exchange)?;
    connection.close()
}
