//! The idempotent consumer against RabbitMQ, on SQLite and PostgreSQL.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::observe::Settlement;
use acemq_amqp::patterns::{
    idempotent, idempotent_tx, Claim, IdempotencyStore, SqlIdempotencyStore,
};
use acemq_amqp::sql::{Sql, Value};
use acemq_amqp::{
    ConnectionOptions, ConsumerOptions, Handler, Message, Observer, Outcome, QueueSpec, RetryPolicy,
};
use support::db::{self, Backend, Db};
use support::{connect, connect_with, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(20);

fn rungs() -> Vec<Duration> {
    vec![Duration::from_millis(100), Duration::from_millis(200)]
}

fn effects_table(db: &Db) -> String {
    let t = db.table("effects");
    db.connect()
        .execute(
            &format!("CREATE TABLE {t} (key TEXT NOT NULL, note TEXT)"),
            &[],
        )
        .unwrap();
    t
}

fn store(db: &Db, lease: Duration) -> SqlIdempotencyStore {
    let s = SqlIdempotencyStore::builder(db.factory())
        .table(db.table("idem"))
        .claim_timeout(lease)
        .build()
        .unwrap();
    s.create_table().unwrap();
    s
}

/// The test's effect: a row in `table`, on whatever connection or transaction it is given.
fn record_effect(conn: &mut dyn Sql, table: &str, key: &str) -> acemq_amqp::Result<u64> {
    let p = conn.dialect().placeholder(1);
    conn.execute(
        &format!("INSERT INTO {table} (key) VALUES ({p})"),
        &[Value::Text(key.to_string())],
    )
}

fn duplicate_delivery_applies_the_effect_once(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("idem-dup"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let effects = effects_table(db);
    let store = store(db, Duration::from_secs(30));
    let calls = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let (c, r) = (calls.clone(), ran.clone());
    let effect_db = db.factory();
    let effects2 = effects.clone();
    let inner = idempotent(store, move |m: &Message| {
        r.fetch_add(1, Ordering::SeqCst);
        record_effect(&mut effect_db()?, &effects2, m.id())?;
        Ok(Outcome::Accept)
    });
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new().retry(
                RetryPolicy::exponential(3, Duration::from_millis(100), Duration::from_millis(200))
                    .jitter(0.0),
            ),
        )
        .unwrap()
        .start(move |m: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            inner.handle(m)
        })
        .unwrap();
    let publisher = conn.publisher().unwrap();
    let first = Message::new("charge").message_type("payment.requested");
    let again = first.clone(); // the same x-acemq-id, delivered a second time
    publisher.publish("", &q, first).unwrap();
    publisher.publish("", &q, again).unwrap();
    assert!(eventually(WAIT, || calls.load(Ordering::SeqCst) == 2));
    consumer.close().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(db.count(&effects), 1, "the effect was applied once");
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        0,
        "both acknowledged"
    );
}

fn a_failed_attempt_gives_the_claim_back_so_the_retry_runs(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("idem-retry"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let effects = effects_table(db);
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let a = attempts.clone();
    let effect_db = db.factory();
    let effects2 = effects.clone();
    let handler = idempotent(store(db, Duration::from_secs(30)), move |m: &Message| {
        a.lock().unwrap().push(m.envelope.attempt);
        match m.envelope.attempt {
            1 => Err("the payment service timed out".into()),
            2 => panic!("a bug on the second attempt"),
            _ => {
                record_effect(&mut effect_db()?, &effects2, m.id())?;
                Ok(Outcome::Accept)
            }
        }
    });
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new().retry(
                RetryPolicy::exponential(5, Duration::from_millis(100), Duration::from_millis(200))
                    .jitter(0.0),
            ),
        )
        .unwrap()
        .start(handler)
        .unwrap();
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
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
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("idem-busy"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let store = Arc::new(store(db, Duration::from_secs(60)));
    let message = Message::new("x");
    let key = message.id().to_string();
    // Someone else holds the claim, with a long lease.
    assert_eq!(store.claim(&key).unwrap(), Claim::Claimed);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let ran = Arc::new(AtomicUsize::new(0));
    let (s, r) = (seen.clone(), ran.clone());
    let inner = idempotent(store.clone(), move |m: &Message| {
        r.fetch_add(1, Ordering::SeqCst);
        assert_eq!(m.envelope.attempt, 1, "in progress never spends an attempt");
        Ok(Outcome::Accept)
    })
    .in_progress_delay(Duration::from_millis(150));
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().no_retry())
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
    store.forget(&key).unwrap();
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

fn tx_handler(
    db_factory: impl Fn() -> acemq_amqp::Result<db::Conn> + Send + Sync + 'static,
    store: Arc<SqlIdempotencyStore>,
    effects: String,
) -> impl Handler + Send + Sync + 'static {
    idempotent_tx(store, db_factory, move |m: &Message, tx: &mut dyn Sql| {
        record_effect(tx, &effects, m.id())?;
        Ok(Outcome::Accept)
    })
}

/// Runs in a child process (see `crash_after_commit_before_ack`).
#[test]
#[ignore = "run as a child process by the crash tests"]
fn crash_child() {
    let backend = match std::env::var("ACEMQ_CRASH_BACKEND").as_deref() {
        Ok("sqlite") => Backend::Sqlite,
        Ok("postgres") => Backend::Postgres,
        _ => return,
    };
    let path = std::path::PathBuf::from(std::env::var("ACEMQ_CRASH_SQLITE").unwrap());
    let (q, idem, effects) = (
        std::env::var("ACEMQ_CRASH_QUEUE").unwrap(),
        std::env::var("ACEMQ_CRASH_IDEM").unwrap(),
        std::env::var("ACEMQ_CRASH_EFFECTS").unwrap(),
    );
    let factory = move || -> acemq_amqp::Result<db::Conn> {
        Ok(match backend {
            Backend::Sqlite => Box::new(db::sqlite_open(&path)?),
            Backend::Postgres => Box::new(db::pg_connect()?),
        })
    };
    let store = Arc::new(
        SqlIdempotencyStore::builder(factory.clone())
            .table(idem)
            .build()
            .unwrap(),
    );
    let conn = connect_with(
        ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(ExitAfterCommit),
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().declare(false).prefetch(1))
        .unwrap()
        .start(tx_handler(factory, store, effects))
        .unwrap();
    std::thread::sleep(Duration::from_secs(30));
    drop(consumer);
    panic!("the child should have exited after its first commit");
}

fn crash_after_commit_before_ack(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("idem-crash"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let effects = effects_table(db);
    let store = Arc::new(store(db, Duration::from_secs(30)));
    let idem_table = store.table().to_string();
    let publisher = conn.publisher().unwrap();
    let ids: Vec<String> = (0..2)
        .map(|i| {
            let m = Message::new(format!("order {i}"));
            let id = m.id().to_string();
            publisher.publish("", &q, m).unwrap();
            id
        })
        .collect();

    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            "ACEMQ_CRASH_BACKEND",
            if db.backend == Backend::Sqlite {
                "sqlite"
            } else {
                "postgres"
            },
        )
        .env("ACEMQ_CRASH_SQLITE", db.sqlite_path())
        .env("ACEMQ_CRASH_QUEUE", &q)
        .env("ACEMQ_CRASH_IDEM", &idem_table)
        .env("ACEMQ_CRASH_EFFECTS", &effects)
        .status()
        .unwrap();
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
    let inner = tx_handler(db.factory(), store, effects.clone());
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
    let mut keys: Vec<String> = db
        .connect()
        .query(&format!("SELECT key FROM {effects} ORDER BY key"), &[])
        .unwrap()
        .into_iter()
        .map(|r| r[0].as_str().unwrap().to_string())
        .collect();
    keys.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(keys, expected);
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0);
}

fn the_transactional_form_rolls_back_work_with_the_claim(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique("idem-tx-fail"), &rungs());
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let effects = effects_table(db);
    let store = Arc::new(store(db, Duration::from_secs(30)));
    let attempts = Arc::new(AtomicUsize::new(0));
    let a = attempts.clone();
    let effects2 = effects.clone();
    let handler = idempotent_tx(store, db.factory(), move |m: &Message, tx: &mut dyn Sql| {
        record_effect(tx, &effects2, m.id())?;
        if a.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err("the work failed after writing".into());
        }
        Ok(Outcome::Accept)
    });
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new().retry(
                RetryPolicy::exponential(3, Duration::from_millis(100), Duration::from_millis(200))
                    .jitter(0.0),
            ),
        )
        .unwrap()
        .start(handler)
        .unwrap();
    conn.publisher()
        .unwrap()
        .publish("", &q, Message::new("x"))
        .unwrap();
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

on_both!(
    duplicate_delivery_applies_the_effect_once,
    a_failed_attempt_gives_the_claim_back_so_the_retry_runs,
    a_claim_held_by_a_live_lease_is_in_progress,
    crash_after_commit_before_ack,
    the_transactional_form_rolls_back_work_with_the_claim,
);
