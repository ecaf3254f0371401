//! The transactional outbox: an order row and its `order.placed` event commit in one SQLite
//! transaction; a running relay publishes the event after the commit (confirmed, then deleted
//! from the outbox). A rolled-back order publishes nothing.
//! Run: `cargo run --example intermediate_transactional_outbox`.

use std::time::Duration;

use acemq_amqp::patterns::outbox::{
    record, OutboxRelay, OutboxRelayOptions, SqlOutboxStore, SqlOutboxStoreOptions,
};
use acemq_amqp::{Error, JsonCodec, QueueSpec, Result};

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
    let path = dir.path().join("shop.db");
    let open = move || Ok(rusqlite::Connection::open(&path)?);
    let mut shop: rusqlite::Connection = open()?;
    shop.execute(
        "CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)",
        [],
    )?;
    let outbox = SqlOutboxStore::open(open.clone(), SqlOutboxStoreOptions::default())?;
    outbox.create_table()?;

    let connection = ex::connect()?;
    let queue = ex::name("order-events");
    connection.declare_queue(&QueueSpec::new(&queue))?;

    let placed = record(
        &JsonCodec,
        "",
        &queue,
        &serde_json::json!({"order_id": "o-1"}),
    )?;
    let mut tx = shop.transaction()?;
    tx.execute("INSERT INTO orders VALUES ('o-1', 1999)", [])?;
    outbox.add(&mut tx, &placed)?;
    tx.commit()?;
    println!("order o-1 and its event committed in one transaction");

    let doomed = record(
        &JsonCodec,
        "",
        &queue,
        &serde_json::json!({"order_id": "o-2"}),
    )?;
    let mut tx = shop.transaction()?;
    tx.execute("INSERT INTO orders VALUES ('o-2', 500)", [])?;
    outbox.add(&mut tx, &doomed)?;
    tx.rollback()?;
    println!("order o-2 rolled back: its event goes with it");

    let relay = OutboxRelay::new(
        &connection,
        SqlOutboxStore::open(open, SqlOutboxStoreOptions::default())?,
        OutboxRelayOptions::new().interval(Duration::from_millis(100)),
    )?
    .start()?;
    ex::wait_for("the relay to publish", || {
        connection
            .queue_info(&queue)
            .is_ok_and(|q| q.message_count == 1)
    });
    let report = relay.close()?;
    let event = connection.get(&queue)?.expect("the event");
    println!(
        "the relay published {} ({}); report: {report:?}",
        String::from_utf8_lossy(&event.body),
        event.id()
    );
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
