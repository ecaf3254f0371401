//! The idempotent consumer: the same payment arrives three times (a publisher retried after a
//! lost confirm, a redelivery after a crash); the handler runs once and the duplicates are
//! acknowledged and counted. The receipts live in a SQLite file, so they survive a restart.
//! Run: `cargo run --example intermediate_idempotent_consumer`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::patterns::idempotent::{idempotent, IdempotentOptions};
use acemq_amqp::{Error, Message, Outcome, QueueSpec, Result};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::Io {
        context: "making a temporary directory".into(),
        source: e,
    })?;
    let path = dir.path().join("receipts.db");
    let receipts = SqlIdempotencyStore::open(
        move || Ok(rusqlite::Connection::open(&path)?),
        SqlIdempotencyStoreOptions::default(),
    )?;
    receipts.create_table()?;

    let connection = ex::connect()?;
    let queue = ex::name("payments");
    connection.declare_queue(&QueueSpec::new(&queue))?;
    let charged = Arc::new(AtomicUsize::new(0));
    let c = charged.clone();
    let handler = idempotent(
        receipts,
        move |m: &Message| {
            println!(
                "  charging the card for {} (message {})",
                String::from_utf8_lossy(&m.body),
                m.id()
            );
            c.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    let duplicates = handler.duplicates();
    let consumer = connection.consume(&queue, handler)?;

    let publisher = connection.publisher()?;
    let payment = Message::new("payment p-1: 42.00 EUR");
    for _ in 0..3 {
        // The same message id each time: that is what makes it the same payment.
        publisher.publish("", &queue, payment.clone())?;
    }
    ex::wait_for("the three deliveries", || {
        charged.load(Ordering::SeqCst) + duplicates.get() as usize == 3
    });
    consumer.close()?;
    println!(
        "delivered 3 times: charged {} time(s), {} duplicate(s) acknowledged without running the handler",
        charged.load(Ordering::SeqCst),
        duplicates.get()
    );
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
