//! Topology and drift: declare an exchange, a queue and a binding; declaring the same thing
//! again is harmless; declaring the queue with other arguments (drift between two services'
//! ideas of it) is refused with a clear error and the connection stays usable.
//! Run: `cargo run --example basic_topology_and_drift`.

use acemq_amqp::{Binding, ExchangeKind, ExchangeSpec, Message, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let exchange = ex::name("events");
    let queue = ex::name("billing");
    connection.declare_exchange(&ExchangeSpec::new(&exchange, ExchangeKind::Topic))?;
    connection.declare_queue(&QueueSpec::new(&queue))?;
    connection.bind(
        &Binding::new()
            .queue(&queue)
            .exchange(&exchange)
            .routing_key("order.*"),
    )?;
    println!("declared topic exchange {exchange}, quorum queue {queue}, bound on order.*");

    connection.declare_queue(&QueueSpec::new(&queue))?;
    println!("declared {queue} again with the same arguments: fine");

    match connection.declare_queue(&QueueSpec::new(&queue).classic()) {
        Err(e) if e.is_conflict() => println!("drift refused: {e}"),
        other => println!("unexpected: {other:?}"),
    }

    let publisher = connection.publisher()?;
    publisher.publish(&exchange, "order.placed", Message::new("still works"))?;
    let info = connection.queue_info(&queue)?;
    println!(
        "the connection is still usable: a message routed through {exchange}, {queue} holds {}",
        info.message_count
    );
    // The connection remembers what was declared and declares it again after a reconnect.
    ex::delete_queues(&connection, &[&queue])?;
    connection.delete_exchange(&exchange)?;
    connection.close()
}
