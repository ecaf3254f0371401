//! The idempotent consumer against RabbitMQ, on SQLite, PostgreSQL and MySQL/MariaDB.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::observe::Observer;
use acemq_amqp::observe::Settlement;
use acemq_amqp::patterns::idempotency::{
    IdempotencyStore, SqlIdempotencyStore, SqlIdempotencyStoreOptions,
};
use acemq_amqp::patterns::idempotent::{idempotent, idempotent_tx, IdempotentOptions};
use acemq_amqp::patterns::outbox::{record, SqlOutboxStore, SqlOutboxStoreOptions};
use acemq_amqp::sql::{checkout, PostgresConnectionManager, Sql, Value};
use acemq_amqp::{
    Connection, ConnectionOptions, ConsumerOptions, Handler, JsonCodec, Message, Outcome,
    QueueSpec, RetryPolicy,
};
use support::db::{self, Backend, Db};
use support::{connect, connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

/// `attempts` attempts, waiting 100 ms then at most 200 ms in the consumer, without jitter.
fn quick_retries(attempts: u32) -> RetryPolicy {
    RetryPolicy::exponential()
        .max_attempts(attempts)
        .initial_delay(Duration::from_millis(100))
        .max_delay(Duration::from_millis(200))
        .jitter(0.0)
}

/// A consumer of `q` running `handler` with [`quick_retries`] of `attempts`.
fn consume_retrying(
    conn: &Connection,
    q: &str,
    attempts: u32,
    handler: impl Handler + Send + Sync + 'static,
) -> acemq_amqp::RunningConsumer {
    conn.consumer(q, ConsumerOptions::new().retry(quick_retries(attempts)))
        .unwrap()
        .start(handler)
        .unwrap()
}

/// Publishes `body` to `q` through the default exchange.
fn send(conn: &Connection, q: &str, body: &str) {
    conn.publisher()
        .unwrap()
        .publish("", q, Message::new(body))
        .unwrap();
}

/// The retry rungs of the tests' queues: 100 ms and 200 ms.
fn rungs() -> Vec<Duration> {
    vec![Duration::from_millis(100), Duration::from_millis(200)]
}

/// On `conn`: the clean-up and a consumed queue named after `prefix` (its rungs, [`rungs`],
/// cleaned up too), declared with the defaults.
fn queue_on(conn: &Connection, prefix: &str) -> (Cleanup, String) {
    let mut clean = Cleanup::new(conn);
    let q = clean.consumed_queue(&unique(prefix), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    (clean, q)
}

/// [`queue_on`] a connection of its own: the connection, the clean-up and the queue.
fn declared_queue(prefix: &str) -> (Connection, Cleanup, String) {
    let conn = connect();
    let (clean, q) = queue_on(&conn, prefix);
    (conn, clean, q)
}

/// A table of the test's own for its effects (`key`, `note`), created.
fn effects_table(db: &Db) -> String {
    let t = db.table("effects");
    db.connect()
        .execute(
            &format!("CREATE TABLE {t} (effect_key TEXT NOT NULL, note TEXT)"),
            &[],
        )
        .unwrap();
    t
}

/// An idempotency store with a table of the test's own and claims leased for `lease`.
fn store(db: &Db, lease: Duration) -> SqlIdempotencyStore {
    let s = SqlIdempotencyStore::open(
        db.factory(),
        SqlIdempotencyStoreOptions::default()
            .table(db.table("idem"))
            .claim_timeout(lease),
    )
    .unwrap();
    s.create_table().unwrap();
    s
}

/// The test's effect: a row in `table`, on whatever connection or transaction it is given.
fn record_effect(conn: &mut dyn Sql, table: &str, key: &str) -> acemq_amqp::Result<u64> {
    let p = conn.dialect().placeholder(1);
    conn.execute(
        &format!("INSERT INTO {table} (effect_key) VALUES ({p})"),
        &[Value::Text(key.to_string())],
    )
}

fn duplicate_delivery_applies_the_effect_once(db: &Db) {
    let (conn, _clean, q) = support::declared_consumed_queue("idem-dup");
    support::idem::a_duplicate_is_applied_once(&conn, &q, db);
}

fn a_failed_attempt_gives_the_claim_back_so_the_retry_runs(db: &Db) {
    let (conn, _clean, q) = declared_queue("idem-retry");
    let effects = effects_table(db);
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a = attempts.clone();
    let effect_db = db.factory();
    let effects2 = effects.clone();
    let handler = idempotent(
        store(db, Duration::from_secs(30)),
        move |m: &Message| {
            a.lock().unwrap().push(m.envelope.attempt);
            match m.envelope.attempt {
                1 => Err("the payment service timed out".into()),
                2 => panic!("a bug on the second attempt"),
                _ => {
                    record_effect(&mut effect_db()?, &effects2, m.id())?;
                    Ok(Outcome::Accept)
                }
            }
        },
        IdempotentOptions::default(),
    );
    let consumer = consume_retrying(&conn, &q, 5, handler);
    send(&conn, &q, "x");
    assert!(eventually(WAIT, || attempts.lock().unwrap().len() == 3));
    std::thread::sleep(Duration::from_millis(200));
    consumer.close().unwrap();
    assert_eq!(
        *attempts.lock().unwrap(),
        vec![1, 2, 3],
        "every retry ran the handler"
    );
    assert_eq!(db.count(&effects), 1);
}

fn a_claim_held_by_a_live_lease_is_in_progress(db: &Db) {
    let (conn, _clean, q) = declared_queue("idem-busy");
    let store = Arc::new(store(db, Duration::from_secs(60)));
    let message = Message::new("x");
    let key = message.id().to_string();
    // Someone else holds the claim, with a long lease.
    let held = store.claim(&key).unwrap();
    assert!(held.is_claimed());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let ran = Arc::new(AtomicUsize::new(0));
    let (s, r) = (seen.clone(), ran.clone());
    let inner = idempotent(
        store.clone(),
        move |m: &Message| {
            r.fetch_add(1, Ordering::SeqCst);
            assert_eq!(m.envelope.attempt, 1, "in progress never spends an attempt");
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default().in_progress_delay(Duration::from_millis(150)),
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().retry(RetryPolicy::none()))
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().push(m.envelope.attempt);
            inner.handle(m)
        })
        .unwrap();
    conn.publisher().unwrap().publish("", &q, message).unwrap();
    assert!(eventually(WAIT, || seen.lock().unwrap().len() >= 3));
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "not run while the claim is held"
    );
    // The other worker gives up its claim: the next return runs the handler.
    store.release(&key, held.token().unwrap()).unwrap();
    assert!(eventually(WAIT, || ran.load(Ordering::SeqCst) == 1));
    consumer.close().unwrap();
    assert!(seen.lock().unwrap().iter().all(|a| *a == 1));
    assert_eq!(
        conn.queue_info(&acemq_amqp::dead_letter_queue(&q))
            .unwrap()
            .message_count,
        0
    );
}

/// Exits the process right after the first message is committed and before its ack.
struct ExitAfterCommit;
impl Observer for ExitAfterCommit {
    fn settled(&self, s: &Settlement<'_>) {
        if s.outcome == "accept" {
            // The handler committed; the owner has not acknowledged yet.
            std::process::exit(42);
        }
    }
}

/// `idempotent_tx` on this backend's driver: its handler gets a `rusqlite::Transaction` or a
/// `postgres::Transaction` and hands it to `work` as `&mut dyn Sql`.
fn on_driver_tx(
    backend: Backend,
    sqlite_path: &std::path::Path,
    store: Arc<SqlIdempotencyStore>,
    work: impl Fn(&Message, &mut dyn Sql) -> acemq_amqp::HandlerResult + Send + Sync + 'static,
) -> impl Handler + Send + Sync + 'static {
    let handler: Box<dyn Handler + Send + Sync> = match backend {
        Backend::Sqlite => {
            let path = sqlite_path.to_path_buf();
            Box::new(idempotent_tx(
                store,
                move || db::sqlite_open(&path),
                move |m: &Message, tx: &mut rusqlite::Transaction<'_>| work(m, tx),
                IdempotentOptions::default(),
            ))
        }
        Backend::Postgres => Box::new(idempotent_tx(
            store,
            db::pg_connect,
            move |m: &Message, tx: &mut postgres::Transaction<'_>| work(m, tx),
            IdempotentOptions::default(),
        )),
        Backend::Mysql => Box::new(idempotent_tx(
            store,
            db::my_connect,
            move |m: &Message, tx: &mut mysql::Transaction<'_>| work(m, tx),
            IdempotentOptions::default(),
        )),
    };
    move |m: &Message| handler.handle(m)
}

/// The crash tests' handler: the effect, and with an outbox the next message recorded.
fn tx_handler(
    backend: Backend,
    sqlite_path: &std::path::Path,
    store: Arc<SqlIdempotencyStore>,
    effects: String,
    outbox: Option<Arc<SqlOutboxStore>>,
) -> impl Handler + Send + Sync + 'static {
    on_driver_tx(backend, sqlite_path, store, move |m, tx| {
        record_effect(tx, &effects, m.id())?;
        if let Some(outbox) = &outbox {
            let next = record(
                &JsonCodec,
                "",
                "next",
                &serde_json::json!({"after": m.id()}),
            )?;
            outbox.add(tx, &next)?;
        }
        Ok(Outcome::Accept)
    })
}

/// An outbox store on `factory` with the table `table` (not created).
fn outbox_store(
    factory: impl Fn() -> acemq_amqp::Result<db::Conn> + Send + Sync + 'static,
    table: &str,
) -> Arc<SqlOutboxStore> {
    Arc::new(SqlOutboxStore::open(factory, SqlOutboxStoreOptions::default().table(table)).unwrap())
}

/// Runs in a child process (see `crash_after_commit_before_ack`).
#[test]
#[ignore = "run as a child process by the crash tests"]
fn crash_child() {
    let Some(child) = support::idem::CrashChild::from_env() else {
        return;
    };
    let factory = child.factory();
    let (backend, path, q, idem, effects) = (
        child.backend,
        child.sqlite,
        child.queue,
        child.idem,
        child.effects,
    );
    let store = Arc::new(
        SqlIdempotencyStore::open(
            factory.clone(),
            SqlIdempotencyStoreOptions::default().table(idem),
        )
        .unwrap(),
    );
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(ExitAfterCommit),
    );
    let outbox = std::env::var("ACEMQ_CRASH_OUTBOX")
        .ok()
        .map(|t| outbox_store(factory.clone(), &t));
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().declare(false).prefetch(1))
        .unwrap()
        .start(tx_handler(backend, &path, store, effects, outbox))
        .unwrap();
    std::thread::sleep(Duration::from_secs(30));
    drop(consumer);
    panic!("the child should have exited after its first commit");
}

fn crash_after_commit_before_ack(db: &Db) {
    crash_between_commit_and_ack(db, false);
}

/// The same crash with the next message recorded in the outbox on the handler's transaction:
/// after the restart each message's record is there exactly once.
fn crash_after_commit_before_ack_records_the_next_message_once(db: &Db) {
    crash_between_commit_and_ack(db, true);
}

fn crash_between_commit_and_ack(db: &Db, with_outbox: bool) {
    let (conn, _clean, q) = declared_queue("idem-crash");
    let effects = effects_table(db);
    let store = Arc::new(store(db, Duration::from_secs(30)));
    let idem_table = store.table().to_string();
    let outbox = with_outbox.then(|| {
        let outbox = outbox_store(db.factory(), &db.table("outbox"));
        outbox.create_table().unwrap();
        outbox
    });
    let publisher = conn.publisher().unwrap();
    let ids: Vec<String> = (0..2)
        .map(|i| {
            let m = Message::new(format!("order {i}"));
            let id = m.id().to_string();
            publisher.publish("", &q, m).unwrap();
            id
        })
        .collect();

    let mut child = support::idem::crash_child(db, &q, &idem_table, &effects);
    if let Some(outbox) = &outbox {
        child.env("ACEMQ_CRASH_OUTBOX", outbox.table());
    }
    let status = child.status().unwrap();
    assert_eq!(
        status.code(),
        Some(42),
        "the child died after its first commit"
    );
    assert_eq!(db.count(&effects), 1, "the first message was committed");
    assert!(
        eventually(WAIT, || conn.queue_info(&q).unwrap().message_count == 2),
        "the broker still holds both: the first was never acknowledged"
    );

    // Restart: both are redelivered; the committed one is acknowledged without its effect.
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let inner = tx_handler(
        db.backend,
        db.sqlite_path(),
        store,
        effects.clone(),
        outbox.clone(),
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(move |m: &Message| {
            let r = inner.handle(m);
            h.fetch_add(1, Ordering::SeqCst);
            r
        })
        .unwrap();
    assert!(eventually(WAIT, || handled.load(Ordering::SeqCst) == 2));
    consumer.close().unwrap();
    assert_eq!(
        db.count(&effects),
        2,
        "each effect once: no repeat of the first"
    );
    let keys = support::idem::keys(db, &effects);
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(keys, expected);
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
    if let Some(outbox) = &outbox {
        assert_eq!(
            db.count(outbox.table()),
            2,
            "one record per message, none repeated"
        );
    }
}

fn the_transactional_form_rolls_back_work_with_the_claim(db: &Db) {
    let (conn, _clean, q) = declared_queue("idem-tx-fail");
    let effects = effects_table(db);
    let store = Arc::new(store(db, Duration::from_secs(30)));
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    let effects2 = effects.clone();
    let handler = on_driver_tx(db.backend, db.sqlite_path(), store, move |m, tx| {
        record_effect(tx, &effects2, m.id())?;
        if a.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err("the work failed after writing".into());
        }
        Ok(Outcome::Accept)
    });
    let consumer = consume_retrying(&conn, &q, 3, handler);
    send(&conn, &q, "x");
    assert!(eventually(WAIT, || attempts.load(Ordering::SeqCst) == 2));
    std::thread::sleep(Duration::from_millis(200));
    consumer.close().unwrap();
    assert_eq!(
        db.count(&effects),
        1,
        "the failed attempt's write was rolled back"
    );
    // The table is usable: no transaction was left open.
    record_effect(&mut db.connect(), &effects, "unrelated").unwrap();
    assert_eq!(db.count(&effects), 2);
}

/// Counts what a consumer settled: (outcome, attempt) per settlement.
#[derive(Clone, Default)]
struct Settled(Arc<Mutex<Vec<(String, u32)>>>);
impl Settled {
    fn count(&self, outcome: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(o, _)| o == outcome)
            .count()
    }
    fn all(&self) -> Vec<(String, u32)> {
        self.0.lock().unwrap().clone()
    }
}
impl Observer for Settled {
    fn settled(&self, s: &Settlement<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((s.outcome.to_string(), s.attempt));
    }
}

/// A connection to the tests' broker whose consumers' settlements are [`Settled`].
fn observed() -> (Connection, Settled) {
    let settled = Settled::default();
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(settled.clone()),
    );
    (conn, settled)
}

/// The state of `key` in the idempotency table, if it has a row.
fn state_of(conn: &mut dyn Sql, table: &str, key: &str) -> Option<String> {
    let p = conn.dialect().placeholder(1);
    // (`key` is a reserved word on MySQL: the store quotes it there.)
    let key_column = match conn.dialect() {
        acemq_amqp::sql::Dialect::Mysql => "`key`",
        _ => "key",
    };
    let rows = conn
        .query(
            &format!("SELECT state FROM {table} WHERE {key_column} = {p}"),
            &[Value::Text(key.to_string())],
        )
        .unwrap();
    rows.first().map(|r| r[0].as_str().unwrap().to_string())
}

/// A's lease runs out while its handler is still running; B takes the key over; A finishes and
/// confirms; B fails and gives its claim back. A's receipt must survive B's failure, so the
/// redelivery of B's copy is absorbed as a duplicate instead of running the effect again.
fn a_lease_taken_over_mid_handler_keeps_the_first_receipt(db: &Db) {
    let (conn, settled) = observed();
    let (_clean, q) = queue_on(&conn, "idem-fence");
    let effects = effects_table(db);
    let store = Arc::new(store(db, Duration::from_millis(500)));
    let idem_table = store.table().to_string();
    let runs = Arc::new(AtomicUsize::new(0));
    let (r, effect_db, effects2) = (runs.clone(), db.factory(), effects.clone());
    let state_db = db.factory();
    let inner = idempotent(
        store.clone(),
        move |m: &Message| {
            match r.fetch_add(1, Ordering::SeqCst) {
                0 => {
                    // A: still running when its lease runs out, until B has taken the key over.
                    if !eventually(WAIT, || r.load(Ordering::SeqCst) >= 2) {
                        return Err("B never took the key over".into());
                    }
                    record_effect(&mut effect_db()?, &effects2, m.id())?;
                    Ok(Outcome::Accept)
                }
                1 => {
                    // B: fails once A's receipt is written.
                    if !eventually(WAIT, || {
                        state_of(&mut *state_db().unwrap(), &idem_table, m.id()).as_deref()
                            == Some("CONFIRMED")
                    }) {
                        return Err("A never confirmed".into());
                    }
                    Err("B failed after A confirmed".into())
                }
                _ => {
                    // A later delivery that ran the effect again.
                    record_effect(&mut effect_db()?, &effects2, m.id())?;
                    Ok(Outcome::Accept)
                }
            }
        },
        IdempotentOptions::default().in_progress_delay(Duration::from_millis(100)),
    );
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new()
                .concurrency(2)
                .prefetch(4)
                .retry(quick_retries(3)),
        )
        .unwrap()
        .start(inner)
        .unwrap();
    let publisher = conn.publisher().unwrap();
    let first = Message::new("charge");
    let again = first.clone(); // the same x-acemq-id, delivered a second time
    publisher.publish("", &q, first).unwrap();
    publisher.publish("", &q, again).unwrap();
    assert!(
        eventually(WAIT, || settled.count("accept") == 2),
        "both copies settled: {:?}",
        settled.all()
    );
    consumer.close().unwrap();
    assert_eq!(
        db.count(&effects),
        1,
        "the effect ran once: {:?}",
        settled.all()
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "A and B ran, the redelivery did not"
    );
}

/// Handle a message and record the next one, in one transaction: the shape of every service.
fn consume_then_record_in_one_transaction(db: &Db) {
    let (conn, settled) = observed();
    let (_clean, q) = queue_on(&conn, "idem-tx-record");
    let effects = effects_table(db);
    let outbox = Arc::new(
        SqlOutboxStore::open(
            db.factory(),
            SqlOutboxStoreOptions::default().table(db.table("outbox")),
        )
        .unwrap(),
    );
    outbox.create_table().unwrap();
    let store = Arc::new(store(db, Duration::from_secs(30)));
    let next = |m: &Message| {
        record(
            &JsonCodec,
            "",
            "next",
            &serde_json::json!({"after": m.id()}),
        )
    };
    let insert = format!("INSERT INTO {effects} (effect_key) VALUES ($1)");
    let ob = outbox.clone();
    // The business write with the driver's own API, the outbox record on the same transaction.
    let handler: Box<dyn Handler + Send + Sync> = match db.backend {
        Backend::Sqlite => {
            let path = db.sqlite_path().to_path_buf();
            let insert = insert.replace('$', "?");
            Box::new(idempotent_tx(
                store,
                move || db::sqlite_open(&path),
                move |m: &Message, tx: &mut rusqlite::Transaction<'_>| {
                    // As `&Connection`: with `acemq_amqp::sql::Sql` in scope (as in this
                    // file), `tx.execute` on a `&mut rusqlite::Transaction` is `Sql::execute`.
                    let conn: &rusqlite::Connection = tx;
                    conn.execute(&insert, [m.id()])?;
                    ob.add(tx, &next(m)?)?;
                    Ok(Outcome::Accept)
                },
                IdempotentOptions::default(),
            ))
        }
        Backend::Postgres => Box::new(idempotent_tx(
            store,
            db::pg_connect,
            move |m: &Message, tx: &mut postgres::Transaction<'_>| {
                tx.execute(&insert, &[&m.id()])?;
                ob.add(tx, &next(m)?)?;
                Ok(Outcome::Accept)
            },
            IdempotentOptions::default(),
        )),
        Backend::Mysql => Box::new(idempotent_tx(
            store,
            db::my_connect,
            move |m: &Message, tx: &mut mysql::Transaction<'_>| {
                Sql::execute(tx, &insert, &[Value::Text(m.id().to_string())])?;
                ob.add(tx, &next(m)?)?;
                Ok(Outcome::Accept)
            },
            IdempotentOptions::default(),
        )),
    };
    let handler = move |m: &Message| handler.handle(m);
    let consumer = consume_retrying(&conn, &q, 3, handler);
    send(&conn, &q, "order");
    assert!(
        eventually(WAIT, || settled.count("accept")
            + settled.count("reject")
            + settled.count("dead_letter")
            >= 1),
        "settled: {:?}",
        settled.all()
    );
    consumer.close().unwrap();
    assert_eq!(
        settled.all(),
        vec![("accept".to_string(), 1)],
        "accepted at the first attempt"
    );
    assert_eq!(db.count(&effects), 1, "the effect committed");
    assert_eq!(
        db.count(outbox.table()),
        1,
        "the next message was recorded with it"
    );
    assert_eq!(
        conn.queue_info(&acemq_amqp::dead_letter_queue(&q))
            .unwrap()
            .message_count,
        0
    );
}

/// Records the duplicates an idempotent wrapper reports.
#[derive(Clone, Default)]
struct Duplicates(Arc<Mutex<Vec<(String, u64)>>>);
impl Observer for Duplicates {
    fn duplicate(&self, d: &acemq_amqp::observe::Duplicate<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((d.key.to_string(), d.duplicates));
    }
}

/// Publishes one message twice to a consumer running `handler`; waits until both are accepted.
fn deliver_twice(q: &str, handler: impl Handler + Send + Sync + 'static) -> Message {
    let (conn, settled) = observed();
    let consumer = conn
        .consumer(q, ConsumerOptions::new())
        .unwrap()
        .start(handler)
        .unwrap();
    let publisher = conn.publisher().unwrap();
    let message = Message::new("charge");
    publisher.publish("", q, message.clone()).unwrap();
    assert!(eventually(WAIT, || settled.count("accept") == 1));
    publisher.publish("", q, message.clone()).unwrap();
    assert!(eventually(WAIT, || settled.count("accept") == 2));
    consumer.close().unwrap();
    assert_eq!(settled.all().len(), 2, "{:?}", settled.all());
    message
}

/// A duplicate absorbed by an idempotent wrapper settles exactly like a real run (accept); the
/// wrapper reports it to its observer and counts it, in the plain and the transactional form.
fn a_duplicate_absorbed_is_reported_and_counted(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let (plain_q, tx_q) = (
        clean.consumed_queue(&unique("idem-dup-seen"), &rungs()),
        clean.consumed_queue(&unique("idem-dup-seen-tx"), &rungs()),
    );
    for q in [&plain_q, &tx_q] {
        conn.declare_queue(&QueueSpec::new(q)).unwrap();
    }
    let store = Arc::new(store(db, Duration::from_secs(30)));

    let seen = Duplicates::default();
    let plain = idempotent(
        store.clone(),
        |_: &Message| Ok(Outcome::Accept),
        IdempotentOptions::default().observer(seen.clone()),
    );
    let count = plain.duplicates();
    let message = deliver_twice(&plain_q, plain);
    assert_eq!(*seen.0.lock().unwrap(), vec![(message.id().to_string(), 1)]);
    assert_eq!(count.get(), 1);

    let seen = Duplicates::default();
    let path = db.sqlite_path().to_path_buf();
    let (count, message) = match db.backend {
        Backend::Sqlite => {
            let h = idempotent_tx(
                store,
                move || db::sqlite_open(&path),
                |_: &Message, _: &mut rusqlite::Transaction<'_>| Ok(Outcome::Accept),
                IdempotentOptions::default().observer(seen.clone()),
            );
            (h.duplicates(), deliver_twice(&tx_q, h))
        }
        Backend::Postgres => {
            let h = idempotent_tx(
                store,
                db::pg_connect,
                |_: &Message, _: &mut postgres::Transaction<'_>| Ok(Outcome::Accept),
                IdempotentOptions::default().observer(seen.clone()),
            );
            (h.duplicates(), deliver_twice(&tx_q, h))
        }
        Backend::Mysql => {
            let h = idempotent_tx(
                store,
                db::my_connect,
                |_: &Message, _: &mut mysql::Transaction<'_>| Ok(Outcome::Accept),
                IdempotentOptions::default().observer(seen.clone()),
            );
            (h.duplicates(), deliver_twice(&tx_q, h))
        }
    };
    assert_eq!(*seen.0.lock().unwrap(), vec![(message.id().to_string(), 1)]);
    assert_eq!(count.get(), 1);
}

on_every_database!(
    a_duplicate_absorbed_is_reported_and_counted,
    a_lease_taken_over_mid_handler_keeps_the_first_receipt,
    consume_then_record_in_one_transaction,
    crash_after_commit_before_ack_records_the_next_message_once,
);

/// A PostgreSQL pool of `size` whose connections carry a unique `application_name`, returned
/// with it, so that a test can kill exactly its own connections.
fn pg_pool(
    size: u32,
    test_on_check_out: bool,
) -> (
    r2d2::Pool<PostgresConnectionManager<postgres::NoTls>>,
    String,
) {
    let app = format!("acemq_{}", unique("pool").replace('.', "_"));
    let config: postgres::Config = format!("{} application_name={app}", db::PG_URL)
        .parse()
        .unwrap();
    let pool = r2d2::Pool::builder()
        .max_size(size)
        .test_on_check_out(test_on_check_out)
        .build(PostgresConnectionManager::new(config, postgres::NoTls))
        .unwrap();
    (pool, app)
}

/// Kills the server side of every connection named `app`, as a restart of the server does;
/// returns how many.
fn kill_connections(db: &Db, app: &str) -> usize {
    db.connect()
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[Value::Text(app.to_string())],
        )
        .unwrap()
        .len()
}

/// Publishes one message to a consumer running `handler` (five attempts) and returns how the
/// consumer settled it once it was accepted or dead-lettered.
fn settle_one(
    conn: &Connection,
    settled: &Settled,
    q: &str,
    handler: impl Handler + Send + Sync + 'static,
) -> Vec<(String, u32)> {
    let consumer = consume_retrying(conn, q, 5, handler);
    conn.publisher()
        .unwrap()
        .publish("", q, Message::new("after the restart"))
        .unwrap();
    let dlq = acemq_amqp::dead_letter_queue(q);
    assert!(
        eventually(WAIT, || settled.count("accept") >= 1
            || conn.queue_info(&dlq).unwrap().message_count >= 1),
        "settled: {:?}",
        settled.all()
    );
    consumer.close().unwrap();
    assert_eq!(
        conn.queue_info(&dlq).unwrap().message_count,
        0,
        "nothing dead-lettered"
    );
    settled.all()
}

/// Consumes one message on a queue named after `prefix` with `idempotent_tx` on `pool` (the
/// effect a row) and asserts it was accepted at its first attempt, its effect written once.
fn assert_handled_at_the_first_attempt_on(
    db: &Db,
    pool: &r2d2::Pool<PostgresConnectionManager<postgres::NoTls>>,
    prefix: &str,
) {
    let (conn, settled) = observed();
    let (_clean, q) = queue_on(&conn, prefix);
    let effects = effects_table(db);
    let store = Arc::new(store(db, Duration::from_secs(30)));
    let insert = format!("INSERT INTO {effects} (effect_key) VALUES ($1)");
    let handler = idempotent_tx(
        store,
        checkout(pool),
        move |m: &Message, tx: &mut postgres::Transaction<'_>| {
            tx.execute(&insert, &[&m.id()])?;
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    assert_eq!(
        settle_one(&conn, &settled, &q, handler),
        vec![("accept".to_string(), 1)],
        "handled at its first attempt"
    );
    assert_eq!(db.count(&effects), 1);
}

/// A database restart kills the pool's idle connections: a message handled afterwards must not
/// pay a delivery attempt for each dead connection (it never ran), let alone be dead-lettered.
#[test]
fn a_database_restart_costs_no_delivery_attempt() {
    let db = Db::postgres();
    // Eight idle connections in the pool, all killed.
    let (pool, app) = pg_pool(8, true);
    assert_eq!(pool.state().idle_connections, 8);
    assert_eq!(kill_connections(&db, &app), 8);
    assert_handled_at_the_first_attempt_on(&db, &pool, "idem-pg-restart");
}

/// A pool that does not test connections on checkout hands out a dead one: its `BEGIN` fails
/// before the handler ran, and the step is retried on a fresh connection without spending the
/// message's attempt.
#[test]
fn a_connection_dead_at_begin_is_replaced_without_spending_an_attempt() {
    let db = Db::postgres();
    let (pool, app) = pg_pool(1, false);
    assert_eq!(kill_connections(&db, &app), 1);
    assert_handled_at_the_first_attempt_on(&db, &pool, "idem-pg-begin");
}

on_every_database!(
    duplicate_delivery_applies_the_effect_once,
    a_failed_attempt_gives_the_claim_back_so_the_retry_runs,
    a_claim_held_by_a_live_lease_is_in_progress,
    crash_after_commit_before_ack,
    the_transactional_form_rolls_back_work_with_the_claim,
);
