//! The outbox relay against RabbitMQ, on SQLite, PostgreSQL and MySQL/MariaDB.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::OutboxEvent;
use acemq_amqp::patterns::outbox::{
    record, record_message, OutboxRecord, OutboxRelay, OutboxRelayOptions, OutboxStats,
    OutboxStore, SqlOutboxStore, SqlOutboxStoreOptions,
};
use acemq_amqp::sql::{Sql, Value};
use acemq_amqp::testing::FaultProxy;
use acemq_amqp::{
    ConnectionOptions, ConsumerOptions, Error, JsonCodec, Message, Outcome, QueueSpec,
};
use support::db::{self, Backend, Db};
use support::outbox::{outbox, outbox_and_relay, same_table};
use support::{connect, connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

fn rollback_publishes_nothing_and_commit_publishes_once(db: &Db) {
    let (conn, _clean, q) = support::declared_queue("outbox-commit");
    support::outbox::rollback_publishes_nothing_and_commit_publishes_once(&conn, &q, db);
}

fn an_unroutable_record_retires_and_then_the_queue_behind_it_moves(db: &Db) {
    let (conn, _clean, q) = support::declared_queue("outbox-order");
    let (store, _, relay) = outbox_and_relay(&conn, db, 3);
    let add = |rk: &str, body: &str| {
        let m = Message::new(body.to_string());
        let r = acemq_amqp::patterns::outbox::record_message("", rk, &m).unwrap();
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
    let (direct, _clean, q) = support::declared_queue("outbox-cut");
    let store = outbox(&db, 10);
    let table = store.table().to_string();
    let ids = add_many(&db, &store, &q, 1_000);
    let (consumer, seen) = collector(&direct, &q);

    let (proxy, conn) = support::through_proxy(Duration::from_millis(300));
    let options = OutboxRelayOptions::new()
        .batch_size(20)
        .interval(Duration::from_millis(20));
    let relay = OutboxRelay::new(&conn, same_table(&db, &store), options)
        .unwrap()
        .start()
        .unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() >= 200));
    proxy.cut();
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
    let (conn, _clean, q) = support::declared_queue("outbox-two");
    let store = outbox(&db, 10);
    let table = store.table().to_string();
    let ids = add_many(&db, &store, &q, 2_000);
    let (consumer, seen) = collector(&conn, &q);
    let options = OutboxRelayOptions::new()
        .batch_size(50)
        .interval(Duration::from_millis(10));
    let a = OutboxRelay::new(&conn, same_table(&db, &store), options.clone()).unwrap();
    let b = OutboxRelay::new(&conn, same_table(&db, &store), options).unwrap();
    let a = a.start().unwrap();
    let b = b.start().unwrap();
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
    let (_clean, q) = support::queue_on(&conn, "outbox-observe", |spec| spec);
    let store = outbox(&db, 10);
    add_many(&db, &store, &q, 250);
    std::thread::sleep(Duration::from_millis(50));
    let options = OutboxRelayOptions::new()
        .batch_size(100)
        .interval(Duration::from_millis(50));
    // `start` consumes the relay: a second sweeper cannot be started by mistake.
    let relay = OutboxRelay::new(&conn, same_table(&db, &store), options)
        .unwrap()
        .start()
        .unwrap();
    assert!(eventually(WAIT, || recorder
        .published
        .load(Ordering::SeqCst)
        == 250));
    assert!(eventually(WAIT, || recorder.backlog.lock().unwrap().last() == Some(&0)));
    let report = relay.close().unwrap();
    assert_eq!(report.published, 250, "{report:?}");
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

/// The rows of an outbox table, by id: (id, attempts, last_error).
fn rows(db: &Db, table: &str) -> Vec<(i64, i64, Option<String>)> {
    db.connect()
        .query(
            &format!("SELECT id, attempts, last_error FROM {table} ORDER BY id"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap(),
                r[1].as_i64().unwrap(),
                r[2].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// Takes every message waiting on `q`; returns their bodies as text, in order.
fn drain(conn: &acemq_amqp::Connection, q: &str) -> Vec<String> {
    std::iter::from_fn(|| conn.get(q).unwrap())
        .map(|m| String::from_utf8(m.body).unwrap())
        .collect()
}

/// Adds a record of a text message on its own committed transaction; returns its id.
fn add_text(db: &Db, store: &SqlOutboxStore, exchange: &str, routing_key: &str, body: &str) -> i64 {
    let r = record_message(exchange, routing_key, &Message::new(body.to_string())).unwrap();
    db.in_tx(true, |tx| store.add(tx, &r).unwrap())
}

/// A queue that refuses (nacks) every publish: full at length 0, rejecting when full.
fn nacking_queue(conn: &acemq_amqp::Connection, clean: &mut Cleanup) -> String {
    let full = clean.queue(&unique("outbox-nack-full"));
    conn.declare_queue(
        &QueueSpec::new(&full)
            .classic()
            .max_length(0)
            .argument("x-overflow", "reject-publish"),
    )
    .unwrap();
    full
}

fn a_nacked_record_is_counted_retires_and_keeps_its_place(db: &Db) {
    let (conn, mut clean, q) = support::declared_queue("outbox-nack-ok");
    let full = nacking_queue(&conn, &mut clean);
    let (store, table, relay) = outbox_and_relay(&conn, db, 3);
    let refused = add_text(db, &store, "", &full, "r1");
    add_text(db, &store, "", &q, "r2");
    // Sweep 1: r1 is nacked, and that counts; r2 went out in the same pipelined window
    // (documented).
    let e = relay.sweep().unwrap_err();
    assert!(matches!(e, Error::Nacked { .. }), "{e:?}");
    assert_eq!(
        rows(db, &table)[0].1,
        1,
        "the nack is counted against r1: {:?}",
        rows(db, &table)
    );
    add_text(db, &store, "", &q, "r3");
    // Sweeps 2 and 3: r1 goes alone and is nacked again; nothing behind it moves.
    for _ in 0..2 {
        let e = relay.sweep().unwrap_err();
        assert!(matches!(e, Error::Nacked { .. }), "{e:?}");
        assert_eq!(
            conn.queue_info(&q).unwrap().message_count,
            1,
            "r3 waits behind r1"
        );
    }
    let retired = store.retired().unwrap();
    assert_eq!(retired.len(), 1, "{:?}", rows(db, &table));
    assert_eq!(retired[0].id, refused);
    assert_eq!(retired[0].attempts, 3);
    assert!(retired[0].last_error.as_deref().unwrap().contains("nacked"));
    // r1 retired: the queue behind it moves.
    assert_eq!(relay.sweep().unwrap(), 1);
    assert_eq!(drain(&conn, &q), ["r2", "r3"]);
    assert_eq!(conn.queue_info(&full).unwrap().message_count, 0);
    relay.close().unwrap();
}

fn a_record_that_failed_before_is_not_overtaken_when_it_is_not_first(db: &Db) {
    let (conn, mut clean, q) = support::declared_queue("outbox-not-first");
    let full = nacking_queue(&conn, &mut clean);
    let (store, table, relay) = outbox_and_relay(&conn, db, 10);
    add_text(db, &store, "", &q, "r0");
    let refused = add_text(db, &store, "", &full, "r1");
    add_text(db, &store, "", &q, "r2");
    // r1 was nacked in an earlier sweep (counted) while r0, ahead of it, was only held up by
    // a lost connection (not counted).
    db.connect()
        .execute(
            &format!("UPDATE {table} SET attempts = 1 WHERE id = {refused}"),
            &[],
        )
        .unwrap();
    // r0 goes out and the batch stops short of r1; r1 then goes alone, and r2 waits behind it.
    let first = relay.sweep();
    assert_eq!(drain(&conn, &q), ["r0"], "r2 overtook r1 ({first:?})");
    assert_eq!(first.unwrap(), 1);
    let e = relay.sweep().unwrap_err();
    assert!(matches!(e, Error::Nacked { .. }), "{e:?}");
    assert!(drain(&conn, &q).is_empty(), "r2 overtook r1");
    let attempts: Vec<i64> = rows(db, &table).iter().map(|r| r.1).collect();
    assert_eq!(attempts, [2, 0], "r1 counted twice, r2 never tried");
    relay.close().unwrap();
}

fn a_missing_exchange_is_counted_against_its_record_not_the_records_lost_with_the_channel(db: &Db) {
    let (conn, _clean, q) = support::declared_queue("outbox-404");
    let missing = unique("outbox-no-such-exchange");
    let (store, table, relay) = outbox_and_relay(&conn, db, 2);
    for i in 1..=5 {
        add_text(db, &store, "", &q, &format!("r{i}"));
    }
    let lost = add_text(db, &store, &missing, "k", "r6");
    // The broker closes the channel over r6 (404): r6 fails with NotFound, and whatever
    // confirms of r1..r5 were still outstanding are lost with the channel (ConnectionLost).
    let e = relay.sweep().unwrap_err();
    for (id, attempts, error) in rows(db, &table) {
        if id == lost {
            assert_eq!(attempts, 1, "r6's own failure is counted ({e:?})");
            assert!(error.as_deref().unwrap().contains("not found"), "{error:?}");
        } else {
            assert_eq!(attempts, 0, "record {id} charged with the channel's loss");
        }
    }
    assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    add_text(db, &store, "", &q, "r7");
    // r6 goes alone, ahead of r7, until it retires (max_attempts 2).
    let mut arrived = drain(&conn, &q);
    let mut sweeps = 0;
    while store.retired().unwrap().is_empty() {
        sweeps += 1;
        assert!(sweeps <= 4, "r6 never retired: {:?}", rows(db, &table));
        let _ = relay.sweep();
        arrived.extend(drain(&conn, &q));
        assert!(!arrived.contains(&"r7".to_string()), "r7 overtook r6");
    }
    assert_eq!(store.retired().unwrap()[0].id, lost);
    relay.sweep().unwrap();
    arrived.extend(drain(&conn, &q));
    // What the lost channel may have delivered unconfirmed comes again: keep first arrivals.
    let mut seen = HashSet::new();
    arrived.retain(|b| seen.insert(b.clone()));
    assert_eq!(arrived, ["r1", "r2", "r3", "r4", "r5", "r7"]);
    relay.close().unwrap();
}

/// The relay's lease in the tests of leases given back: long, so that waiting it out shows.
const LEASE: Duration = Duration::from_secs(30);
/// How soon a record given back must go out: far below the lease.
const PROMPTLY: Duration = Duration::from_secs(10);

/// The database refuses a statement on an outbox table until this is dropped (a trigger), as
/// a failing disk or a constraint would. On PostgreSQL each refusal is counted in a sequence.
struct Refusal<'a> {
    db: &'a Db,
    table: String,
    name: String,
}

impl<'a> Refusal<'a> {
    /// `event`: `DELETE` or `UPDATE OF attempts`.
    fn new(db: &'a Db, table: &str, event: &str) -> Refusal<'a> {
        let name = format!("{table}_refuse");
        let mut c = db.connect();
        let statements = match db.backend {
            Backend::Sqlite => vec![format!(
                "CREATE TRIGGER {name} BEFORE {event} ON {table} \
                 BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )],
            Backend::Postgres => vec![
                format!("CREATE SEQUENCE {name}_count"),
                format!(
                    "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN \
                     PERFORM nextval('{name}_count'); RAISE EXCEPTION 'refused by the test'; \
                     END $f$"
                ),
                format!(
                    "CREATE TRIGGER {name} BEFORE {event} ON {table} \
                     FOR EACH ROW EXECUTE FUNCTION {name}()"
                ),
            ],
            // (No column list for a MySQL trigger: an update refused only when it changes the
            // column named, as PostgreSQL's `UPDATE OF` fires only when the column is set.)
            Backend::Mysql => {
                let signal = "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'";
                let body = match event.strip_prefix("UPDATE OF ") {
                    Some(column) => format!(
                        "BEFORE UPDATE ON {table} FOR EACH ROW BEGIN IF NOT \
                         (NEW.{column} <=> OLD.{column}) THEN {signal}; END IF; END"
                    ),
                    None => format!("BEFORE {event} ON {table} FOR EACH ROW {signal}"),
                };
                vec![format!("CREATE TRIGGER {name} {body}")]
            }
        };
        let refusal = Refusal {
            db,
            table: table.to_string(),
            name,
        };
        for s in statements {
            c.execute(&s, &[]).unwrap();
        }
        refusal
    }

    /// How many statements were refused so far (PostgreSQL only).
    fn count(&self) -> i64 {
        assert_eq!(self.db.backend, Backend::Postgres);
        let rows = self
            .db
            .connect()
            .query(
                &format!(
                    "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {}_count",
                    self.name
                ),
                &[],
            )
            .unwrap();
        rows[0][0].as_i64().unwrap()
    }
}

impl Drop for Refusal<'_> {
    fn drop(&mut self) {
        let (name, table) = (&self.name, &self.table);
        let mut c = self.db.connect();
        let statements = match self.db.backend {
            Backend::Sqlite => vec![format!("DROP TRIGGER IF EXISTS {name}")],
            Backend::Postgres => vec![
                format!("DROP TRIGGER IF EXISTS {name} ON {table}"),
                format!("DROP FUNCTION IF EXISTS {name}()"),
                format!("DROP SEQUENCE IF EXISTS {name}_count"),
            ],
            Backend::Mysql => vec![format!("DROP TRIGGER IF EXISTS {name}")],
        };
        for s in statements {
            if let Err(e) = c.execute(&s, &[]) {
                eprintln!("could not drop the test's refusal: {s}: {e}");
            }
        }
    }
}

/// A relay's store on `first`'s table with the long test lease.
fn leasing_store(db: &Db, first: &SqlOutboxStore) -> SqlOutboxStore {
    SqlOutboxStore::open(
        db.factory(),
        SqlOutboxStoreOptions::default()
            .table(first.table())
            .max_attempts(first.max_attempts())
            .lease(LEASE),
    )
    .unwrap()
}

/// A sweep publishes r2 and finds r1 unroutable, and then the database refuses `event`:
/// r1 must be offered again at once, not after the lease.
fn the_record_not_published_is_offered_again_at_once(db: &Db, event: &str) {
    let (conn, mut clean, q) = support::declared_queue("outbox-gives-back");
    // Declared later: until then r1 is unroutable.
    let later = clean.queue(&unique("outbox-later"));
    let store = outbox(db, 10);
    let relay =
        OutboxRelay::new(&conn, leasing_store(db, &store), OutboxRelayOptions::new()).unwrap();
    let r1 = add_text(db, &store, "", &later, "r1");
    add_text(db, &store, "", &q, "r2");
    let refusal = Refusal::new(db, store.table(), event);
    let e = relay.sweep().unwrap_err();
    assert!(matches!(e, Error::Sql { .. }), "{e:?}");
    drop(refusal);
    conn.declare_queue(&QueueSpec::new(&later)).unwrap();
    let start = Instant::now();
    let went_out = eventually(PROMPTLY, || {
        let _ = relay.sweep();
        conn.queue_info(&later).unwrap().message_count == 1
    });
    assert!(
        went_out,
        "record {r1} still held {:?} after the failed sweep (lease {LEASE:?}): {:?}",
        start.elapsed(),
        rows(db, store.table())
    );
    assert_eq!(drain(&conn, &later), ["r1"]);
    relay.close().unwrap();
}

fn a_sweep_that_cannot_delete_what_it_published_gives_the_rest_back_at_once(db: &Db) {
    the_record_not_published_is_offered_again_at_once(db, "DELETE");
}

fn a_sweep_that_cannot_count_a_failure_gives_the_record_back_at_once(db: &Db) {
    the_record_not_published_is_offered_again_at_once(db, "UPDATE OF attempts");
}

#[test]
fn a_started_relay_that_cannot_delete_gives_back_the_batch_it_leased() {
    let db = Db::postgres();
    let (conn, _clean, q) = support::declared_queue("outbox-pump-gives-back");
    let store = outbox(&db, 10);
    let table = store.table().to_string();
    add_text(&db, &store, "", &q, "r0");
    let r1 = add_text(&db, &store, "", &q, "r1");
    // r1 failed once before (a nack, say): it goes alone, after the relay's pending deletes.
    db.connect()
        .execute(
            &format!("UPDATE {table} SET attempts = 1 WHERE id = $1"),
            &[Value::Integer(r1)],
        )
        .unwrap();
    let refusal = Refusal::new(&db, &table, "DELETE");
    let options = OutboxRelayOptions::new()
        .batch_size(1)
        .interval(Duration::from_millis(50));
    let a = OutboxRelay::new(&conn, leasing_store(&db, &store), options)
        .unwrap()
        .start()
        .unwrap();
    // r0 goes out (and r1 is leased behind it); deleting r0 is refused, so r1 cannot go.
    assert!(eventually(WAIT, || refusal.count() >= 1));
    a.close().unwrap();
    drop(refusal);
    // Another relay takes r1 at once, not after the lease.
    let b = OutboxRelay::new(&conn, leasing_store(&db, &store), OutboxRelayOptions::new()).unwrap();
    let start = Instant::now();
    let went_out = eventually(PROMPTLY, || {
        let _ = b.sweep();
        conn.queue_info(&q).unwrap().message_count == 2
    });
    assert!(
        went_out,
        "record {r1} still held {:?} after the failed sweep (lease {LEASE:?}): {:?}",
        start.elapsed(),
        rows(&db, &table)
    );
    assert_eq!(drain(&conn, &q), ["r0", "r1"]);
    b.close().unwrap();
}

#[test]
fn record_tells_the_message_id_the_relayed_message_carries() {
    let db = Db::sqlite();
    let (conn, _clean, q) = support::declared_queue("outbox-record-id");
    let (store, _, relay) = outbox_and_relay(&conn, &db, 10);
    let encoded = record(&conn, "", &q, &serde_json::json!({"order_id": "o-2"})).unwrap();
    let fresh = encoded
        .message_id()
        .expect("record stamps an id")
        .to_string();
    let own = record_message("", &q, &Message::new("o-3").with_id("order-o-3")).unwrap();
    assert_eq!(own.message_id(), Some("order-o-3"));
    db.in_tx(true, |tx| {
        store.add(tx, &encoded).unwrap();
        store.add(tx, &own).unwrap();
    });
    assert_eq!(relay.sweep().unwrap(), 2);
    let raw = support::raw::Raw::open();
    for expected in [fresh.as_str(), "order-o-3"] {
        let (props, _, _) = raw.get(&q).expect("relayed");
        assert_eq!(props.message_id().as_deref(), Some(expected));
        let headers = props.headers().as_ref().expect("headers");
        assert_eq!(
            headers.get("x-acemq-id"),
            Some(&support::raw::text(expected))
        );
    }
    raw.close();
    relay.close().unwrap();
}

/// What a started relay's pipelining may and may not do: with batches of 10 and record 15 of 50
/// unroutable, the batch after the failing one is already handed over when the failure comes to
/// light (documented), so ids up to 30 may go out before record 15 retires — but nothing beyond
/// that batch overtakes it, every routable record arrives exactly once and in order, and the
/// failing record retires after its attempts.
fn a_started_relay_lets_at_most_the_next_batch_overtake_a_failing_record(db: &Db) {
    #[derive(Default)]
    struct Order(Mutex<Vec<(String, i64)>>);
    impl Observer for Order {
        fn outbox(&self, event: &OutboxEvent<'_>) {
            match event {
                OutboxEvent::Published { id, .. } => {
                    self.0.lock().unwrap().push(("published".into(), *id))
                }
                OutboxEvent::Failed { id, .. } => {
                    self.0.lock().unwrap().push(("failed".into(), *id))
                }
                _ => {}
            }
        }
    }
    let order = Arc::new(Order::default());
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(order.clone()),
    );
    let (_clean, q) = support::queue_on(&conn, "outbox-pipelined", |spec| spec);
    let store = outbox(db, 3);
    let nowhere = unique("nowhere");
    let mut ids = Vec::new();
    db.in_tx(true, |tx| {
        for i in 1..=50 {
            let rk = if i == 15 {
                nowhere.as_str()
            } else {
                q.as_str()
            };
            let m = Message::new(format!("{i}"));
            ids.push(store.add(tx, &record_message("", rk, &m).unwrap()).unwrap());
        }
    });
    let stuck = ids[14];
    let relay = OutboxRelay::new(
        &conn,
        same_table(db, &store),
        OutboxRelayOptions::new()
            .batch_size(10)
            .interval(Duration::from_millis(20)),
    )
    .unwrap()
    .start()
    .unwrap();
    assert!(eventually(WAIT, || store.retired().unwrap().len() == 1
        && conn.queue_info(&q).unwrap().message_count == 49));
    relay.close().unwrap();
    let retired = store.retired().unwrap();
    assert_eq!(retired[0].id, stuck);
    assert_eq!(retired[0].attempts, 3);
    let bodies: Vec<String> = drain(&conn, &q);
    let expected: Vec<String> = (1..=50)
        .filter(|i| *i != 15)
        .map(|i| i.to_string())
        .collect();
    assert_eq!(bodies, expected, "every routable record once, in order");
    let events = order.0.lock().unwrap().clone();
    let last_failure = events
        .iter()
        .rposition(|(what, id)| what == "failed" && *id == stuck)
        .expect("the failures of the stuck record were reported");
    let overtook: Vec<i64> = events[..last_failure]
        .iter()
        .filter(|(what, _)| what == "published")
        .map(|(_, id)| *id)
        .filter(|id| *id > stuck)
        .collect();
    assert!(
        overtook.iter().all(|id| *id <= ids[29]),
        "only the failing record's batch and the one after it may overtake it: {overtook:?}"
    );
}

/// A row another program wrote (its headers are not a JSON object) between two good records:
/// the relay publishes the records around it, and retires the row at once with an error naming
/// what could not be read — it never blocks the records behind it, and it stays in the table
/// for an operator (`retired`, `acemq outbox`).
fn an_unreadable_row_is_retired_with_the_reason_and_blocks_nothing(db: &Db) {
    let (conn, _clean, q) = support::declared_queue("outbox-unreadable");
    let (store, table, relay) = outbox_and_relay(&conn, db, 3);
    add_text(db, &store, "", &q, "a");
    let bad = add_text(db, &store, "", &q, "b");
    add_text(db, &store, "", &q, "c");
    db.connect()
        .execute(
            &format!("UPDATE {table} SET headers = 'not json {{' WHERE id = {bad}"),
            &[],
        )
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let mut published = Vec::new();
    while published.len() < 2 && Instant::now() < deadline {
        let _ = relay.sweep();
        published.extend(drain(&conn, &q));
    }
    assert_eq!(
        published,
        ["a", "c"],
        "the records around the bad row went out"
    );
    let left = rows(db, &table);
    assert_eq!(left.len(), 1, "{left:?}");
    let (id, attempts, error) = &left[0];
    assert_eq!(*id, bad);
    assert_eq!(*attempts, 3, "retired at once");
    let error = error.as_deref().unwrap_or_default();
    assert!(error.contains("headers"), "{error}");
    let retired = store.retired().unwrap();
    assert_eq!(retired.iter().map(|r| r.id).collect::<Vec<_>>(), [bad]);
    assert_eq!(relay.sweep().unwrap(), 0, "nothing more to publish");
    relay.close().unwrap();
}

on_every_database!(
    an_unreadable_row_is_retired_with_the_reason_and_blocks_nothing,
    a_started_relay_lets_at_most_the_next_batch_overtake_a_failing_record,
    rollback_publishes_nothing_and_commit_publishes_once,
    an_unroutable_record_retires_and_then_the_queue_behind_it_moves,
    a_nacked_record_is_counted_retires_and_keeps_its_place,
    a_record_that_failed_before_is_not_overtaken_when_it_is_not_first,
    a_missing_exchange_is_counted_against_its_record_not_the_records_lost_with_the_channel,
    a_sweep_that_cannot_delete_what_it_published_gives_the_rest_back_at_once,
    a_sweep_that_cannot_count_a_failure_gives_the_record_back_at_once,
);

/// Records that failed before go out one at a time at the head of a sweep, each waiting for its
/// confirm. When the broker stops answering, a sweep must end well inside the records' lease —
/// otherwise the lease runs out mid-sweep and a second relay publishes the same records too.
#[test]
fn a_sweep_of_failed_records_ends_inside_their_lease_when_the_broker_stops_answering() {
    let db = Db::sqlite();
    let (_direct, _clean, q) = support::declared_queue("outbox-bounded");
    let lease = Duration::from_secs(4);
    let store = outbox(&db, 10);
    let relay_store = SqlOutboxStore::open(
        db.factory(),
        SqlOutboxStoreOptions::default()
            .table(store.table())
            .max_attempts(10)
            .lease(lease),
    )
    .unwrap();
    let proxy = FaultProxy::start(&support::amqp_url()).expect("fault proxy");
    let conn = connect_with(ConnectionOptions::new().address(proxy.url()));
    let relay = OutboxRelay::new(&conn, relay_store, OutboxRelayOptions::new()).unwrap();
    // Warm up: the relay's publisher and channel exist before the broker stops answering.
    add_text(&db, &store, "", &q, "warm-up");
    assert_eq!(relay.sweep().unwrap(), 1);
    for body in ["r1", "r2", "r3"] {
        add_text(&db, &store, "", &q, body);
    }
    for r in store.pending(10).unwrap() {
        store.record_failure(r.id, "failed before").unwrap();
    }
    proxy.freeze();
    let started = Instant::now();
    let _ = relay.sweep();
    let took = started.elapsed();
    proxy.cut();
    assert!(
        took < lease,
        "the sweep held its records {took:?}, past their {lease:?} lease"
    );
}

/// A store that remembers the `limit` of every `pending` call (the batch size the relay used),
/// and when each backlog count started and how long it took.
struct Watched {
    inner: SqlOutboxStore,
    limits: Arc<Mutex<Vec<usize>>>,
    counts: Arc<Mutex<Vec<(Instant, Duration)>>>,
}

impl Watched {
    fn new(inner: SqlOutboxStore) -> Watched {
        Watched {
            inner,
            limits: Arc::default(),
            counts: Arc::default(),
        }
    }
}

impl OutboxStore for Watched {
    fn pending(&self, limit: usize) -> acemq_amqp::Result<Vec<OutboxRecord>> {
        self.limits.lock().unwrap().push(limit);
        self.inner.pending(limit)
    }
    fn mark_published(&self, id: i64) -> acemq_amqp::Result<()> {
        self.inner.mark_published(id)
    }
    fn record_failure(&self, id: i64, error: &str) -> acemq_amqp::Result<()> {
        self.inner.record_failure(id, error)
    }
    fn retired(&self) -> acemq_amqp::Result<Vec<OutboxRecord>> {
        self.inner.retired()
    }
    fn release(&self, id: i64) -> acemq_amqp::Result<()> {
        self.inner.release(id)
    }
    fn mark_published_many(&self, ids: &[i64]) -> acemq_amqp::Result<()> {
        self.inner.mark_published_many(ids)
    }
    fn unlease(&self, ids: &[i64]) -> acemq_amqp::Result<()> {
        self.inner.unlease(ids)
    }
    fn lease(&self) -> Duration {
        self.inner.lease()
    }
    fn stats(&self) -> acemq_amqp::Result<OutboxStats> {
        let started = Instant::now();
        let stats = self.inner.stats();
        self.counts
            .lock()
            .unwrap()
            .push((started, started.elapsed()));
        stats
    }
}

/// An outbox holding 20 records for `q`, its table's name, another relay's store on that table
/// watched for the limits it leases with, those limits, and relay options of batches of 7 every
/// 20 ms.
fn twenty_records_watched(
    db: &Db,
    q: &str,
) -> (String, Watched, Arc<Mutex<Vec<usize>>>, OutboxRelayOptions) {
    let store = outbox(db, 10);
    let table = store.table().to_string();
    add_many(db, &store, q, 20);
    let watched = Watched::new(same_table(db, &store));
    let limits = Arc::clone(&watched.limits);
    let options = OutboxRelayOptions::new()
        .batch_size(7)
        .interval(Duration::from_millis(20));
    (table, watched, limits, options)
}

/// The options a relay is made with are the ones its thread sweeps with. (Before
/// `OutboxRelayOptions`, `relay.start(); let relay = relay.batch(7);` compiled and was silently
/// ignored — this test, written that way, saw the thread lease `[100]`; now options can only be
/// given before the relay exists.)
#[test]
fn a_started_relay_sweeps_with_the_batch_size_it_was_made_with() {
    let db = Db::sqlite();
    let (conn, _clean, q) = support::declared_queue("outbox-options");
    let (table, watched, limits, options) = twenty_records_watched(&db, &q);
    let relay = OutboxRelay::new(&conn, watched, options.clone()).unwrap();
    let running = relay.start().unwrap();
    assert_eq!(running.options(), &options);
    assert!(
        eventually(WAIT, || db.count(&table) == 0),
        "{} records left",
        db.count(&table)
    );
    // An on-demand sweep of the running relay uses the same options, and finds nothing left.
    assert_eq!(running.sweep().unwrap(), 0);
    let report = running.close().unwrap();
    assert_eq!(
        Arc::strong_count(&limits),
        1,
        "close left the thread running"
    );
    assert_eq!(report.published, 20, "{report:?}");
    assert_eq!(report.failed_sweeps, 0, "{report:?}");
    // At most 7 a sweep: at least 3 sweeps for the 20 records, and the one on demand.
    assert!(report.sweeps >= 4, "{report:?}");
    let limits = limits.lock().unwrap();
    assert!(
        !limits.is_empty() && limits.iter().all(|l| *l == 7),
        "the relay leased with limits {limits:?}, not the batch size of 7 it was given"
    );
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 20);
}

/// Dropping a running relay is its close, best-effort: when `drop` returns, the thread has been
/// joined (nothing holds the store any more) and what went out has been deleted.
#[test]
fn dropping_a_running_relay_joins_its_thread_and_deletes_what_went_out() {
    let db = Db::sqlite();
    let (conn, _clean, q) = support::declared_queue("outbox-drop");
    let (table, watched, limits, options) = twenty_records_watched(&db, &q);
    let running = OutboxRelay::new(&conn, watched, options)
        .unwrap()
        .start()
        .unwrap();
    support::wait_for_count(&conn, &q, 20, WAIT);
    drop(running);
    assert_eq!(
        Arc::strong_count(&limits),
        1,
        "the relay's thread (or its store) outlived the drop"
    );
    assert_eq!(db.count(&table), 0, "published records left in the outbox");
}

#[test]
fn a_relay_refuses_a_zero_batch_size_or_interval() {
    let db = Db::sqlite();
    let conn = connect();
    let store = outbox(&db, 10);
    for options in [
        OutboxRelayOptions::new().batch_size(0),
        OutboxRelayOptions::new().interval(Duration::ZERO),
    ] {
        let made = OutboxRelay::new(&conn, same_table(&db, &store), options.clone());
        assert!(
            matches!(made, Err(Error::InvalidArgument { .. })),
            "{options:?}: {made:?}"
        );
    }
}

/// The backlog gauge counts the table (`COUNT(*)` over the rows not retired): on a table of
/// half a million retired rows — nothing to publish, a count of tens of milliseconds — a relay
/// sweeping every 20 ms counted after every sweep, so it spent most of its time (and the
/// database's) counting. A count now waits at least twenty times as long as the last one took.
#[test]
fn a_relay_whose_backlog_count_is_slow_counts_at_most_a_twentieth_of_the_time() {
    let db = Db::postgres();
    let conn = connect();
    let store = outbox(&db, 10);
    let table = store.table().to_string();
    db.connect()
        .execute(
            &format!(
                "INSERT INTO {table} (exchange, routing_key, body, content_type, headers, \
                 created_ms, attempts, lease_until_ms) \
                 SELECT '', 'nowhere', '\\x00'::bytea, 'text/plain', '{{}}', 0, 10, 0 \
                 FROM generate_series(1, 500000)"
            ),
            &[],
        )
        .unwrap();
    let timed = Watched::new(same_table(&db, &store));
    let counts = Arc::clone(&timed.counts);
    let options = OutboxRelayOptions::new().interval(Duration::from_millis(20));
    let relay = OutboxRelay::new(&conn, timed, options)
        .unwrap()
        .start()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(120), || counts.lock().unwrap().len()
            >= 3),
        "the relay reported its backlog {} times",
        counts.lock().unwrap().len()
    );
    let report = relay.close().unwrap();
    assert_eq!(report.published, 0, "{report:?}");
    let counts = counts.lock().unwrap().clone();
    for pair in counts.windows(2) {
        let ((first, took), (next, _)) = (pair[0], pair[1]);
        assert!(
            next - first >= took * 20,
            "a count that took {took:?} was followed by the next {:?} after it started: {counts:?}",
            next - first
        );
    }
}
