//! The batched transactional idempotent consumer (`idempotent_tx(..).batch(..)`) against
//! RabbitMQ, on SQLite, PostgreSQL and MySQL/MariaDB: one transaction per batch, a savepoint per message,
//! acknowledged only after the commit, and a kill before and after a batch's commit.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::patterns::idempotent::{
    idempotent_tx, DuplicateCount, IdempotentOptions, IdempotentTxBatchOptions,
};
use acemq_amqp::sql::Sql;
use acemq_amqp::{
    dead_letter_queue, Connection, ConsumerOptions, FatalError, Handler, HandlerResult, Message,
    Outcome, RunningConsumer,
};
use support::db::{self, Backend, Db};
use support::idem::{effects_table, keys, record_effect, recorder, store, Forward, OnCommit};
use support::{connect, eventually, publish_n};

const WAIT: Duration = Duration::from_secs(30);

type Work = dyn Fn(&Message, &mut dyn Sql) -> HandlerResult + Send + Sync;

/// The batched wrapper on this backend's driver, with its commit sizes recorded (or `on_commit`
/// called instead) and its duplicate count.
fn batched(
    (backend, sqlite_path): (Backend, &std::path::Path),
    store: Arc<SqlIdempotencyStore>,
    max: usize,
    wait: Duration,
    on_commit: OnCommit,
    work: Arc<Work>,
) -> (Box<dyn Handler + Send + Sync>, DuplicateCount) {
    let batching = IdempotentTxBatchOptions::default()
        .max_messages(max)
        .max_wait(wait)
        .on_commit(move |n| on_commit(n));
    let options = IdempotentOptions::default();
    match backend {
        Backend::Sqlite => {
            let path = sqlite_path.to_path_buf();
            let connect = move || db::sqlite_open(&path);
            let work = move |m: &Message, tx: &mut rusqlite::Transaction<'_>| work(m, tx);
            let h = idempotent_tx(store, connect, work, options)
                .batch(batching)
                .unwrap();
            let d = h.duplicates();
            (Box::new(h), d)
        }
        Backend::Postgres => {
            let work = move |m: &Message, tx: &mut postgres::Transaction<'_>| work(m, tx);
            let h = idempotent_tx(store, db::pg_connect, work, options)
                .batch(batching)
                .unwrap();
            let d = h.duplicates();
            (Box::new(h), d)
        }
        Backend::Mysql => {
            let work = move |m: &Message, tx: &mut mysql::Transaction<'_>| work(m, tx);
            let h = idempotent_tx(store, db::my_connect, work, options)
                .batch(batching)
                .unwrap();
            let d = h.duplicates();
            (Box::new(h), d)
        }
    }
}

/// [`batched`] on `db` with its commit sizes recorded: the handler, its duplicate count, and
/// the commits so far.
fn batched_on(
    db: &Db,
    store: Arc<SqlIdempotencyStore>,
    (max, wait): (usize, Duration),
    work: Arc<Work>,
) -> (
    Box<dyn Handler + Send + Sync>,
    DuplicateCount,
    Arc<Mutex<Vec<usize>>>,
) {
    let (commits, on_commit) = recorder();
    let (handler, duplicates) = batched(
        (db.backend, db.sqlite_path()),
        store,
        max,
        wait,
        on_commit,
        work,
    );
    (handler, duplicates, commits)
}

/// A consumer of `q` prefetching `prefetch` that hands the batched `handler` its batches (one
/// worker gathers them).
fn consume_batches(
    conn: &Connection,
    q: &str,
    prefetch: u16,
    handler: Box<dyn Handler + Send + Sync>,
) -> RunningConsumer {
    conn.consumer(q, ConsumerOptions::new().prefetch(prefetch))
        .unwrap()
        .start(Forward(handler))
        .unwrap()
}

/// The work of the tests' handlers: the message's effect recorded in `effects`, accepted.
fn effect_work(effects: &str) -> Arc<Work> {
    let effects = effects.to_string();
    Arc::new(move |m: &Message, tx: &mut dyn Sql| {
        record_effect(tx, &effects, m.id())?;
        Ok(Outcome::Accept)
    })
}

/// 64 messages in batches of at most 8: every effect once, in fewer commits than messages,
/// every message acknowledged. `gathered_by_worker`: one worker gathers each batch from the
/// consumer (`handle_batch`); else 8 workers call `handle` and the wrapper gathers their calls.
fn backlog(db: &Db, gathered_by_worker: bool) {
    let (conn, _clean, q) = support::declared_consumed_queue("idem-batch");
    let effects = effects_table(db);
    let ids = publish_n(&conn, &q, 64, false);
    let work = effect_work(&effects);
    let (handler, duplicates, commits) =
        batched_on(db, store(db), (8, Duration::from_millis(200)), work);
    let consumer = if gathered_by_worker {
        consume_batches(&conn, &q, 16, handler)
    } else {
        conn.consumer(&q, ConsumerOptions::new().concurrency(8).prefetch(16))
            .unwrap()
            .start(move |m: &Message| handler.handle(m))
            .unwrap()
    };
    assert!(
        eventually(WAIT, || commits.lock().unwrap().iter().sum::<usize>() == 64),
        "all 64 committed: {:?}",
        commits.lock().unwrap()
    );
    assert!(eventually(WAIT, || {
        let i = conn.queue_info(&q).unwrap();
        i.message_count == 0 && i.consumer_count == 1
    }));
    consumer.close().unwrap();
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 0, "all acked");
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(keys(db, &effects), expected, "each effect exactly once");
    let commits = commits.lock().unwrap().clone();
    assert!(
        commits.len() < 64 && commits.iter().any(|&n| n > 1),
        "batched commits: {commits:?}"
    );
    assert!(commits.iter().all(|&n| n <= 8), "at most 8: {commits:?}");
    assert_eq!(duplicates.get(), 0);
}

fn a_backlog_commits_in_batches_each_effect_once(db: &Db) {
    backlog(db, true);
}

fn concurrent_workers_calls_are_gathered_into_batches(db: &Db) {
    backlog(db, false);
}

/// In a batch of 4, one handler fails (after writing its effect), one panics: those two alone
/// are rolled back and dead-lettered with their reasons; the two others commit, their effects
/// once, and are acknowledged. The batch first ran without savepoints: at the failure that pass
/// was rolled back and the batch ran again with a savepoint per message, so the handler before
/// the failure ran twice. The next batch, after a failing one, starts with savepoints: a
/// failure in it costs no second run.
fn a_failing_message_rolls_back_alone(db: &Db) {
    let (conn, _clean, q) = support::declared_consumed_queue("idem-batch-fail");
    let effects = effects_table(db);
    let publisher = conn.publisher().unwrap();
    for body in ["ok-1", "fail", "panic", "ok-2"] {
        publisher
            .publish("", &q, Message::new(body).with_type("test"))
            .unwrap();
    }
    let e = effects.clone();
    let calls = Arc::new(Mutex::new(BTreeMap::<String, usize>::new()));
    let c = calls.clone();
    let work: Arc<Work> = Arc::new(move |m: &Message, tx: &mut dyn Sql| {
        let body = String::from_utf8_lossy(&m.body).to_string();
        *c.lock().unwrap().entry(body.clone()).or_default() += 1;
        record_effect(tx, &e, &body)?;
        match body.as_str() {
            "fail" | "fail-2" => Err(Box::new(FatalError::new("refused by the test"))),
            "panic" => panic!("the handler panicked on purpose"),
            _ => Ok(Outcome::Accept),
        }
    });
    let store = store(db);
    let idem_table = store.table().to_string();
    let (handler, _, commits) = batched_on(db, store, (4, Duration::from_secs(10)), work);
    let consumer = consume_batches(&conn, &q, 4, handler);
    let dlq = dead_letter_queue(&q);
    assert!(
        eventually(WAIT, || conn.queue_info(&dlq).unwrap().message_count == 2),
        "the two failures are dead-lettered"
    );
    support::wait_for_count(&conn, &q, 0, WAIT);
    assert!(eventually(WAIT, || consumer.in_flight() == 0));
    assert_eq!(
        commits.lock().unwrap().clone(),
        vec![4],
        "one transaction for the four"
    );
    let ran = |body: &str| calls.lock().unwrap().get(body).copied().unwrap_or(0);
    assert_eq!(
        (ran("ok-1"), ran("fail"), ran("panic"), ran("ok-2")),
        (2, 2, 1, 1),
        "the pass without savepoints stopped at the failure; the second ran each once"
    );
    assert_eq!(
        keys(db, &effects),
        vec!["ok-1".to_string(), "ok-2".to_string()],
        "the failures' effects were rolled back, the others' applied once"
    );
    assert_eq!(
        db.count(&idem_table),
        2,
        "receipts for the two accepted; the failures' claims were given back"
    );
    // The next batch starts with savepoints: its failure rolls back alone, no handler runs twice.
    for body in ["ok-3", "fail-2", "ok-4", "ok-5"] {
        publisher
            .publish("", &q, Message::new(body).with_type("test"))
            .unwrap();
    }
    assert!(
        eventually(WAIT, || conn.queue_info(&dlq).unwrap().message_count == 3),
        "the second batch's failure is dead-lettered"
    );
    assert!(eventually(WAIT, || consumer.in_flight() == 0));
    consumer.close().unwrap();
    assert_eq!(commits.lock().unwrap().clone(), vec![4, 4]);
    assert_eq!(
        ["ok-3", "fail-2", "ok-4", "ok-5"].map(ran),
        [1, 1, 1, 1],
        "each ran once"
    );
    assert_eq!(
        keys(db, &effects),
        ["ok-1", "ok-2", "ok-3", "ok-4", "ok-5"]
            .map(String::from)
            .to_vec()
    );
    let mut reasons = Vec::new();
    while let Some(m) = conn.get(&dlq).unwrap() {
        reasons.push((
            String::from_utf8_lossy(&m.body).to_string(),
            m.envelope.error.clone().unwrap_or_default(),
        ));
    }
    reasons.sort();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_eq!(reasons[0].0, "fail");
    assert_eq!(reasons[1].0, "fail-2");
    reasons.remove(1);
    assert!(reasons[0].1.contains("refused by the test"), "{reasons:?}");
    assert_eq!(reasons[1].0, "panic");
    assert!(
        reasons[1].1.contains("the handler panicked on purpose"),
        "{reasons:?}"
    );
}

/// Two deliveries of one message in one batch, and a third after the commit: one effect, two
/// duplicates, all acknowledged.
fn duplicates_in_and_after_a_batch_are_absorbed(db: &Db) {
    let (conn, _clean, q) = support::declared_consumed_queue("idem-batch-dup");
    let effects = effects_table(db);
    let publisher = conn.publisher().unwrap();
    let m = Message::new("once");
    publisher.publish("", &q, m.clone()).unwrap();
    publisher.publish("", &q, m.clone()).unwrap();
    let work = effect_work(&effects);
    let (handler, duplicates, commits) =
        batched_on(db, store(db), (2, Duration::from_secs(10)), work);
    let consumer = consume_batches(&conn, &q, 2, handler);
    assert!(eventually(WAIT, || commits.lock().unwrap().len() == 1));
    publisher.publish("", &q, m.clone()).unwrap();
    assert!(eventually(WAIT, || duplicates.get() == 2));
    support::wait_for_count(&conn, &q, 0, WAIT);
    consumer.close().unwrap();
    assert_eq!(keys(db, &effects), vec![m.id().to_string()]);
    assert_eq!(commits.lock().unwrap()[0], 2, "both in the first batch");
}

/// Runs in a child process (see `crash_in_a_batch`): batches of 4 gathered by one worker; in mode
/// `after` the process exits as soon as the first batch has committed (before any of it is
/// handed back for acknowledgement), in mode `before` it exits in the batch's fourth handler,
/// after three effects were written in the transaction and before the commit.
#[test]
#[ignore = "run as a child process by the crash tests"]
fn crash_child() {
    let child = match support::idem::CrashChild::from_env() {
        Some(child) => child,
        None => return, // not the child: nothing to do
    };
    let (factory, backend, path) = (child.factory(), child.backend, child.sqlite.clone());
    let (q, idem, effects) = (child.queue, child.idem, child.effects);
    let mode = std::env::var("ACEMQ_CRASH_MODE").unwrap();
    let store = Arc::new(
        SqlIdempotencyStore::open(factory, SqlIdempotencyStoreOptions::default().table(idem))
            .unwrap(),
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let before = mode == "before";
    let work: Arc<Work> = Arc::new(move |m: &Message, tx: &mut dyn Sql| {
        if before && calls.fetch_add(1, Ordering::SeqCst) == 3 {
            std::process::exit(43);
        }
        record_effect(tx, &effects, m.id())?;
        Ok(Outcome::Accept)
    });
    let (handler, _) = batched(
        (backend, &path),
        store,
        4,
        Duration::from_secs(20),
        Arc::new(|_| std::process::exit(42)),
        work,
    );
    let conn = connect();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().declare(false).prefetch(4))
        .unwrap()
        .start(Forward(handler))
        .unwrap();
    std::thread::sleep(Duration::from_secs(30));
    drop(consumer);
    panic!("the child should have exited in its first batch");
}

fn crash_in_a_batch(db: &Db, mode: &str) {
    let (conn, _clean, q) = support::declared_consumed_queue("idem-batch-crash");
    let effects = effects_table(db);
    let store = store(db);
    let idem_table = store.table().to_string();
    let mut ids = publish_n(&conn, &q, 4, true);
    ids.sort();

    let status = support::idem::crash_child(db, &q, &idem_table, &effects)
        .env("ACEMQ_CRASH_MODE", mode)
        .status()
        .unwrap();
    assert!(
        eventually(WAIT, || conn.queue_info(&q).unwrap().message_count == 4),
        "the broker still holds all four: none was acknowledged"
    );
    let receipts = db.count(&idem_table);
    if mode == "after" {
        assert_eq!(status.code(), Some(42), "the child died after the commit");
        assert_eq!(keys(db, &effects), ids, "the batch of four was committed");
        assert_eq!(receipts, 4);
    } else {
        assert_eq!(status.code(), Some(43), "the child died inside the batch");
        assert_eq!(db.count(&effects), 0, "nothing of the batch was applied");
        assert_eq!(receipts, 0, "no claim survived");
    }

    // Restart: all four are redelivered; each effect ends up applied exactly once.
    let work = effect_work(&effects);
    let (handler, duplicates, commits) =
        batched_on(db, store, (4, Duration::from_millis(200)), work);
    let consumer = consume_batches(&conn, &q, 4, handler);
    assert!(eventually(WAIT, || commits
        .lock()
        .unwrap()
        .iter()
        .sum::<usize>()
        == 4));
    support::wait_for_count(&conn, &q, 0, WAIT);
    consumer.close().unwrap();
    assert_eq!(keys(db, &effects), ids, "each effect exactly once");
    let expected_duplicates = if mode == "after" { 4 } else { 0 };
    assert_eq!(duplicates.get(), expected_duplicates);
}

/// A kill between a batch's commit and its acknowledgement: every redelivery is a duplicate.
fn a_kill_after_the_commit_redelivers_duplicates_only(db: &Db) {
    crash_in_a_batch(db, "after");
}

/// A kill inside a batch, before its commit: the whole batch comes back with nothing applied.
fn a_kill_before_the_commit_applies_nothing_of_the_batch(db: &Db) {
    crash_in_a_batch(db, "before");
}

#[test]
fn a_batch_of_zero_is_refused() {
    let db = Db::sqlite();
    let path = db.sqlite_path().to_path_buf();
    let r = idempotent_tx(
        store(&db),
        move || db::sqlite_open(&path),
        |_: &Message, _: &mut rusqlite::Transaction<'_>| Ok(Outcome::Accept),
        IdempotentOptions::default(),
    )
    .batch(
        IdempotentTxBatchOptions::default()
            .max_messages(0)
            .max_wait(Duration::from_millis(10)),
    );
    let e = r.expect_err("refused");
    assert!(e.to_string().contains("from 1 to 10000"), "{e}");
}

on_every_database!(
    a_backlog_commits_in_batches_each_effect_once,
    concurrent_workers_calls_are_gathered_into_batches,
    a_failing_message_rolls_back_alone,
    duplicates_in_and_after_a_batch_are_absorbed,
    a_kill_after_the_commit_redelivers_duplicates_only,
    a_kill_before_the_commit_applies_nothing_of_the_batch,
);

fn group_store(db: &Db) -> Arc<SqlIdempotencyStore> {
    group_store_leasing(db, Duration::from_secs(30))
}

fn group_store_leasing(db: &Db, lease: Duration) -> Arc<SqlIdempotencyStore> {
    let s = SqlIdempotencyStore::open(
        db.factory(),
        SqlIdempotencyStoreOptions::default()
            .table(db.table("idem_group"))
            .claim_timeout(lease)
            .group_commit(true),
    )
    .unwrap();
    s.create_table().unwrap();
    Arc::new(s)
}

/// Eight threads race to claim the same 40 keys through a group-committing store: each key is
/// claimed by exactly one of them; a confirmed key is a duplicate for everyone; a released one
/// can be claimed again; a release under another token gives nothing back.
fn group_commit_keeps_claims_atomic_and_fenced(db: &Db) {
    use acemq_amqp::patterns::idempotency::{Claim, IdempotencyStore};
    let store = group_store(db);
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    let won: Vec<Vec<(String, acemq_amqp::patterns::idempotency::ClaimToken)>> =
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let (store, keys) = (&store, &keys);
                    s.spawn(move || {
                        keys.iter()
                            .filter_map(|k| match store.claim(k).unwrap() {
                                Claim::Claimed(t) => Some((k.clone(), t)),
                                Claim::InProgress => None,
                                Claim::Duplicate => panic!("nothing was confirmed yet"),
                            })
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
    let mut all: Vec<&String> = won.iter().flatten().map(|(k, _)| k).collect();
    all.sort();
    let mut expected: Vec<&String> = keys.iter().collect();
    expected.sort();
    assert_eq!(all, expected, "every key claimed exactly once");
    let claims: Vec<(String, acemq_amqp::patterns::idempotency::ClaimToken)> =
        won.into_iter().flatten().collect();
    let other = acemq_amqp::patterns::idempotency::ClaimToken::new();
    std::thread::scope(|s| {
        for (i, (k, t)) in claims.iter().enumerate() {
            let store = &store;
            let other = &other;
            s.spawn(move || {
                if i % 2 == 0 {
                    store.confirm(k, t).unwrap();
                } else {
                    store.release(k, other).unwrap(); // not the holder: nothing given back
                    store.release(k, t).unwrap();
                }
            });
        }
    });
    for (i, (k, _)) in claims.iter().enumerate() {
        let c = store.claim(k).unwrap();
        if i % 2 == 0 {
            assert_eq!(c, Claim::Duplicate, "{k} was confirmed");
        } else {
            assert!(c.is_claimed(), "{k} was given back: {c:?}");
        }
    }
}

/// Groups claimed concurrently must not deadlock on the database: eight threads claim the same
/// keys, each in its own order (rotated, half of them reversed), round after round, so that
/// concurrent group statements meet the same rows in different orders. Every claim answers;
/// each key is won exactly once per round.
fn concurrent_groups_claiming_the_same_keys_in_different_orders_never_deadlock(db: &Db) {
    use acemq_amqp::patterns::idempotency::{Claim, IdempotencyStore};
    let store = group_store(db);
    for round in 0..20 {
        let keys: Vec<String> = (0..24).map(|i| format!("r{round}-k{i}")).collect();
        let won: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|t| {
                    let (store, keys) = (&store, &keys);
                    s.spawn(move || {
                        let mut mine: Vec<&String> = keys.iter().collect();
                        mine.rotate_left(t * 3);
                        if t % 2 == 1 {
                            mine.reverse();
                        }
                        mine.into_iter()
                            .filter(|k| {
                                let claim = store
                                    .claim(k)
                                    .unwrap_or_else(|e| panic!("claiming {k}: {e}"));
                                matches!(claim, Claim::Claimed(_))
                            })
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(won, keys.len(), "round {round}: each key won once");
    }
}

/// Claims and confirms asked for at once by many threads share groups (on PostgreSQL a group of
/// claims and confirms is one statement): each gets the answer it would have had alone. Eight
/// threads claim, confirm and claim again keys of their own (claimed, then a duplicate), while
/// another confirms a claim whose lease was taken over meanwhile: its receipt is recorded all
/// the same, and the key is a duplicate for everyone after.
fn claims_and_confirms_sharing_groups_answer_as_alone(db: &Db) {
    use acemq_amqp::patterns::idempotency::{Claim, IdempotencyStore};
    let store = group_store_leasing(db, Duration::from_secs(1));
    let stale = match store.claim("taken").unwrap() {
        Claim::Claimed(t) => t,
        other => panic!("a new key is claimed: {other:?}"),
    };
    // Once the first lease has run out, the next claim takes the key over.
    let mut successor = None;
    assert!(
        eventually(WAIT, || {
            successor = match store.claim("taken").unwrap() {
                Claim::Claimed(t) => Some(t),
                _ => None,
            };
            successor.is_some()
        }),
        "the expired claim was never taken over"
    );
    let successor = successor.unwrap();
    assert_ne!(stale.as_str(), successor.as_str());
    std::thread::scope(|s| {
        for t in 0..8 {
            let store = &store;
            s.spawn(move || {
                for i in 0..20 {
                    let key = format!("t{t}-k{i}");
                    let token = match store.claim(&key).unwrap() {
                        Claim::Claimed(token) => token,
                        other => panic!("{key} is new: {other:?}"),
                    };
                    store.confirm(&key, &token).unwrap();
                    assert_eq!(store.claim(&key).unwrap(), Claim::Duplicate, "{key}");
                }
            });
        }
        let (store, stale) = (&store, &stale);
        s.spawn(move || store.confirm("taken", stale).unwrap());
    });
    assert_eq!(store.claim("taken").unwrap(), Claim::Duplicate);
    // The successor's confirm comes late: the receipt stays a receipt.
    store.confirm("taken", &successor).unwrap();
    assert_eq!(store.claim("taken").unwrap(), Claim::Duplicate);
}

/// The plain wrapper over a group-committing store, 8 workers: each effect once, all
/// acknowledged.
fn the_plain_wrapper_over_group_commit_applies_each_effect_once(db: &Db) {
    let (conn, _clean, q) = support::declared_consumed_queue("idem-group");
    let effects = effects_table(db);
    let ids = publish_n(&conn, &q, 64, false);
    let effect_db = db.factory();
    let e = effects.clone();
    let handled = Arc::new(AtomicUsize::new(0));
    let h = handled.clone();
    let handler = acemq_amqp::patterns::idempotent::idempotent(
        group_store(db),
        move |m: &Message| {
            record_effect(&mut effect_db()?, &e, m.id())?;
            h.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new().concurrency(8).prefetch(16))
        .unwrap()
        .start(handler)
        .unwrap();
    assert!(eventually(WAIT, || handled.load(Ordering::SeqCst) == 64));
    support::wait_for_count(&conn, &q, 0, WAIT);
    consumer.close().unwrap();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(keys(db, &effects), expected);
}

on_every_database!(
    concurrent_groups_claiming_the_same_keys_in_different_orders_never_deadlock,
    group_commit_keeps_claims_atomic_and_fenced,
    claims_and_confirms_sharing_groups_answer_as_alone,
    the_plain_wrapper_over_group_commit_applies_each_effect_once,
);
