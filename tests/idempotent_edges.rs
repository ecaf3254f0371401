//! Edges of the idempotent consumer found by review (issue 35): a batch whose leader panics
//! outside the handler, wrappers that hid batching, and the chain order that let an overrun's
//! retry run beside its orphan. On the real broker, SQLite and PostgreSQL.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::patterns::{
    by_header, chain, idempotent_tx, with_idempotency, with_logging, with_ordering, with_timeout,
    BoxHandler, Claim, ClaimToken, IdempotencyStore, InMemoryIdempotencyStore, Layer,
    SqlIdempotencyStore,
};
use acemq_amqp::sql::{Sql, Value};
use acemq_amqp::{
    ConsumerOptions, Handler, HandlerResult, Message, Outcome, QueueSpec, RetryPolicy,
};
use support::db::{self, Backend, Db};
use support::{connect, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

fn effects_table(db: &Db) -> String {
    let t = db.table("effects");
    db.connect()
        .execute(&format!("CREATE TABLE {t} (key TEXT NOT NULL)"), &[])
        .unwrap();
    t
}

fn store(db: &Db) -> Arc<SqlIdempotencyStore> {
    let s = SqlIdempotencyStore::builder(db.factory())
        .table(db.table("idem"))
        .claim_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    s.create_table().unwrap();
    Arc::new(s)
}

fn keys(db: &Db, table: &str) -> Vec<String> {
    let mut keys: Vec<String> = db
        .connect()
        .query(&format!("SELECT key FROM {table}"), &[])
        .unwrap()
        .into_iter()
        .map(|r| r[0].as_str().unwrap().to_string())
        .collect();
    keys.sort();
    keys
}

type OnCommit = Arc<dyn Fn(usize) + Send + Sync>;

/// A batched wrapper whose `Debug` the test can read (what it learned of its callers).
trait Batched: Handler + std::fmt::Debug + Send + Sync {}
impl<T: Handler + std::fmt::Debug + Send + Sync> Batched for T {}

/// The batched wrapper behind a box, per backend.
fn batched_box(
    db: &Db,
    store: Arc<SqlIdempotencyStore>,
    effects: &str,
    (max, wait): (usize, Duration),
    panic_once: Option<Arc<AtomicBool>>,
    on_commit: OnCommit,
) -> Arc<dyn Batched> {
    let effects = effects.to_string();
    let work = move |m: &Message, tx: &mut dyn Sql| -> HandlerResult {
        let p = tx.dialect().placeholder(1);
        tx.execute(
            &format!("INSERT INTO {effects} (key) VALUES ({p})"),
            &[Value::Text(m.id().to_string())],
        )?;
        Ok(Outcome::Accept)
    };
    let maybe_panic = move || {
        if let Some(flag) = &panic_once {
            if flag.swap(false, Ordering::SeqCst) {
                panic!("the connections factory panicked on purpose");
            }
        }
    };
    match db.backend {
        Backend::Sqlite => {
            let path = db.sqlite_path().to_path_buf();
            Arc::new(
                idempotent_tx(
                    store,
                    move || {
                        maybe_panic();
                        db::sqlite_open(&path)
                    },
                    move |m: &Message, tx: &mut rusqlite::Transaction<'_>| work(m, tx),
                )
                .batch(max, wait)
                .unwrap()
                .on_commit(move |n| on_commit(n)),
            )
        }
        Backend::Postgres => Arc::new(
            idempotent_tx(
                store,
                move || {
                    maybe_panic();
                    db::pg_connect()
                },
                move |m: &Message, tx: &mut postgres::Transaction<'_>| work(m, tx),
            )
            .batch(max, wait)
            .unwrap()
            .on_commit(move |n| on_commit(n)),
        ),
    }
}

/// Waits (up to `WAIT`) for every thread to end; fails the test, naming `what`, if one hangs
/// (the hung threads are left behind: a hang must fail the test, not block it).
fn joined<T>(what: &str, threads: Vec<std::thread::JoinHandle<T>>) -> Vec<std::thread::Result<T>> {
    assert!(
        eventually(WAIT, || threads.iter().all(|t| t.is_finished())),
        "{what}: {} of {} callers never returned",
        threads.iter().filter(|t| !t.is_finished()).count(),
        threads.len()
    );
    threads.into_iter().map(|t| t.join()).collect()
}

/// Item 5. Four workers call the batched wrapper through `handle` (so it gathers their calls
/// into one batch, led by one of them); the connections factory panics once, outside any
/// handler. The leader's caller sees the panic, the three others an error, all within the
/// deadline, nothing applied; then the same four messages again are all applied, once.
fn a_connect_that_panics_once_answers_every_caller_of_its_batch(db: &Db) {
    let effects = effects_table(db);
    let panic_once = Arc::new(AtomicBool::new(true));
    let handler = batched_box(
        db,
        store(db),
        &effects,
        (4, Duration::from_secs(5)),
        Some(panic_once.clone()),
        Arc::new(|_| {}),
    );
    let messages: Vec<Message> = (0..4).map(|i| Message::new(format!("{i}"))).collect();
    let round = |what: &str| {
        let threads = messages
            .iter()
            .map(|m| {
                let (h, m) = (handler.clone(), m.clone());
                std::thread::spawn(move || h.handle(&m).map_err(|e| e.to_string()))
            })
            .collect();
        joined(what, threads)
    };
    let first = round("the batch whose connect panicked");
    assert!(!panic_once.load(Ordering::SeqCst), "the factory was called");
    let panicked = first.iter().filter(|r| r.is_err()).count();
    assert_eq!(
        panicked, 1,
        "the leader's own caller sees the panic: {first:?}"
    );
    for r in first.iter().flatten() {
        let e = r.as_ref().expect_err("nothing of the batch was accepted");
        assert!(e.contains("panicked"), "each other caller is told why: {e}");
    }
    assert!(keys(db, &effects).is_empty(), "nothing applied");
    let second = round("the next batch");
    for r in &second {
        assert!(matches!(r, Ok(Ok(Outcome::Accept))), "{second:?}");
    }
    let mut expected: Vec<String> = messages.iter().map(|m| m.id().to_string()).collect();
    expected.sort();
    assert_eq!(keys(db, &effects), expected, "each applied once");
}

on_both!(a_connect_that_panics_once_answers_every_caller_of_its_batch);
