//! `acemq receipts purge` as a process against the real broker and SQLite: a dead letter older
//! than a receipt holds the cutoff back (the receipt is kept, the message named); an older
//! receipt goes; a queue past the scan limit purges nothing (exit 1).

#[allow(unexpected_cfgs)]
#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::{Command, Output};

use acemq_amqp::patterns::idempotency::{
    IdempotencyStore, SqlIdempotencyStore, SqlIdempotencyStoreOptions,
};
use acemq_amqp::{dead_letter_queue, Message, QueueSpec};
use support::{connect, unique, Cleanup};

const HOUR_MS: i64 = 3_600_000;

fn acemq(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_acemq"))
        .env("ACEMQ_URL", support::amqp_url())
        .env_remove("ACEMQ_DB")
        .args(args)
        .output()
        .expect("run acemq");
    eprintln!(
        "$ acemq {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn count(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM acemq_idempotency", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_waiting_dead_letter_keeps_the_receipts_younger_than_it() {
    let conn = connect();
    let q = unique("cli-receipts");
    let mut clean = Cleanup::new(&conn);
    clean.queue(&q);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    conn.declare_queue(&QueueSpec::new(dead_letter_queue(&q)).classic())
        .unwrap();
    let mut dead = Message::new("\"o-1\"").with_id("order-1");
    dead.envelope.first_seen_ms = acemq_amqp::now_ms() - 2 * HOUR_MS;
    conn.publisher()
        .unwrap()
        .publish("", &dead_letter_queue(&q), dead)
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("app.db");
    let path = db.clone();
    let store = SqlIdempotencyStore::open(
        move || Ok(rusqlite::Connection::open(&path)?),
        SqlIdempotencyStoreOptions::default(),
    )
    .unwrap();
    store.create_table().unwrap();
    for key in ["order-0", "order-1"] {
        assert!(store.first_time(key).unwrap());
    }
    // order-0 was confirmed three hours ago.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute(
            "UPDATE acemq_idempotency SET deadline_ms = deadline_ms - ?1 WHERE key = 'order-0'",
            [3 * HOUR_MS],
        )
        .unwrap();
    let sqlite = format!("sqlite:{}", db.display());
    let out = acemq(&[
        "receipts",
        "purge",
        "--older-than",
        "0",
        "--queue",
        &q,
        "--db",
        &sqlite,
    ]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("deleted 1 receipts"), "{text}");
    assert!(
        text.contains("order-1"),
        "the message holding it back is named: {text}"
    );
    assert_eq!(count(&db), 1, "order-1's receipt kept");

    let out = acemq(&[
        "--json",
        "receipts",
        "purge",
        "--older-than",
        "0",
        "--queue",
        &q,
        "--db",
        &sqlite,
        "--scan-limit",
        "0",
    ]);
    assert_ne!(out.status.code(), Some(0), "a scan limit of 0 is refused");
    assert_eq!(count(&db), 1, "nothing deleted");
}
