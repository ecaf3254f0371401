//! A tour of acemq-amqp against the local broker. Run: `cargo run --example tour`.
//!
//! Each section is one pattern; later releases add theirs here.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::patterns::idempotent::{idempotent_tx, IdempotentOptions};
use acemq_amqp::patterns::outbox::{
    record, OutboxRelay, OutboxRelayOptions, SqlOutboxStore, SqlOutboxStoreOptions,
};
use acemq_amqp::patterns::request_reply::{
    Requester, RequesterOptions, Responder, ResponderOptions,
};
use acemq_amqp::{
    dead_letter_queue, Binding, Connection, ConsumerOptions, ExchangeKind, ExchangeSpec, JsonCodec,
    Message, Outcome, QueueSpec, Result, RetryPolicy,
};

#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(tour);
}

fn tour() -> Result<()> {
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
    connection.bind(
        &Binding::new()
            .queue(&queue)
            .exchange(&exchange)
            .routing_key("order.placed"),
    )?;

    // A confirmed publish: `publish` returns once the broker has the message.
    let publisher = connection.publisher()?;
    let order = serde_json::json!({"order_id": "o-1", "total_cents": 4200});
    let message = Message::encode(publisher.codec().as_ref(), &order)?.with_type("order.placed");
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
    let ladder = RetryPolicy::exponential()
        .max_attempts(3)
        .initial_delay(Duration::from_millis(200))
        .max_delay(Duration::from_secs(1));
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
    // the commit; a transactional idempotent consumer handles it once, however often it
    // arrives, and records the next event on the same transaction.
    let dir = tempfile::tempdir().map_err(|e| acemq_amqp::Error::Io {
        context: "making a temporary directory".into(),
        source: e,
    })?;
    let path = dir.path().join("shop.db");
    let open = move || Ok(rusqlite::Connection::open(&path)?);
    let mut shop: rusqlite::Connection = open()?;
    shop.execute_batch(
        "PRAGMA journal_mode=WAL; \
         CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER, shipped INTEGER DEFAULT 0)",
    )?;
    let outbox = std::sync::Arc::new(SqlOutboxStore::open(
        open.clone(),
        SqlOutboxStoreOptions::default(),
    )?);
    outbox.create_table()?;
    let receipts = std::sync::Arc::new(SqlIdempotencyStore::open(
        open.clone(),
        SqlIdempotencyStoreOptions::default(),
    )?);
    receipts.create_table()?;

    let shipping = format!("tour.shipping.{run}");
    let shipped_events = format!("tour.shipped.{run}");
    connection.declare_queue(&QueueSpec::new(&shipping))?;
    connection.declare_queue(&QueueSpec::new(&shipped_events))?;
    let event = record(
        &connection,
        "",
        &shipping,
        &serde_json::json!({"order_id": "o-2"}),
    )?;
    let mut tx = shop.transaction()?;
    tx.execute("INSERT INTO orders (id, total) VALUES ('o-2', 1999)", [])?;
    outbox.add(&mut tx, &event)?;
    tx.commit()?;
    println!("order o-2 and its event committed together");

    // Not started: this tour sweeps by hand, between its steps.
    let relay = OutboxRelay::new(
        &connection,
        SqlOutboxStore::open(open.clone(), SqlOutboxStoreOptions::default())?,
        OutboxRelayOptions::new(),
    )?;
    println!("relay published {} record(s)", relay.sweep()?);

    let seen = std::sync::Arc::new(AtomicU32::new(0));
    let n = seen.clone();
    let (next_outbox, next_queue) = (outbox.clone(), shipped_events.clone());
    // The handler gets the driver's own transaction: the shop's SQL is written with rusqlite's
    // API, and the same transaction carries the next event and the receipt.
    let ship = idempotent_tx(
        receipts,
        open,
        move |m: &Message, tx: &mut rusqlite::Transaction<'_>| {
            let order: serde_json::Value = m.payload()?;
            let id = order["order_id"].as_str().unwrap_or_default();
            println!("  shipping order {id}");
            tx.execute(
                "UPDATE orders SET shipped = shipped + 1 WHERE id = ?1",
                [id],
            )?;
            let shipped = serde_json::json!({"order_id": id});
            next_outbox.add(tx, &record(&JsonCodec, "", &next_queue, &shipped)?)?;
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    let consumer = connection.consume(&shipping, move |m: &Message| {
        let outcome = acemq_amqp::Handler::handle(&ship, m);
        n.fetch_add(1, Ordering::SeqCst);
        outcome
    })?;
    wait_until(|| seen.load(Ordering::SeqCst) == 1);
    // The same event a second time (as after a relay crash between confirm and delete).
    let mut tx = shop.transaction()?;
    outbox.add(&mut tx, &event)?;
    tx.commit()?;
    println!(
        "relay published {} record(s): the event again, and the order.shipped event",
        relay.sweep()?
    );
    wait_until(|| seen.load(Ordering::SeqCst) == 2);
    consumer.close()?;
    let shipped: i64 = shop.query_row("SELECT shipped FROM orders WHERE id = 'o-2'", [], |r| {
        r.get(0)
    })?;
    println!(
        "delivered {} times, shipped {shipped} time(s): the second delivery was ignored",
        seen.load(Ordering::SeqCst),
    );
    println!(
        "relay published {} record(s): the ignored delivery recorded nothing",
        relay.sweep()?
    );
    relay.close()?;

    // Request/reply: a responder answers price requests on threads of its own; the caller's
    // thread blocks in `ask` until its reply (paired by x-acemq-correlation) comes back.
    let prices = format!("tour.prices.{run}");
    connection.declare_queue(&QueueSpec::new(&prices).classic())?;
    let responder = Responder::new(&connection, &prices, ResponderOptions::new())?.start(
        |request: &Message| {
            let sku: serde_json::Value = request.payload()?;
            let price = serde_json::json!({"sku": sku["sku"], "price_cents": 1250});
            Message::encode(&JsonCodec, &price).map_err(acemq_amqp::BoxError::from)
        },
    )?;
    let requester =
        Requester::new(&connection, RequesterOptions::new().routing_key(&prices))?.start()?;
    let question = Message::encode(&JsonCodec, &serde_json::json!({"sku": "sku-42"}))?;
    let answer: serde_json::Value = requester.ask(question)?.payload()?;
    println!(
        "price request answered: {answer} (responder answered {})",
        responder.answered()
    );
    requester.close()?;
    responder.close()?;

    replay_slip_and_saga(&connection, &publisher, run)?;
    later_logs_and_large_documents(&connection, run)?;
    order_pipeline(&connection, run)?;
    operator_tools(&connection, run)?;

    publisher.close()?;
    connection.delete_queue(&shipped_events)?;
    for q in [&shipping, &flaky, &doomed, &prices] {
        for suffix in ["", ".dlq", ".parked"] {
            connection.delete_queue(&format!("{q}{suffix}"))?;
        }
    }
    connection.delete_queue(&queue)?;
    connection.delete_exchange(&exchange)?;
    connection.close()
}

/// Dead-letter replay, a two-step routing slip and a saga with a compensation.
fn replay_slip_and_saga(
    connection: &Connection,
    publisher: &acemq_amqp::Publisher,
    run: u32,
) -> Result<()> {
    use acemq_amqp::patterns::replay::{replay, ReplayOptions};
    use acemq_amqp::patterns::routing_slip::{follow_slip, FollowSlipOptions, RoutingSlip};
    use acemq_amqp::patterns::saga::Saga;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    // A failed order: the handler has a bug, so the order ends up in the dead-letter queue.
    let billing = format!("tour.billing.{run}");
    connection.declare_queue(&QueueSpec::new(&billing).classic())?;
    let fixed = Arc::new(AtomicBool::new(false));
    let billed = Arc::new(AtomicU32::new(0));
    let (f, b) = (fixed.clone(), billed.clone());
    let consumer = connection.consume(&billing, move |m: &Message| {
        if !f.load(Ordering::SeqCst) {
            return Ok(Outcome::reject("the tax table is missing"));
        }
        b.fetch_add(1, Ordering::SeqCst);
        println!(
            "billed {} (replayed from {:?})",
            m.id(),
            m.headers
                .get("acemq-replayed-from")
                .and_then(|v| v.as_str())
        );
        Ok(Outcome::Accept)
    })?;
    publisher.publish("", &billing, Message::new(r#"{"order_id":"o-3"}"#))?;
    let dlq = dead_letter_queue(&billing);
    wait_until(|| {
        connection
            .queue_info(&dlq)
            .is_ok_and(|i| i.message_count == 1)
    });
    // The "fix" is deployed; the dead letter goes back where it came from, attempt 1 again.
    fixed.store(true, Ordering::SeqCst);
    let report = replay(connection, &dlq, ReplayOptions::default()).run()?;
    println!("replayed {}: {report}", dlq);
    wait_until(|| billed.load(Ordering::SeqCst) == 1);
    consumer.close()?;

    // A two-step routing slip: pack, then ship; the itinerary travels with the message.
    let (pack, ship) = (format!("tour.pack.{run}"), format!("tour.ship.{run}"));
    connection.declare_queue(&QueueSpec::new(&pack).classic())?;
    connection.declare_queue(&QueueSpec::new(&ship).classic())?;
    let shipped = Arc::new(AtomicU32::new(0));
    let packer = connection.consume(
        &pack,
        follow_slip(
            publisher,
            |m: &Message| {
                let mut body = m.body.clone();
                body.extend_from_slice(b" [packed]");
                Ok(Some(Message::new(body)))
            },
            FollowSlipOptions::new(),
        ),
    )?;
    let s = shipped.clone();
    let shipper = connection.consume(
        &ship,
        follow_slip(
            publisher,
            move |m: &Message| {
                println!("shipping: {}", String::from_utf8_lossy(&m.body));
                s.fetch_add(1, Ordering::SeqCst);
                Ok(None)
            },
            FollowSlipOptions::new(),
        ),
    )?;
    let slip = RoutingSlip::new()
        .then("", &pack, "pack")
        .then("", &ship, "ship");
    slip.send(publisher, Message::new("order o-4"))?;
    wait_until(|| shipped.load(Ordering::SeqCst) == 1);
    packer.close()?;
    shipper.close()?;

    // A saga: reserve stock, then charge the card; the charge fails, so the reservation is
    // compensated. No broker involved: the report says what happened.
    let saga = Saga::new("place-order")
        .step(
            "reserve-stock",
            |order: &&str| -> std::result::Result<(), String> {
                println!("reserved stock for {order}");
                Ok(())
            },
            |order: &&str| -> std::result::Result<(), String> {
                println!("released the stock reserved for {order}");
                Ok(())
            },
        )
        .step(
            "charge-card",
            |order: &&str| -> std::result::Result<(), String> {
                Err(format!("card declined for {order}"))
            },
            |_: &&str| -> std::result::Result<(), String> { Ok(()) },
        );
    println!("{}", saga.run(&"o-5"));

    for q in [&billing, &pack, &ship] {
        for suffix in ["", ".dlq", ".parked"] {
            connection.delete_queue(&format!("{q}{suffix}"))?;
        }
    }
    Ok(())
}

/// An order pipeline: `validate` publishes onwards with `then` (correlation carried, the
/// validated order's id as causation; a digital order goes no further, an invalid one is
/// rejected), `ship` runs a chain (logging, a deadline, ordering per order).
fn order_pipeline(connection: &Connection, run: u32) -> Result<()> {
    use acemq_amqp::patterns::chain::{chain, with_logging, with_ordering, with_timeout};
    use acemq_amqp::patterns::ordering::by_correlation;
    use acemq_amqp::patterns::pipeline::{then, Next, NOTHING};
    let validate_q = format!("tour.pipeline.validate.{run}");
    let ship_q = format!("tour.pipeline.ship.{run}");
    for q in [&validate_q, &ship_q] {
        connection.declare_queue(&QueueSpec::new(q))?;
    }
    let validated = std::sync::Arc::new(AtomicU32::new(0));
    let v = validated.clone();
    let validate = then(
        connection.publisher()?,
        "",
        ship_q.clone(),
        move |m: &Message| {
            v.fetch_add(1, Ordering::SeqCst);
            let order: serde_json::Value = m.payload()?;
            if order["total_cents"].as_i64().unwrap_or(0) <= 0 {
                return Err(acemq_amqp::FatalError::new("an order must cost something").into());
            }
            if order["digital"] == serde_json::json!(true) {
                return Ok(NOTHING); // nothing to ship
            }
            Ok(Next::Publish(
                serde_json::json!({"order_id": order["order_id"]}),
            ))
        },
    );
    let shipped = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = shipped.clone();
    let ship = chain(
        move |m: &Message| {
            let order: serde_json::Value = m.payload()?;
            s.lock().unwrap_or_else(|e| e.into_inner()).push(format!(
                "{} (correlation {}, caused by {})",
                order["order_id"],
                m.envelope.correlation_id.as_deref().unwrap_or("-"),
                m.envelope.causation_id.as_deref().unwrap_or("-"),
            ));
            Ok(Outcome::Accept)
        },
        [
            with_logging(),
            with_timeout(Duration::from_secs(5))?,
            with_ordering(by_correlation()),
        ],
    );
    let validating = connection.consume(&validate_q, validate)?;
    let shipping = connection
        .consumer(&ship_q, ConsumerOptions::new().concurrency(4))?
        .start(ship)?;
    let publisher = connection.publisher()?;
    for (id, total, digital) in [
        ("o-10", 1999, false),
        ("o-11", 500, true),
        ("o-12", 0, false),
    ] {
        let order = serde_json::json!({"order_id": id, "total_cents": total, "digital": digital});
        let message =
            Message::encode(&JsonCodec, &order)?.with_correlation_id(format!("checkout-{id}"));
        publisher.publish("", &validate_q, message)?;
    }
    wait_until(|| {
        validated.load(Ordering::SeqCst) == 3
            && !shipped.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
            && connection
                .queue_info(&dead_letter_queue(&validate_q))
                .map(|q| q.message_count == 1)
                .unwrap_or(false)
    });
    validating.close()?;
    shipping.close()?;
    publisher.close()?;
    for line in shipped.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        println!("pipeline shipped {line}");
    }
    println!(
        "pipeline: 3 orders validated, 1 shipped, the digital one stopped with NOTHING, the \
         invalid one rejected to {}",
        dead_letter_queue(&validate_q)
    );
    for q in [&validate_q, &ship_q] {
        for suffix in ["", ".dlq", ".parked"] {
            connection.delete_queue(&format!("{q}{suffix}"))?;
        }
    }
    Ok(())
}

/// The scheduler (an invoice delivered 3 s later), a stream (an event log read twice) and a
/// claim check (a 1 MiB document sent as a key to a file).
fn later_logs_and_large_documents(connection: &Connection, run: u32) -> Result<()> {
    use acemq_amqp::patterns::claim_check::{
        claim_key_of, ClaimCheckCodec, FilesystemClaimCheckStore,
    };
    use acemq_amqp::patterns::scheduler::{Scheduler, SchedulerOptions};
    use acemq_amqp::patterns::streams::{
        declare_stream, stream_offset_of, Offset, StreamOptions, StreamReader,
    };
    use acemq_amqp::{BytesCodec, StreamRetention};
    use std::sync::{Arc, Mutex};

    // Scheduler: the invoice hops down the family's TTL ladder (acemq.schedule.1s here) and is
    // delivered under a fresh envelope of type ScheduledMessage.
    let invoices = format!("tour.invoices.{run}");
    connection.declare_queue(&QueueSpec::new(&invoices).classic())?;
    let scheduler =
        Scheduler::new(connection, SchedulerOptions::default()).and_then(Scheduler::start)?;
    let invoice = Message::encode(&JsonCodec, &serde_json::json!({"invoice": "inv-9"}))?;
    let asked = std::time::Instant::now();
    scheduler.after(Duration::from_secs(3), "", &invoices, invoice)?;
    let mut delivered = None;
    wait_until(|| {
        delivered = connection.get(&invoices).ok().flatten();
        delivered.is_some()
    });
    if let Some(m) = delivered {
        println!(
            "invoice delivered {:.1} s after it was scheduled (type {:?}, {} hop(s))",
            asked.elapsed().as_secs_f64(),
            m.envelope.message_type,
            scheduler.hops()
        );
    }
    scheduler.close()?;

    // Streams: an event log keeps its messages; two readers each read all of it.
    let log = format!("tour.events.{run}");
    declare_stream(
        connection,
        &log,
        StreamRetention::default().max_age(Duration::from_secs(3600)),
    )?;
    let publisher = connection.publisher()?;
    for event in ["signed-up", "ordered", "paid"] {
        publisher.publish("", &log, Message::new(event))?;
    }
    publisher.close()?;
    for reading in ["first", "second"] {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let s = seen.clone();
        let reader =
            StreamReader::new(connection, &log, StreamOptions::new().offset(Offset::First))
                .and_then(|reader| {
                    reader.start(move |m: &Message| {
                        let text = String::from_utf8_lossy(&m.body);
                        let at = stream_offset_of(m).unwrap_or_default();
                        s.lock().expect("seen").push(format!("{at}:{text}"));
                        Ok(Outcome::Accept)
                    })
                })?;
        wait_until(|| seen.lock().expect("seen").len() == 3);
        reader.close()?;
        println!(
            "{reading} reading of the event log: {:?}",
            seen.lock().expect("seen")
        );
    }

    // Claim check: the 1 MiB document goes to a file; the broker carries `AC 01 01` + its key.
    let dir = std::env::temp_dir().join(format!("acemq-tour-claims-{run}"));
    let codec = ClaimCheckCodec::new(BytesCodec, FilesystemClaimCheckStore::new(&dir)?);
    let documents = format!("tour.documents.{run}");
    connection.declare_queue(&QueueSpec::new(&documents).classic())?;
    let document: Vec<u8> = (0..1024 * 1024).map(|i| (i % 251) as u8).collect();
    let publisher = connection.publisher()?;
    let message = Message::encode(&codec, &document)?;
    println!(
        "1 MiB document sent as a {}-byte body (key {:?})",
        message.body.len(),
        claim_key_of(&message.body).unwrap_or_default()
    );
    publisher.publish("", &documents, message)?;
    publisher.close()?;
    let mut received = None;
    wait_until(|| {
        received = connection.get(&documents).ok().flatten();
        received.is_some()
    });
    if let Some(m) = received {
        let back: Vec<u8> = m.decode(&codec)?;
        println!(
            "document read back from the store: {} bytes, equal: {}",
            back.len(),
            back == document
        );
    }

    for q in [&invoices, &documents, &log] {
        connection.delete_queue(q)?;
    }
    for q in [&log] {
        for suffix in [".dlq", ".parked"] {
            connection.delete_queue(&format!("{q}{suffix}"))?;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the `acemq` command line is built on: look at a queue without consuming it, and compare
/// what the broker has with what the code declares, changing nothing.
fn operator_tools(connection: &Connection, run: u32) -> Result<()> {
    let queue = format!("tour.inspect.{run}");
    connection.declare_queue(
        &QueueSpec::new(&queue)
            .classic()
            .message_ttl(Duration::from_secs(5)),
    )?;
    let publisher = connection.publisher()?;
    for n in 1..=3 {
        publisher.publish("", &queue, Message::new(format!("parcel {n}")))?;
    }
    publisher.close()?;
    let head = acemq_amqp::patterns::peek::peek(connection, &queue, 2)?;
    println!(
        "peeked at the first {} message(s) of {queue} ({:?} first); it still holds {}",
        head.len(),
        String::from_utf8_lossy(&head[0].body),
        connection.queue_info(&queue)?.message_count
    );
    let wanted = QueueSpec::new(&queue)
        .classic()
        .message_ttl(Duration::from_secs(60));
    for difference in connection.compare_queue(&wanted)? {
        println!("topology check: {difference}");
    }
    println!("(the same from a shell: acemq peek {queue}; acemq topology check --queue …)");
    connection.delete_queue(&queue)?;
    Ok(())
}
