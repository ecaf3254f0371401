//! Retention that cannot cause a duplicate (issue 51, item 4), on the real broker and SQLite:
//! a dead letter older than a receipt holds the purge's cutoff back, so a replay of it after
//! the purge is still recognised as a duplicate; receipts older than every waiting message go;
//! without queues, or past the scan limit, nothing is purged.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::patterns::idempotent::{idempotent, IdempotentOptions};
use acemq_amqp::patterns::replay::{replay, ReplayOptions};
use acemq_amqp::patterns::retention::{purge, RetentionOptions};
use acemq_amqp::{dead_letter_queue, ConsumerOptions, Message, Outcome, QueueSpec, RetryPolicy};
use support::{declared_consumed_queue, eventually, unique};

const WAIT: Duration = Duration::from_secs(30);
const HOUR_MS: i64 = 3_600_000;

fn store(path: &std::path::Path, table: &str) -> SqlIdempotencyStore {
    let path = path.to_path_buf();
    let s = SqlIdempotencyStore::open(
        move || Ok(rusqlite::Connection::open(&path)?),
        SqlIdempotencyStoreOptions::default().table(table),
    )
    .unwrap();
    s.create_table().unwrap();
    s
}

fn receipts(path: &std::path::Path, table: &str) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

/// How many receipts of the store's table `table` are confirmed.
fn confirmed(path: &std::path::Path, table: &str) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            &format!("SELECT count(*) FROM {table} WHERE state = 'CONFIRMED'"),
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// A message first sent `hours_ago`, with this id.
fn sent(id: &str, hours_ago: i64) -> Message {
    let mut m = Message::new(format!("\"{id}\"")).with_id(id);
    m.envelope.first_seen_ms = acemq_amqp::now_ms() - hours_ago * HOUR_MS;
    m
}

#[test]
fn a_dead_letter_replayed_after_a_purge_is_still_recognised_as_a_duplicate() {
    let (conn, _clean, q) = declared_consumed_queue("retention-replay");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("receipts.db");
    let table = unique("retention_receipts").replace(['.', '-'], "_");
    // Two hours ago order-1 was sent twice (a relay restarted): one copy was dead-lettered
    // then (it waits in the .dlq), the other is handled now.
    let applied = Arc::new(AtomicUsize::new(0));
    let a = applied.clone();
    let handler = idempotent(
        store(&db, &table),
        move |_: &Message| {
            a.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    let duplicates = handler.duplicates();
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(handler)
        .unwrap();
    // (The consumer declared the .dlq.)
    let p = conn.publisher().unwrap();
    p.publish("", &dead_letter_queue(&q), sent("order-1", 2))
        .unwrap();
    p.publish("", &q, sent("order-1", 2)).unwrap();
    // An old receipt of another message, confirmed three hours ago: older than everything
    // waiting, so the purge may take it.
    p.publish("", &q, sent("order-0", 3)).unwrap();
    assert!(eventually(WAIT, || applied.load(Ordering::SeqCst) == 2));
    // The handler counts before its receipt is confirmed: a confirm after the age given below
    // would write over it.
    assert!(
        eventually(WAIT, || confirmed(&db, &table) == 2),
        "the two receipts were not confirmed"
    );
    let aged = rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            &format!(
                "UPDATE {table} SET deadline_ms = deadline_ms - ?1 \
                 WHERE key = 'order-0' AND state = 'CONFIRMED'"
            ),
            [3 * HOUR_MS],
        )
        .unwrap();
    assert_eq!(aged, 1, "order-0's confirmed receipt");
    assert_eq!(receipts(&db, &table), 2);

    // Purge everything confirmed before now: the guard keeps order-1's receipt.
    let options = RetentionOptions::new(Duration::ZERO).consumed_queue(&q, &RetryPolicy::none());
    let report = purge(&conn, &store(&db, &table), None, &options).unwrap();
    let held = report
        .held_by
        .clone()
        .expect("the dead letter holds the horizon back");
    assert_eq!(held.message_id, "order-1");
    assert_eq!(held.queue, dead_letter_queue(&q));
    assert_eq!(report.receipts, 1, "order-0's old receipt went: {report}");
    assert!(report.to_string().contains("order-1"), "{report}");
    assert_eq!(receipts(&db, &table), 1);
    assert_eq!(
        conn.queue_info(&dead_letter_queue(&q))
            .unwrap()
            .message_count,
        1,
        "the scan consumed nothing"
    );

    // A week later the operator replays the dead letter: it is a duplicate, absorbed.
    replay(&conn, &dead_letter_queue(&q), ReplayOptions::default())
        .run()
        .unwrap();
    assert!(eventually(WAIT, || duplicates.get() == 1));
    assert_eq!(applied.load(Ordering::SeqCst), 2, "not applied twice");
    consumer.close().unwrap();
}

#[test]
fn with_nothing_waiting_every_receipt_past_the_retention_goes() {
    let (conn, _clean, q) = declared_consumed_queue("retention-empty");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("receipts.db");
    let table = unique("retention_empty").replace(['.', '-'], "_");
    let receipts_store = store(&db, &table);
    let handler = idempotent(
        store(&db, &table),
        |_: &Message| Ok(Outcome::Accept),
        IdempotentOptions::default(),
    );
    let consumer = conn
        .consumer(&q, ConsumerOptions::new())
        .unwrap()
        .start(handler)
        .unwrap();
    let p = conn.publisher().unwrap();
    for i in 0..3 {
        p.publish("", &q, sent(&format!("m-{i}"), 1)).unwrap();
    }
    assert!(eventually(WAIT, || receipts(&db, &table) == 3
        && conn.queue_info(&q).unwrap().message_count == 0
        && consumer.in_flight() == 0));
    consumer.close().unwrap();
    let options =
        RetentionOptions::new(Duration::from_secs(3600)).consumed_queue(&q, &RetryPolicy::none());
    let kept = purge(&conn, &receipts_store, None, &options).unwrap();
    assert_eq!(kept.receipts, 0, "confirmed just now: younger than an hour");
    let options = RetentionOptions::new(Duration::ZERO).consumed_queue(&q, &RetryPolicy::none());
    let report = purge(&conn, &receipts_store, None, &options).unwrap();
    assert_eq!(report.held_by, None);
    assert_eq!(report.receipts, 3, "{report}");
}

#[test]
fn without_queues_or_past_the_scan_limit_nothing_is_purged() {
    let (conn, _clean, q) = declared_consumed_queue("retention-limit");
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("receipts.db");
    let table = unique("retention_limit").replace(['.', '-'], "_");
    let s = store(&db, &table);
    let e = purge(&conn, &s, None, &RetentionOptions::new(Duration::ZERO)).unwrap_err();
    assert!(e.to_string().contains("needs the queues"), "{e}");
    support::publish_n(&conn, &q, 3, true);
    let options = RetentionOptions::new(Duration::ZERO)
        .consumed_queue(&q, &RetryPolicy::none())
        .scan_limit(2);
    let e = purge(&conn, &s, None, &options).unwrap_err();
    assert!(e.to_string().contains("cannot be known"), "{e}");
    assert_eq!(
        conn.queue_info(&q).unwrap().message_count,
        3,
        "nothing consumed"
    );
}
