//! A tour of acemq-amqp against the local broker. Run: `cargo run --example tour`.
//!
//! Each section is one pattern; later releases add theirs here.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq_amqp::patterns::{idempotent, record, OutboxRelay, SqlIdempotencyStore, SqlOutboxStore};
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

    // Consumers: a handler returns an outcome; an error is a retry under the retry policy (the
    // family's arithmetic). Three attempts, waiting 200 ms then 400 ms (±20 % jitter): waits
    // under 30 s are spent in the consumer, longer ones on `{queue}.retry.{N}` rungs. The
    // default policy is the family's: no retry, the first failure goes to `{queue}.dlq`.
    let ladder = RetryPolicy::exponential(3, Duration::from_millis(200), Duration::from_secs(1));
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

    // The outbox: the order and its event commit together; the relay publishes the event after
    // the commit; an idempotent consumer applies it once, however often it arrives.
    let dir = tempfile::tempdir().map_err(|e| acemq_amqp::Error::Io {
        context: "making a temporary directory".into(),
        source: e,
    })?;
    let path = dir.path().join("shop.db");
    let open = move || {
        rusqlite::Connection::open(&path).map_err(|e| acemq_amqp::Error::Sql {
            context: "opening shop.db".into(),
            source: e.into(),
        })
    };
    let sql_err = |e: rusqlite::Error| acemq_amqp::Error::Sql {
        context: "the shop's own statements".into(),
        source: e.into(),
    };
    let mut shop = open.clone()()?;
    shop.execute_batch(
        "PRAGMA journal_mode=WAL; CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)",
    )
    .map_err(sql_err)?;
    let outbox = SqlOutboxStore::builder(open.clone()).build()?;
    outbox.create_table()?;
    let receipts = SqlIdempotencyStore::builder(open.clone()).build()?;
    receipts.create_table()?;

    let shipping = format!("tour.shipping.{run}");
    connection.declare_queue(&QueueSpec::new(&shipping))?;
    let event = record(
        &connection,
        "",
        &shipping,
        &serde_json::json!({"order_id": "o-2"}),
    )?;
    let tx = shop.transaction().map_err(sql_err)?;
    tx.execute("INSERT INTO orders (id, total) VALUES ('o-2', 1999)", [])
        .map_err(sql_err)?;
    let mut tx = tx;
    outbox.add(&mut tx, &event)?;
    tx.commit().map_err(sql_err)?;
    println!("order o-2 and its event committed together");

    let relay = OutboxRelay::new(&connection, SqlOutboxStore::builder(open).build()?);
    println!("relay published {} record(s)", relay.sweep()?);

    let shipped = std::sync::Arc::new(AtomicU32::new(0));
    let seen = std::sync::Arc::new(AtomicU32::new(0));
    let (s, n) = (shipped.clone(), seen.clone());
    let once = idempotent(receipts, move |m: &Message| {
        let order: serde_json::Value = m.payload()?;
        println!("  shipping order {}", order["order_id"]);
        s.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Accept)
    });
    let consumer = connection.consume(&shipping, move |m: &Message| {
        n.fetch_add(1, Ordering::SeqCst);
        acemq_amqp::Handler::handle(&once, m)
    })?;
    wait_until(|| seen.load(Ordering::SeqCst) == 1);
    // The same event a second time (as after a relay crash between confirm and delete).
    let mut tx = shop.transaction().map_err(sql_err)?;
    outbox.add(&mut tx, &event)?;
    tx.commit().map_err(sql_err)?;
    relay.sweep()?;
    wait_until(|| seen.load(Ordering::SeqCst) == 2);
    consumer.close()?;
    relay.close()?;
    println!(
        "delivered {} times, shipped {} time(s): the second delivery was ignored",
        seen.load(Ordering::SeqCst),
        shipped.load(Ordering::SeqCst)
    );

    publisher.close()?;
    for q in [&shipping, &flaky, &doomed] {
        for suffix in ["", ".dlq", ".parked"] {
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
