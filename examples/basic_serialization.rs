//! Serialization: a typed payload through the JSON codec (the default), raw bytes through
//! `BytesCodec`, and what the content type on the wire says; a body the codec cannot read is a
//! clear error, and a consumer whose handler decodes with `?` parks it (`{queue}.parked`, for a
//! person to look at) rather than retry it.
//! Run: `cargo run --example basic_serialization`.

use acemq_amqp::{parked_queue, BytesCodec, JsonCodec, Message, Outcome, QueueSpec, Result};
use serde::{Deserialize, Serialize};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: String,
    total_cents: u64,
    lines: Vec<String>,
}

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let queue = ex::name("serialization");
    connection.declare_queue(&QueueSpec::new(&queue).classic())?;
    let publisher = connection.publisher()?;

    let order = OrderPlaced {
        order_id: "o-7".into(),
        total_cents: 2599,
        lines: vec!["book".into(), "pen".into()],
    };
    publisher.publish("", &queue, Message::encode(&JsonCodec, &order)?)?;
    publisher.publish(
        "",
        &queue,
        Message::encode(&BytesCodec, &vec![0xCA_u8, 0xFE, 0x00])?,
    )?;
    publisher.publish(
        "",
        &queue,
        Message::new("{not json").with_content_type("application/json"),
    )?;

    let json = connection.get(&queue)?.expect("the JSON order");
    let back: OrderPlaced = json.decode(&JsonCodec)?;
    println!(
        "JSON ({:?}): {} bytes on the wire, read back as {back:?}",
        json.content_type.as_deref().unwrap_or("-"),
        json.body.len()
    );
    let bytes = connection.get(&queue)?.expect("the bytes");
    let raw: Vec<u8> = bytes.decode(&BytesCodec)?;
    println!(
        "bytes ({:?}): {:02X?}",
        bytes.content_type.as_deref().unwrap_or("-"),
        raw
    );
    let garbage = connection.get(&queue)?.expect("the garbage");
    match garbage.decode::<OrderPlaced>(&JsonCodec) {
        Err(e) => println!("garbage: {e}"),
        Ok(v) => println!("unexpected: {v:?}"),
    }

    // The same body to a consumer whose handler decodes with `?`: no retry could read it, so it
    // is parked, with the reason, for a person to look at.
    publisher.publish(
        "",
        &queue,
        Message::new("{not json").with_content_type("application/json"),
    )?;
    let consumer = connection.consume(&queue, |m: &Message| {
        let order: OrderPlaced = m.decode(&JsonCodec)?;
        println!("unexpected: {order:?}");
        Ok(Outcome::Accept)
    })?;
    let parked = parked_queue(&queue);
    ex::wait_for("the garbage parked", || {
        connection
            .queue_info(&parked)
            .is_ok_and(|q| q.message_count == 1)
    });
    let set_aside = connection.get(&parked)?.expect("the parked garbage");
    println!(
        "a consumer parked it on {parked}, not retried (attempt {}): {}",
        set_aside.envelope.attempt,
        set_aside.envelope.error.as_deref().unwrap_or("-")
    );
    consumer.close()?;
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
