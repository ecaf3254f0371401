//! Interceptors: a publish interceptor stamps every outgoing message with the tenant it was sent
//! for and refuses messages without a type; a consume interceptor times each handler and hears
//! what the consumer finally did with the delivery. The first registered is the outermost.
//! Run: `cargo run --example intermediate_interceptors`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use acemq_amqp::intercept::{ConsumeContext, ConsumeNext, PublishContext, PublishNext};
use acemq_amqp::{ConnectionOptions, Error, Message, Outcome, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let settled = Arc::new(Mutex::new(Vec::new()));
    let s = settled.clone();
    let connection = acemq_amqp::Connection::open_with(
        ConnectionOptions::new()
            .address(ex::url())
            .intercept_publish(|mut context: PublishContext, next: PublishNext<'_>| {
                if context.message.envelope.message_type.is_none() {
                    return Err(Error::InvalidArgument {
                        reason: "every message must say its type".into(),
                    });
                }
                context.message = context.message.with_header("tenant", "acme");
                next.run(context)
            })
            .intercept_consume(
                move |context: &mut ConsumeContext<'_>,
                      message: &Message,
                      next: ConsumeNext<'_>| {
                    let started = Instant::now();
                    let id = message.id().to_string();
                    let s = s.clone();
                    context.when_settled(move |done| {
                        s.lock()
                            .expect("settled")
                            .push(format!("{id}: {}", done.outcome));
                    });
                    let answer = next.run(context, message);
                    println!("  handled in {:?}", started.elapsed());
                    answer
                },
            ),
    )?;
    let queue = ex::name("interceptors");
    connection.declare_queue(&QueueSpec::new(&queue).classic())?;
    let consumer = connection.consume(&queue, |m: &Message| {
        let tenant = m
            .headers
            .get("tenant")
            .and_then(|v| v.as_str())
            .unwrap_or("-");
        println!(
            "  handler: {} for tenant {tenant}",
            String::from_utf8_lossy(&m.body)
        );
        Ok(Outcome::Accept)
    })?;
    let publisher = connection.publisher()?;
    publisher.publish(
        "",
        &queue,
        Message::new("invoice inv-1").with_type("invoice"),
    )?;
    match publisher.publish("", &queue, Message::new("no type")) {
        Err(e) => println!("refused by the publish interceptor: {e}"),
        Ok(()) => println!("unexpected: published"),
    }
    ex::wait_for("the settlement", || {
        !settled.lock().expect("settled").is_empty()
    });
    consumer.close()?;
    println!(
        "the consume interceptor heard: {:?}",
        settled.lock().expect("settled")
    );
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
