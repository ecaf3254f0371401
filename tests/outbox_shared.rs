//! One outbox store shared by the handler that adds records and the relay that publishes them
//! (issue 48): `OutboxRelay::new` takes an `Arc` of the store, so an application opens its
//! outbox once. On SQLite, PostgreSQL and MySQL/MariaDB.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::outbox::{
    record_message, OutboxRelay, OutboxRelayOptions, OutboxStore, SqlOutboxStore,
    SqlOutboxStoreOptions,
};
use acemq_amqp::{ConsumerOptions, Message, Outcome, QueueSpec};
use support::db::{self, Db};
use support::{connect, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

/// A consumer of `incoming` whose handler records an outbox message to `outgoing` in a database
/// transaction, through the same `Arc`'d store a running relay publishes from.
fn one_store_serves_the_handler_and_the_relay(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let incoming = clean.consumed_queue(&unique("outbox-shared-in"), &[]);
    let outgoing = clean.queue(&unique("outbox-shared-out"));
    conn.declare_queue(&QueueSpec::new(&incoming)).unwrap();
    conn.declare_queue(&QueueSpec::new(&outgoing)).unwrap();

    let store = Arc::new(
        SqlOutboxStore::open(
            db.factory(),
            SqlOutboxStoreOptions::default().table(db.table("outbox")),
        )
        .unwrap(),
    );
    store.create_table().unwrap();
    // The relay takes a clone of the `Arc`: the same store, the same lease owner.
    let relay = OutboxRelay::new(
        &conn,
        Arc::clone(&store),
        OutboxRelayOptions::new().interval(Duration::from_millis(20)),
    )
    .unwrap()
    .start()
    .unwrap();

    // The handler borrows the store and the database: it runs on a scoped thread below.
    let handler = |m: &Message| {
        let onward = Message::new(m.body.clone()).with_id(format!("out-{}", m.id()));
        let record = record_message("", &outgoing, &onward)?;
        db.in_tx(true, |tx| store.add(tx, &record))?;
        Ok(Outcome::Accept)
    };
    let consumer = conn.consumer(&incoming, ConsumerOptions::new()).unwrap();
    let stop = consumer.stop_handle();
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let s = seen.clone();
    let reader = conn
        .consumer(&outgoing, ConsumerOptions::new().declare(false))
        .unwrap()
        .start(move |m: &Message| {
            *s.lock().unwrap().entry(m.id().to_string()).or_insert(0) += 1;
            Ok(Outcome::Accept)
        })
        .unwrap();

    let publisher = conn.publisher().unwrap();
    let mut want = Vec::new();
    std::thread::scope(|s| {
        let running = s.spawn(|| consumer.run(&handler));
        for i in 0..20 {
            let m = Message::new(format!("order {i}"));
            want.push(format!("out-{}", m.id()));
            publisher.publish("", &incoming, m).unwrap();
        }
        let relayed = eventually(WAIT, || seen.lock().unwrap().len() == want.len());
        stop.stop();
        running.join().unwrap().unwrap();
        assert!(
            relayed,
            "every record relayed ({} of {})",
            seen.lock().unwrap().len(),
            want.len()
        );
    });
    relay.close().unwrap();
    reader.close().unwrap();
    let seen = seen.lock().unwrap();
    for id in &want {
        assert_eq!(seen.get(id), Some(&1), "{id} once");
    }
    assert_eq!(
        store.stats().unwrap().pending,
        0,
        "nothing left in the outbox"
    );
}

on_every_database!(one_store_serves_the_handler_and_the_relay);
