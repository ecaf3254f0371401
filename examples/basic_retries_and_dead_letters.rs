//! Retries and dead letters: a handler that fails twice then succeeds is retried on the
//! family's policy (exponential, ±20 % jitter); one that always fails ends on `{queue}.dlq` with
//! the reason; one that can never succeed (`FatalError`) goes there at once, without retries.
//! Run: `cargo run --example basic_retries_and_dead_letters`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_amqp::{
    dead_letter_queue, ConsumerOptions, FatalError, Message, Outcome, QueueSpec, Result,
    RetryPolicy,
};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let queue = ex::name("payments");
    connection.declare_queue(&QueueSpec::new(&queue))?;
    // Three attempts: wait ~100 ms, then ~200 ms. Waits under 30 s are held in the consumer
    // (the delivery stays unacknowledged); longer ones go through `{queue}.retry.{N}` queues.
    let policy = RetryPolicy::exponential()
        .max_attempts(3)
        .initial_delay(Duration::from_millis(100))
        .max_delay(Duration::from_secs(1));
    let recovered = Arc::new(AtomicBool::new(false));
    let r = recovered.clone();
    let consumer = connection
        .consumer(&queue, ConsumerOptions::new().retry(policy))?
        .start(move |m: &Message| {
            let body = String::from_utf8_lossy(&m.body).to_string();
            let attempt = m.envelope.attempt;
            match body.as_str() {
                "flaky" if attempt < 3 => {
                    println!("  {body}: attempt {attempt} fails (the bank timed out)");
                    Err("the bank timed out".into())
                }
                "broken" => {
                    println!("  {body}: attempt {attempt} fails (the card is unknown)");
                    Err("the card is unknown".into())
                }
                "poison" => {
                    println!("  {body}: attempt {attempt} cannot ever succeed");
                    Err(FatalError::new("the amount is negative").into())
                }
                _ => {
                    println!("  {body}: attempt {attempt} succeeds");
                    r.store(true, Ordering::SeqCst);
                    Ok(Outcome::Accept)
                }
            }
        })?;
    let publisher = connection.publisher()?;
    for body in ["flaky", "broken", "poison"] {
        publisher.publish("", &queue, Message::new(body))?;
    }
    let dlq = dead_letter_queue(&queue);
    ex::wait_for("the flaky payment to succeed and two dead letters", || {
        recovered.load(Ordering::SeqCst)
            && connection
                .queue_info(&dlq)
                .is_ok_and(|q| q.message_count == 2)
    });
    consumer.close()?;
    while let Some(dead) = connection.get(&dlq)? {
        println!(
            "on {dlq}: {:?} after attempt {}, because: {}",
            String::from_utf8_lossy(&dead.body),
            dead.envelope.attempt,
            dead.envelope.error.unwrap_or_default()
        );
    }
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
