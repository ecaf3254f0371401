//! Helpers of the transactional outbox's tests (on [`super::db`]): a store on a table of the
//! test's own, and another relay's store on the same table.

use acemq_amqp::patterns::outbox::{SqlOutboxStore, SqlOutboxStoreOptions};

use super::db::Db;

/// An outbox store with `options` on a table of its own (`options`' table replaced), created.
pub fn outbox_with(db: &Db, options: SqlOutboxStoreOptions) -> SqlOutboxStore {
    let s = SqlOutboxStore::open(db.factory(), options.table(db.table("outbox"))).unwrap();
    s.create_table().unwrap();
    s
}

/// An outbox store on a table of its own that gives a record up after `max_attempts`.
pub fn outbox(db: &Db, max_attempts: u32) -> SqlOutboxStore {
    outbox_with(
        db,
        SqlOutboxStoreOptions::default().max_attempts(max_attempts),
    )
}

/// A second store (another relay's) with `options` on `first`'s table.
pub fn same_table_with(
    db: &Db,
    first: &SqlOutboxStore,
    options: SqlOutboxStoreOptions,
) -> SqlOutboxStore {
    SqlOutboxStore::open(db.factory(), options.table(first.table())).unwrap()
}

/// A second store (another relay's) on `first`'s table, with its `max_attempts`.
pub fn same_table(db: &Db, first: &SqlOutboxStore) -> SqlOutboxStore {
    same_table_with(
        db,
        first,
        SqlOutboxStoreOptions::default().max_attempts(first.max_attempts()),
    )
}

/// An outbox store on a table of its own that gives a record up after `max_attempts`, its
/// table's name, and a relay on `conn` (default options) over another store on that table.
pub fn outbox_and_relay(
    conn: &acemq_amqp::Connection,
    db: &Db,
    max_attempts: u32,
) -> (
    SqlOutboxStore,
    String,
    acemq_amqp::patterns::outbox::OutboxRelay,
) {
    let store = outbox(db, max_attempts);
    let table = store.table().to_string();
    let relay = acemq_amqp::patterns::outbox::OutboxRelay::new(
        conn,
        same_table(db, &store),
        acemq_amqp::patterns::outbox::OutboxRelayOptions::new(),
    )
    .unwrap();
    (store, table, relay)
}

/// The outbox's first scenario, on `conn`'s `queue` and `db`: a record added in a rolled-back
/// transaction publishes nothing; added in a committed one, the relay publishes it once
/// (confirmed) and deletes it.
pub fn rollback_publishes_nothing_and_commit_publishes_once(
    conn: &acemq_amqp::Connection,
    q: &str,
    db: &Db,
) {
    use acemq_amqp::JsonCodec;
    let count = || conn.queue_info(q).unwrap().message_count;
    let (store, table, relay) = outbox_and_relay(conn, db, 10);

    let rec = acemq_amqp::patterns::outbox::record(
        &JsonCodec,
        "",
        q,
        &serde_json::json!({"order_id": "o-1"}),
    )
    .unwrap();
    db.in_tx(false, |tx| store.add(tx, &rec).unwrap());
    assert_eq!(db.count(&table), 0, "rolled back: no row");
    assert_eq!(relay.sweep().unwrap(), 0);
    assert_eq!(count(), 0, "nothing published");

    let id = rec.headers["x-acemq-id"].as_str().unwrap().to_string();
    db.in_tx(true, |tx| store.add(tx, &rec).unwrap());
    assert_eq!(db.count(&table), 1, "committed: visible");
    assert_eq!(relay.sweep().unwrap(), 1);
    assert_eq!(db.count(&table), 0, "deleted after the confirm");
    assert_eq!(relay.sweep().unwrap(), 0, "not published twice");
    let got = conn.get(q).unwrap().expect("published");
    assert_eq!(got.id(), id);
    assert_eq!(got.content_type.as_deref(), Some("application/json"));
    let body: serde_json::Value = got.decode(&JsonCodec).unwrap();
    assert_eq!(body["order_id"], "o-1");
    assert!(conn.get(q).unwrap().is_none());
    relay.close().unwrap();
}
