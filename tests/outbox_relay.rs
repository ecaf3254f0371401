//! The outbox relay against RabbitMQ, on SQLite and PostgreSQL.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::observe::OutboxEvent;
use acemq_amqp::patterns::{record, OutboxRelay, OutboxStore, SqlOutboxStore};
use acemq_amqp::{
    ConnectionOptions, ConsumerOptions, JsonCodec, Message, Observer, Outcome, QueueSpec,
};
use support::db::{self, Db};
use support::proxy::FaultProxy;
use support::{connect, connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

fn outbox(db: &Db, max_attempts: u32) -> SqlOutboxStore {
    let s = SqlOutboxStore::builder(db.factory())
        .table(db.table("outbox"))
        .max_attempts(max_attempts)
        .build()
        .unwrap();
    s.create_table().unwrap();
    s
}

/// A second store (another relay) on the same table.
fn same_table(db: &Db, first: &SqlOutboxStore) -> SqlOutboxStore {
    SqlOutboxStore::builder(db.factory())
        .table(first.table())
        .max_attempts(first.max_attempts())
        .build()
        .unwrap()
}

fn rollback_publishes_nothing_and_commit_publishes_once(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("outbox-commit"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let store = outbox(db, 10);
    let table = store.table().to_string();
    let relay = OutboxRelay::new(&conn, same_table(db, &store));

    let rec = record(&conn, "", &q, &serde_json::json!({"order_id": "o-1"})).unwrap();
    db.in_tx(false, |tx| store.add(tx, &rec).unwrap());
    assert_eq!(db.count(&table), 0, "rolled back: no row");
    assert_eq!(relay.sweep().unwrap(), 0);
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        0,
        "nothing published"
    );

    let id_of_record = rec.headers["x-acemq-id"].as_str().unwrap().to_string();
    db.in_tx(true, |tx| store.add(tx, &rec).unwrap());
    assert_eq!(db.count(&table), 1, "committed: visible");
    assert_eq!(relay.sweep().unwrap(), 1);
    assert_eq!(db.count(&table), 0, "deleted after the confirm");
    assert_eq!(relay.sweep().unwrap(), 0, "not published twice");
    let got = conn.get(&q).unwrap().expect("published");
    assert_eq!(got.id(), id_of_record);
    assert_eq!(got.content_type.as_deref(), Some("application/json"));
    let body: serde_json::Value = got.decode(&JsonCodec).unwrap();
    assert_eq!(body["order_id"], "o-1");
    assert!(conn.get(&q).unwrap().is_none());
    relay.close().unwrap();
}

fn an_unroutable_record_retires_and_then_the_queue_behind_it_moves(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("outbox-order"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let store = outbox(db, 3);
    let relay = OutboxRelay::new(&conn, same_table(db, &store));
    let add = |rk: &str, body: &str| {
        let m = Message::new(body.to_string());
        let r = acemq_amqp::patterns::record_message("", rk, &m).unwrap();
        db.in_tx(true, |tx| store.add(tx, &r).unwrap())
    };
    let nowhere = unique("nowhere");
    let stuck = add(&nowhere, "r1");
    add(&q, "r2");
    // Sweep 1: r1 is unroutable; r2 went out in the same pipelined window (documented).
    let e = relay.sweep().unwrap_err();
    assert!(e.is_unroutable(), "{e:?}");
    add(&q, "r3");
    // Sweeps 2 and 3: r1 goes alone and fails; nothing behind it moves.
    for _ in 0..2 {
        assert!(relay.sweep().unwrap_err().is_unroutable());
        assert_eq!(
            conn.queue_info(&q).unwrap().message_count,
            1,
            "r3 waits behind r1"
        );
    }
    let retired = store.retired().unwrap();
    assert_eq!(retired.len(), 1);
    assert_eq!(retired[0].id, stuck);
    assert_eq!(retired[0].attempts, 3);
    assert!(retired[0]
        .last_error
        .as_deref()
        .unwrap()
        .contains("unroutable"));
    // r1 retired: the queue behind it moves.
    assert_eq!(relay.sweep().unwrap(), 1);
    let bodies: Vec<Vec<u8>> = std::iter::from_fn(|| conn.get(&q).unwrap())
        .map(|m| m.body)
        .collect();
    assert_eq!(bodies, vec![b"r2".to_vec(), b"r3".to_vec()]);
    // Released, it is offered again (and fails again, still unroutable).
    store.release(stuck).unwrap();
    assert!(relay.sweep().unwrap_err().is_unroutable());
    relay.close().unwrap();
}

/// Collects what arrives on a queue: ids and how often each came.
fn collector(
    conn: &acemq_amqp::Connection,
    q: &str,
) -> (
    acemq_amqp::RunningConsumer,
    Arc<Mutex<HashMap<String, usize>>>,
) {
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let s = seen.clone();
    let consumer = conn
        .consumer(q, ConsumerOptions::new().prefetch(200).declare(false))
        .unwrap()
        .start(move |m: &Message| {
            *s.lock().unwrap().entry(m.id().to_string()).or_insert(0) += 1;
            Ok(Outcome::Accept)
        })
        .unwrap();
    (consumer, seen)
}

fn add_many(db: &Db, store: &SqlOutboxStore, q: &str, n: usize) -> HashSet<String> {
    let mut ids = HashSet::new();
    for chunk in 0..n.div_ceil(100) {
        db.in_tx(true, |tx| {
            for i in 0..100.min(n - chunk * 100) {
                let r = record(
                    &JsonCodec,
                    "",
                    q,
                    &serde_json::json!({"n": chunk * 100 + i}),
                )
                .unwrap();
                ids.insert(r.headers["x-acemq-id"].as_str().unwrap().to_string());
                store.add(tx, &r).unwrap();
            }
        });
    }
    ids
}

#[test]
fn a_connection_cut_mid_sweep_loses_nothing() {
    let db = Db::sqlite();
    let direct = connect();
    let mut clean = Cleanup::new(&direct);
    let q = clean.queue(&unique("outbox-cut"));
    direct.declare_queue(&QueueSpec::new(&q)).unwrap();
    let store = outbox(&db, 10);
    let table = store.table().to_string();
    let ids = add_many(&db, &store, &q, 1_000);
    let (consumer, seen) = collector(&direct, &q);

    let proxy = FaultProxy::start("127.0.0.1:5672");
    let conn = connect_with(
        ConnectionOptions::new()
            .address(proxy.url())
            .backoff_min(Duration::from_millis(50))
            .backoff_max(Duration::from_millis(300)),
    );
    let relay = OutboxRelay::new(&conn, same_table(&db, &store))
        .batch(20)
        .interval(Duration::from_millis(20));
    relay.start().unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() >= 200));
    proxy.cut_all();
    assert!(
        eventually(WAIT, || conn.generation() == Some(2)),
        "reconnected"
    );
    assert!(
        eventually(Duration::from_secs(60), || db.count(&table) == 0),
        "{} records left",
        db.count(&table)
    );
    assert!(eventually(WAIT, || seen.lock().unwrap().len() == ids.len()));
    relay.close().unwrap();
    consumer.close().unwrap();
    let seen = seen.lock().unwrap();
    let keys: HashSet<String> = seen.keys().cloned().collect();
    assert_eq!(keys, ids, "every record arrived");
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    println!("duplicates after the cut: {duplicates}");
}

#[test]
fn two_relays_on_one_postgres_table_publish_each_record_once() {
    let db = Db::postgres();
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("outbox-two"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let store = outbox(&db, 10);
    let table = store.table().to_string();
    let ids = add_many(&db, &store, &q, 2_000);
    let (consumer, seen) = collector(&conn, &q);
    let a = OutboxRelay::new(&conn, same_table(&db, &store))
        .batch(50)
        .interval(Duration::from_millis(10));
    let b = OutboxRelay::new(&conn, same_table(&db, &store))
        .batch(50)
        .interval(Duration::from_millis(10));
    a.start().unwrap();
    b.start().unwrap();
    assert!(eventually(Duration::from_secs(60), || db.count(&table) == 0));
    assert!(eventually(WAIT, || seen.lock().unwrap().len() == 2_000));
    std::thread::sleep(Duration::from_millis(300));
    a.close().unwrap();
    b.close().unwrap();
    consumer.close().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.keys().cloned().collect::<HashSet<_>>(), ids);
    assert!(
        seen.values().all(|n| *n == 1),
        "{} records published twice",
        seen.values().filter(|n| **n > 1).count()
    );
}

#[derive(Default)]
struct OutboxRecorder {
    published: AtomicUsize,
    max_lag: Mutex<Duration>,
    backlog: Mutex<Vec<u64>>,
}
impl Observer for OutboxRecorder {
    fn outbox(&self, event: &OutboxEvent<'_>) {
        match event {
            OutboxEvent::Published { lag, .. } => {
                self.published.fetch_add(1, Ordering::SeqCst);
                let mut m = self.max_lag.lock().unwrap();
                *m = (*m).max(*lag);
            }
            OutboxEvent::Backlog { pending, .. } => self.backlog.lock().unwrap().push(*pending),
            _ => {}
        }
    }
}

#[test]
fn a_started_relay_reports_published_lag_and_backlog() {
    let db = Db::sqlite();
    let recorder = Arc::new(OutboxRecorder::default());
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(recorder.clone()),
    );
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("outbox-observe"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let store = outbox(&db, 10);
    add_many(&db, &store, &q, 250);
    std::thread::sleep(Duration::from_millis(50));
    let relay = OutboxRelay::new(&conn, same_table(&db, &store))
        .batch(100)
        .interval(Duration::from_millis(50));
    relay.start().unwrap();
    relay.start().unwrap(); // a second start is a no-op, not a second sweeper
    assert!(eventually(WAIT, || recorder
        .published
        .load(Ordering::SeqCst)
        == 250));
    assert!(eventually(WAIT, || recorder.backlog.lock().unwrap().last() == Some(&0)));
    relay.close().unwrap();
    // What must hold however the sweeps interleave with the test: the backlog never exceeds
    // what was recorded, only shrinks, and ends empty.
    let backlog = recorder.backlog.lock().unwrap().clone();
    assert!(
        backlog.iter().all(|b| *b <= 250) && backlog.windows(2).all(|w| w[1] <= w[0]),
        "backlog reports: {backlog:?}"
    );
    assert!(*recorder.max_lag.lock().unwrap() >= Duration::from_millis(50));
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 250);
}

on_both!(
    rollback_publishes_nothing_and_commit_publishes_once,
    an_unroutable_record_retires_and_then_the_queue_behind_it_moves,
);
