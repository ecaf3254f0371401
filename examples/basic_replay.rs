//! Replay: a bug sends three orders to the dead-letter queue; the bug is fixed; a dry run shows
//! what would move, then the replay sends back only the ones the filter picks, stamped and on
//! attempt 1 again, and the fixed handler takes them. The declined one stays where it was.
//! Run: `cargo run --example basic_replay`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use acemq_amqp::patterns::replay::{replay, ReplayOptions};
use acemq_amqp::{dead_letter_queue, Message, Outcome, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let connection = ex::connect()?;
    let queue = ex::name("invoices");
    connection.declare_queue(&QueueSpec::new(&queue))?;
    let fixed = Arc::new(AtomicBool::new(false));
    let billed = Arc::new(AtomicUsize::new(0));
    let (f, b) = (fixed.clone(), billed.clone());
    let consumer = connection.consume(&queue, move |m: &Message| {
        if !f.load(Ordering::SeqCst) {
            return Ok(Outcome::reject("the tax table for 2027 is missing"));
        }
        let replayed = m
            .headers
            .get("acemq-replayed-from")
            .and_then(|v| v.as_str())
            .unwrap_or("-");
        println!(
            "  billed {} (attempt {}, replayed from {replayed})",
            String::from_utf8_lossy(&m.body),
            m.envelope.attempt
        );
        b.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Accept)
    })?;
    let publisher = connection.publisher()?;
    for tenant in ["acme", "globex", "acme"] {
        publisher.publish("", &queue, Message::new(format!("invoice for {tenant}")))?;
    }
    let dlq = dead_letter_queue(&queue);
    ex::wait_for("three dead letters", || {
        connection
            .queue_info(&dlq)
            .is_ok_and(|q| q.message_count == 3)
    });
    println!("three invoices are on {dlq}: the tax table was missing");

    fixed.store(true, Ordering::SeqCst);
    println!("the fix is deployed; first a dry run of what would move:");
    let acme = |_: &acemq_amqp::Envelope, body: &[u8]| body.ends_with(b"acme");
    let preview = replay(
        &connection,
        &dlq,
        ReplayOptions::default().only(acme).dry_run(true),
    )
    .run()?;
    println!("  {preview}");
    let report = replay(&connection, &dlq, ReplayOptions::default().only(acme)).run()?;
    println!("replayed: {report}");
    ex::wait_for("both acme invoices billed", || {
        billed.load(Ordering::SeqCst) == 2
    });
    println!(
        "{dlq} still holds {} message (globex, declined by the filter, in its place)",
        connection.queue_info(&dlq)?.message_count
    );
    consumer.close()?;
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
