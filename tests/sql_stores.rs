//! The SQL seam and the stores, each test on SQLite (file-backed, WAL), on PostgreSQL and on
//! MySQL/MariaDB (`ACEMQ_TEST_MYSQL_URL`).

mod support;
use support::db;

use std::collections::HashSet;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use acemq_amqp::patterns::acknowledged::{
    ApplyBatch, BatchStore, BatchStoreOptions, Message as AckMessage,
};
use acemq_amqp::patterns::idempotency::{
    Claim, ClaimToken, IdempotencyStore, SqlIdempotencyStore, SqlIdempotencyStoreOptions,
};
use acemq_amqp::patterns::outbox::{
    NewOutboxRecord, OutboxStore, SqlOutboxStore, SqlOutboxStoreOptions,
};
use acemq_amqp::patterns::schema_registry::{
    fingerprint, SchemaRegistry, SqlSchemaRegistry, SqlSchemaRegistryOptions,
};
use acemq_amqp::sql::{create_schema, schema_ddl, Sql, Table, Value};
use acemq_amqp::Error;
use db::{Backend, Db};

/// An idempotency store with the default options on a table of the test's own, created; the
/// store and its table.
fn idem(db: &Db) -> (SqlIdempotencyStore, String) {
    idem_with(db, "idem", |o| o)
}

/// An idempotency store on a table of the test's own named after `name`, created, its options
/// shaped by `options`; the store and its table.
fn idem_with(
    db: &Db,
    name: &str,
    options: impl FnOnce(SqlIdempotencyStoreOptions) -> SqlIdempotencyStoreOptions,
) -> (SqlIdempotencyStore, String) {
    let table = db.table(name);
    (idem_on(db, &table, options), table)
}

/// An idempotency store on `table`, created, its options shaped by `options`.
fn idem_on(
    db: &Db,
    table: &str,
    options: impl FnOnce(SqlIdempotencyStoreOptions) -> SqlIdempotencyStoreOptions,
) -> SqlIdempotencyStore {
    let store = SqlIdempotencyStore::open(
        db.factory(),
        options(SqlIdempotencyStoreOptions::default().table(table)),
    )
    .unwrap();
    store.create_table().unwrap();
    store
}

/// An outbox store with the default options on `table`, created.
fn outbox(db: &Db, table: &str) -> SqlOutboxStore {
    outbox_with(db, table, |o| o)
}

/// An outbox store on `table`, created, its options shaped by `options`.
fn outbox_with(
    db: &Db,
    table: &str,
    options: impl FnOnce(SqlOutboxStoreOptions) -> SqlOutboxStoreOptions,
) -> SqlOutboxStore {
    let store = SqlOutboxStore::open(
        db.factory(),
        options(SqlOutboxStoreOptions::default().table(table)),
    )
    .unwrap();
    store.create_table().unwrap();
    store
}

/// The test's outbox record `n`: to `orders` with the key `order.{n}`, a body of bytes that are
/// not UTF-8, and two headers.
fn record(n: usize) -> NewOutboxRecord {
    let mut headers = serde_json::Map::new();
    headers.insert("n".into(), serde_json::json!(n));
    headers.insert("x-tenant".into(), serde_json::json!("acme"));
    NewOutboxRecord {
        exchange: "orders".into(),
        routing_key: format!("order.{n}"),
        // Not UTF-8: bodies are bytes.
        body: vec![0xff, 0x00, n as u8, 0xfe],
        content_type: "application/octet-stream".into(),
        headers,
    }
}

// ---------------------------------------------------------------------------------------------
// The seam

fn values_round_trip(db: &Db) {
    let t = db.table("vals");
    let mut conn = db.connect();
    let d = conn.dialect();
    let bytes = match d {
        acemq_amqp::sql::Dialect::Sqlite => "BLOB",
        acemq_amqp::sql::Dialect::Postgres => "BYTEA",
        acemq_amqp::sql::Dialect::Mysql => "LONGBLOB",
    };
    conn.execute(
        &format!("CREATE TABLE {t} (i BIGINT, s TEXT, b {bytes}, n TEXT)"),
        &[],
    )
    .unwrap();
    let ph: Vec<String> = (1..=4).map(|n| d.placeholder(n)).collect();
    let changed = conn
        .execute(
            &format!("INSERT INTO {t} (i, s, b, n) VALUES ({})", ph.join(", ")),
            &[
                Value::Integer(-7),
                Value::Text("héllo".into()),
                Value::Bytes(vec![0, 255, 1]),
                Value::Null,
            ],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let rows = conn
        .query(
            &format!("SELECT i, s, b, n FROM {t} WHERE i = {}", ph[0]),
            &[Value::Integer(-7)],
        )
        .unwrap();
    assert_eq!(
        rows,
        vec![vec![
            Value::Integer(-7),
            Value::Text("héllo".into()),
            Value::Bytes(vec![0, 255, 1]),
            Value::Null
        ]]
    );
    // A null parameter compared with an integer column.
    let null_safe = match d {
        acemq_amqp::sql::Dialect::Mysql => "<=>",
        _ => "IS NOT DISTINCT FROM",
    };
    let rows = conn
        .query(
            &format!("SELECT COUNT(*) FROM {t} WHERE n {null_safe} {}", ph[0]),
            &[Value::Null],
        )
        .unwrap();
    assert_eq!(rows[0][0], Value::Integer(1));
}

fn create_schema_and_ddl(db: &Db) {
    // Custom names through create_schema.
    let tables = [
        Table::Idempotency(db.table("ci")),
        Table::Outbox(db.table("co")),
        Table::Schemas(db.table("cs")),
    ];
    let mut conn = db.connect();
    create_schema(&mut *conn, &tables).unwrap();
    create_schema(&mut *conn, &tables).unwrap(); // idempotent
    for t in &tables {
        assert_eq!(db.count(t.name()), 0);
    }
    // The DDL for migration tools runs as printed (on PostgreSQL inside a rolled-back
    // transaction, so the default tables are not left behind in the shared database).
    let dialect = conn.dialect();
    let ddl = schema_ddl(dialect);
    let statements: Vec<&str> = ddl.split(";\n").filter(|s| !s.trim().is_empty()).collect();
    // Three tables, and on SQLite and PostgreSQL the idempotency table's index (MySQL's is in
    // its table's statement).
    assert!(statements.len() >= 3);
    match db.backend {
        Backend::Sqlite => {
            for s in &statements {
                conn.execute(s, &[]).unwrap();
            }
            let rows = conn
                .query(
                    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN \
                     ('acemq_idempotency', 'acemq_outbox', 'acemq_schemas')",
                    &[],
                )
                .unwrap();
            assert_eq!(rows[0][0], Value::Integer(3));
        }
        Backend::Postgres => db.in_tx(false, |tx| {
            for s in &statements {
                tx.execute(s, &[]).unwrap();
            }
            let rows = tx
                .query(
                    "SELECT COUNT(*)::bigint FROM information_schema.tables WHERE table_name IN \
                     ('acemq_idempotency', 'acemq_outbox', 'acemq_schemas')",
                    &[],
                )
                .unwrap();
            assert_eq!(rows[0][0], Value::Integer(3));
        }),
        // MySQL commits DDL at once: the statements run under this test's own names.
        Backend::Mysql => {
            let names = [
                ("acemq_idempotency", db.table("ddl_i")),
                ("acemq_outbox", db.table("ddl_o")),
                ("acemq_schemas", db.table("ddl_s")),
            ];
            for s in &statements {
                let mut s = s.to_string();
                for (from, to) in &names {
                    s = s.replace(from, to);
                }
                conn.execute(&s, &[]).unwrap();
            }
            let rows = conn
                .query(
                    &format!(
                        "SELECT COUNT(*) FROM information_schema.tables WHERE \
                         table_schema = DATABASE() AND engine = 'InnoDB' AND \
                         table_name IN ('{}', '{}', '{}')",
                        names[0].1, names[1].1, names[2].1
                    ),
                    &[],
                )
                .unwrap();
            assert_eq!(rows[0][0], Value::Integer(3));
        }
    }
}

fn invalid_table_names_refused(db: &Db) {
    for bad in [
        "orders; DROP TABLE x",
        "1abc",
        "",
        "a-b",
        "tâble",
        &"t".repeat(64),
    ] {
        let check = |r: Result<(), Error>| match r {
            Err(Error::InvalidName { kind, name, reason }) => {
                assert_eq!(kind, "table");
                assert!(bad.starts_with(&name) || name.len() <= bad.len());
                assert!(!reason.is_empty());
            }
            other => panic!("{bad:?} accepted: {other:?}"),
        };
        check(
            SqlIdempotencyStore::open(
                db.factory(),
                SqlIdempotencyStoreOptions::default().table(bad),
            )
            .map(drop),
        );
        check(
            SqlOutboxStore::open(db.factory(), SqlOutboxStoreOptions::default().table(bad))
                .map(drop),
        );
        check(
            SqlSchemaRegistry::new(db.factory(), SqlSchemaRegistryOptions::new().table(bad))
                .map(drop),
        );
        check(create_schema(
            &mut *db.connect(),
            &[Table::Outbox(bad.to_owned())],
        ));
    }
    let e = SqlOutboxStore::open(db.factory(), SqlOutboxStoreOptions::default().table("x y"))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid table name \"x y\": only ASCII letters, digits and '_' are allowed"
    );
}

fn database_error_has_source(db: &Db) {
    // A table that was never created.
    let table = db.table("missing");
    let store = SqlIdempotencyStore::open(
        db.factory(),
        SqlIdempotencyStoreOptions::default().table(&table),
    )
    .unwrap();
    let e = store.claim("k").unwrap_err();
    match &e {
        Error::Sql { context, .. } => assert!(context.contains(&table), "{context}"),
        other => panic!("expected Error::Sql, got {other:?}"),
    }
    let source = std::error::Error::source(&e).expect("a source");
    match db.backend {
        Backend::Sqlite => assert!(source.downcast_ref::<rusqlite::Error>().is_some()),
        Backend::Postgres => {
            let pg = source
                .downcast_ref::<postgres::Error>()
                .expect("postgres error");
            assert_eq!(pg.code(), Some(&postgres::error::SqlState::UNDEFINED_TABLE));
        }
        Backend::Mysql => match source.downcast_ref::<mysql::Error>() {
            // ER_NO_SUCH_TABLE
            Some(mysql::Error::MySqlError(e)) => assert_eq!(e.code, 1146, "{e}"),
            other => panic!("expected the server's error, got {other:?}"),
        },
    }
    assert!(e.to_string().contains(&table));
    let outbox =
        SqlOutboxStore::open(db.factory(), SqlOutboxStoreOptions::default().table(&table)).unwrap();
    assert!(matches!(outbox.pending(1), Err(Error::Sql { .. })));
}

// ---------------------------------------------------------------------------------------------
// Idempotency

fn claimed(c: Claim) -> ClaimToken {
    match c {
        Claim::Claimed(token) => token,
        other => panic!("expected a claim, got {other:?}"),
    }
}

fn idem_round_trip(db: &Db) {
    let (store, _) = idem(db);
    assert!(store.supports_claims());
    let a = claimed(store.claim("a").unwrap());
    assert_eq!(store.claim("a").unwrap(), Claim::InProgress);
    store.confirm("a", &a).unwrap();
    assert_eq!(store.claim("a").unwrap(), Claim::Duplicate);
    assert!(!store.first_time("a").unwrap());
    // release never deletes a receipt
    store.release("a", &a).unwrap();
    assert_eq!(store.claim("a").unwrap(), Claim::Duplicate);
    // forget (an operator's, by key alone) lets the next claim run
    store.forget("a").unwrap();
    let a2 = claimed(store.claim("a").unwrap());
    assert_ne!(a, a2, "each claim has its own token");
    // release of the holder's in-progress claim (the work failed) lets the next claim run
    store.release("a", &a2).unwrap();
    assert!(store.claim("a").unwrap().is_claimed());
    // first_time records and answers
    assert!(store.first_time("b").unwrap());
    assert!(!store.first_time("b").unwrap());
    assert_eq!(store.claim("b").unwrap(), Claim::Duplicate);
    // keys are independent
    assert!(store.claim("c").unwrap().is_claimed());
    assert!(store.claim("d").unwrap().is_claimed());
}

fn idem_claim_race(db: &Db) {
    let (store, _) = idem(db);
    // The factory opens a new connection per call: 8 threads, 8 connections.
    let store = Arc::new(store);
    for round in 0..3 {
        let key = format!("race-{round}");
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (store, barrier, key) = (store.clone(), barrier.clone(), key.clone());
                thread::spawn(move || {
                    barrier.wait();
                    store.claim(&key).unwrap()
                })
            })
            .collect();
        let outcomes: Vec<Claim> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let claimed = outcomes.iter().filter(|c| c.is_claimed()).count();
        assert_eq!(claimed, 1, "{outcomes:?}");
        assert!(outcomes
            .iter()
            .all(|c| matches!(c, Claim::Claimed(_) | Claim::InProgress)));
    }
}

fn idem_claim_race_on_transactions(db: &Db) {
    // Four separate connections, each claiming inside its own transaction and committing.
    let (store, _) = idem(db);
    let barrier = Barrier::new(4);
    let outcomes: Vec<Claim> = thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    // SQLite's BEGIN IMMEDIATE takes the write lock: meet before it.
                    barrier.wait();
                    db.in_tx(true, |tx| store.claim_in(tx, "tx-race").unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        outcomes.iter().filter(|c| c.is_claimed()).count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(store.claim("tx-race").unwrap(), Claim::InProgress);
}

fn idem_lease_take_over(db: &Db) {
    // Two seconds: the checks made while the lease holds must not see it run out on a busy
    // machine.
    let lease = Duration::from_secs(2);
    let (store, _) = idem_with(db, "lease", |o| o.claim_timeout(lease));
    let first = std::time::Instant::now();
    assert!(store.claim("k").unwrap().is_claimed());
    assert_eq!(store.claim("k").unwrap(), Claim::InProgress);
    // The first worker is presumed dead once its lease ran out, not before: a claim then takes
    // over.
    let mut second = None;
    let taken = support::eventually(Duration::from_secs(20), || {
        match store.claim("k").unwrap() {
            Claim::InProgress => false,
            c => {
                second = Some(claimed(c));
                true
            }
        }
    });
    assert!(taken, "no claim took over once the lease ran out");
    assert!(
        first.elapsed() >= lease - Duration::from_millis(200),
        "taken over {:?} into a lease of {lease:?}",
        first.elapsed()
    );
    let second = second.unwrap();
    assert_eq!(store.claim("k").unwrap(), Claim::InProgress);
    store.confirm("k", &second).unwrap();
    // A confirmation is not a lease: past a lease's length (time passing is what is checked
    // here) it holds for the retention (24 h by default).
    thread::sleep(lease + Duration::from_millis(100));
    assert_eq!(store.claim("k").unwrap(), Claim::Duplicate);
}

/// A store whose claims are leased for 1 s, with `k` claimed by A, then (in progress while A's
/// lease holds) taken over by B once it ran out (within 20 s): the store, A's and B's tokens.
fn a_claim_taken_over(db: &Db) -> (SqlIdempotencyStore, ClaimToken, ClaimToken) {
    let (store, _) = idem_with(db, "fence", |o| o.claim_timeout(Duration::from_secs(1)));
    let a = claimed(store.claim("k").unwrap());
    let mut b = None;
    assert!(support::eventually(Duration::from_secs(20), || {
        b = store.claim("k").unwrap().token().cloned();
        b.is_some()
    }));
    (store, a, b.unwrap())
}

/// A's lease runs out mid-handler, B takes the key over, A confirms, B fails and gives its claim
/// back: A's receipt survives, so the next delivery is a duplicate.
fn idem_taken_over_claim_keeps_the_first_holders_receipt(db: &Db) {
    let (store, a, b) = a_claim_taken_over(db);
    assert_ne!(a, b);
    store.confirm("k", &a).unwrap(); // A finished its work
    store.release("k", &b).unwrap(); // B failed
    assert_eq!(
        store.claim("k").unwrap(),
        Claim::Duplicate,
        "A's receipt survived B's failure"
    );
    // B finishing after all changes nothing either.
    store.confirm("k", &b).unwrap();
    assert_eq!(store.claim("k").unwrap(), Claim::Duplicate);
}

/// A's lease runs out, B takes the key over, A fails: A's give-back must not delete B's claim.
fn idem_stale_holder_cannot_forget_the_new_holders_claim(db: &Db) {
    let (store, a, b) = a_claim_taken_over(db);
    store.release("k", &a).unwrap(); // A failed
    assert_eq!(
        store.claim("k").unwrap(),
        Claim::InProgress,
        "B still holds the key"
    );
    store.confirm("k", &b).unwrap();
    assert_eq!(store.claim("k").unwrap(), Claim::Duplicate);
}

fn idem_retention_and_purge(db: &Db) {
    let (store, table) = idem_with(db, "ret", |o| {
        o.claim_timeout(Duration::from_secs(60))
            .retention(Duration::from_secs(3))
    });
    assert!(store.first_time("old").unwrap());
    assert!(store.claim("live").unwrap().is_claimed());
    // Time itself is what this test is about: "old" must be past its retention, and "new"
    // (written next) must still be inside its own 3 s when the purge runs, however busy the
    // machine is between the two.
    let written = std::time::Instant::now();
    while written.elapsed() < Duration::from_millis(3100) {
        thread::sleep(Duration::from_millis(50));
    }
    assert!(store.first_time("new").unwrap());
    assert_eq!(db.count(&table), 3);
    // Past retention "old" is gone for purge, and counts as new for claims.
    assert_eq!(store.purge_expired().unwrap(), 1);
    assert_eq!(db.count(&table), 2);
    assert!(store.claim("old").unwrap().is_claimed());
    assert_eq!(store.claim("live").unwrap(), Claim::InProgress);
    assert!(!store.first_time("new").unwrap());
}

/// The guarded retention's store call (`patterns::retention`): receipts confirmed at or before
/// the cutoff go, younger ones and live claims stay.
fn idem_purge_confirmed_before_keeps_the_younger(db: &Db) {
    let (store, table) = idem(db);
    assert!(store.first_time("a").unwrap());
    assert!(store.first_time("b").unwrap());
    assert!(store.claim("live").unwrap().is_claimed());
    let now = acemq_amqp::now_ms();
    assert_eq!(store.purge_confirmed_before(now - 3_600_000).unwrap(), 0);
    assert_eq!(db.count(&table), 3);
    assert_eq!(store.purge_confirmed_before(now + 60_000).unwrap(), 2);
    assert_eq!(db.count(&table), 1, "the live claim stays");
    assert_eq!(store.claim("live").unwrap(), Claim::InProgress);
}

/// Retired outbox records before the cutoff go; pending ones never do.
fn outbox_purge_retired_before_keeps_the_pending(db: &Db) {
    let table = db.table("ret_outbox");
    let store = outbox_with(db, &table, |o| o.max_attempts(1));
    let ids: Vec<i64> = (0..2)
        .map(|n| db.in_tx(true, |tx| store.add(tx, &record(n)).unwrap()))
        .collect();
    store.record_failure(ids[0], "broker said no").unwrap();
    assert_eq!(store.retired().unwrap().len(), 1);
    let now = acemq_amqp::now_ms();
    assert_eq!(store.purge_retired_before(now - 3_600_000).unwrap(), 0);
    assert_eq!(store.purge_retired_before(now + 60_000).unwrap(), 1);
    assert_eq!(db.count(&table), 1, "the pending record stays");
    assert!(store.retired().unwrap().is_empty());
}

fn idem_transactional(db: &Db) {
    let (store, table) = idem(db);
    // Rolled back: neither claim nor receipt survives.
    let inside = db.in_tx(false, |tx| {
        let c = store.claim_in(tx, "k").unwrap();
        store.confirm_in(tx, "k", c.token().unwrap()).unwrap();
        c
    });
    assert!(inside.is_claimed());
    assert_eq!(db.count(&table), 0);
    // Committed: the receipt commits with the work. (MySQL commits a `CREATE TABLE` at once:
    // there the work is an insert into a table made before.)
    let work = db.table("work");
    if db.backend == Backend::Mysql {
        db.connect()
            .execute(&format!("CREATE TABLE {work} (x BIGINT)"), &[])
            .unwrap();
    }
    db.in_tx(true, |tx| {
        let token = claimed(store.claim_in(tx, "k").unwrap());
        let statement = match db.backend {
            Backend::Mysql => format!("INSERT INTO {work} (x) VALUES (1)"),
            _ => format!("CREATE TABLE {work} (x BIGINT)"),
        };
        tx.execute(&statement, &[]).unwrap();
        store.confirm_in(tx, "k", &token).unwrap();
    });
    assert_eq!(store.claim("k").unwrap(), Claim::Duplicate);
    db.in_tx(true, |tx| {
        assert_eq!(store.claim_in(tx, "k").unwrap(), Claim::Duplicate);
    });
}

// ---------------------------------------------------------------------------------------------
// Outbox

fn outbox_rollback_then_commit(db: &Db) {
    let table = db.table("ob");
    let store = outbox(db, &table);
    let id = db.in_tx(false, |tx| store.add(tx, &record(1)).unwrap());
    assert!(id > 0);
    // Then look: nothing there.
    assert_eq!(db.count(&table), 0);
    assert!(store.pending(10).unwrap().is_empty());

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let id = db.in_tx(true, |tx| store.add(tx, &record(2)).unwrap());
    assert_eq!(db.count(&table), 1);
    let pending = store.pending(10).unwrap();
    assert_eq!(pending.len(), 1);
    let r = &pending[0];
    let want = record(2);
    assert_eq!(r.id, id);
    assert_eq!(r.exchange, want.exchange);
    assert_eq!(r.routing_key, want.routing_key);
    assert_eq!(r.body, want.body);
    assert_eq!(r.content_type, want.content_type);
    assert_eq!(r.headers, want.headers);
    assert_eq!(r.attempts, 0);
    assert_eq!(r.last_error, None);
    assert!(r.created_ms >= before - 5 && r.created_ms <= before + 60_000);
    store.mark_published(id).unwrap();
    assert_eq!(db.count(&table), 0);
}

fn outbox_refuses_autocommit(db: &Db) {
    let table = db.table("ob");
    let store = outbox(db, &table);
    let mut conn = db.connect();
    match store.add(&mut *conn, &record(1)) {
        Err(Error::InvalidArgument { reason }) => {
            assert!(reason.contains("transaction"), "{reason}")
        }
        other => panic!("add without a transaction: {other:?}"),
    }
    assert_eq!(db.count(&table), 0);
    // The caller's transaction is never committed by add: after add, it is still open.
    db.in_tx(false, |tx| {
        store.add(tx, &record(1)).unwrap();
        assert_eq!(tx.in_transaction(), Some(true));
    });
    assert_eq!(db.count(&table), 0);
}

fn outbox_order_failures_retirement_release(db: &Db) {
    let table = db.table("ob");
    let store = outbox_with(db, &table, |o| o.max_attempts(2));
    let ids: Vec<i64> = db.in_tx(true, |tx| {
        (0..5).map(|n| store.add(tx, &record(n)).unwrap()).collect()
    });
    assert!(ids.windows(2).all(|w| w[0] < w[1]));

    // Insertion order, limited.
    let first = store.pending(2).unwrap();
    assert_eq!(first.iter().map(|r| r.id).collect::<Vec<_>>(), ids[..2]);
    assert_eq!(first[1].routing_key, "order.1");
    // Leased rows are not offered again to anyone while the lease holds.
    let rest = store.pending(10).unwrap();
    assert_eq!(rest.iter().map(|r| r.id).collect::<Vec<_>>(), ids[2..]);
    assert!(store.pending(10).unwrap().is_empty());

    // A failure counts, keeps the error and ends the lease.
    store.record_failure(ids[0], "nacked").unwrap();
    let again = store.pending(10).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, ids[0]);
    assert_eq!(again[0].attempts, 1);
    assert_eq!(again[0].last_error.as_deref(), Some("nacked"));
    assert!(store.retired().unwrap().is_empty());

    // The second failure reaches max_attempts: retired, kept, not offered.
    store.record_failure(ids[0], "unroutable").unwrap();
    assert!(store.pending(10).unwrap().is_empty());
    let retired = store.retired().unwrap();
    assert_eq!(retired.len(), 1);
    assert_eq!(retired[0].id, ids[0]);
    assert_eq!(retired[0].attempts, 2);
    assert_eq!(retired[0].last_error.as_deref(), Some("unroutable"));
    assert_eq!(db.count(&table), 5);

    // Release puts it back in play.
    store.release(ids[0]).unwrap();
    assert!(store.retired().unwrap().is_empty());
    let back = store.pending(10).unwrap();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].id, ids[0]);
    assert_eq!(back[0].attempts, 0);

    for id in &ids {
        store.mark_published(*id).unwrap();
    }
    store.mark_published(ids[0]).unwrap(); // unknown id: fine
    assert_eq!(db.count(&table), 0);
}

fn outbox_two_relays_never_share(db: &Db) {
    let table = db.table("ob");
    let a = Arc::new(outbox(db, &table));
    let b = Arc::new(
        SqlOutboxStore::open(db.factory(), SqlOutboxStoreOptions::default().table(&table)).unwrap(),
    );
    assert_ne!(a.owner(), b.owner());
    let n = 60;
    db.in_tx(true, |tx| {
        for i in 0..n {
            a.add(tx, &record(i)).unwrap();
        }
    });
    let barrier = Arc::new(Barrier::new(2));
    let relay = |store: Arc<SqlOutboxStore>, barrier: Arc<Barrier>| {
        thread::spawn(move || {
            barrier.wait();
            let mut got = Vec::new();
            // Bounded, so that a store that re-offers leased rows fails instead of hanging.
            for _ in 0..100 {
                let batch = store.pending(3).unwrap();
                if batch.is_empty() {
                    break;
                }
                let ids: Vec<i64> = batch.iter().map(|r| r.id).collect();
                assert!(ids.windows(2).all(|w| w[0] < w[1]));
                got.extend(ids);
            }
            got
        })
    };
    let ha = relay(a.clone(), barrier.clone());
    let hb = relay(b.clone(), barrier);
    let (got_a, got_b) = (ha.join().unwrap(), hb.join().unwrap());
    let sa: HashSet<i64> = got_a.iter().copied().collect();
    let sb: HashSet<i64> = got_b.iter().copied().collect();
    assert_eq!(sa.len(), got_a.len(), "relay a got a row twice");
    assert_eq!(sb.len(), got_b.len(), "relay b got a row twice");
    assert!(
        sa.is_disjoint(&sb),
        "both relays got {:?}",
        sa.intersection(&sb)
    );
    assert_eq!(sa.len() + sb.len(), n);
}

fn outbox_lease_expiry_reoffers(db: &Db) {
    // Two seconds: b must not see a's lease run out while it is checked on a busy machine.
    let lease = Duration::from_secs(2);
    let table = db.table("ob");
    let short = |_: ()| {
        SqlOutboxStore::open(
            db.factory(),
            SqlOutboxStoreOptions::default().table(&table).lease(lease),
        )
        .unwrap()
    };
    let a = short(());
    a.create_table().unwrap();
    let b = short(());
    let id = db.in_tx(true, |tx| a.add(tx, &record(7)).unwrap());
    let leased = std::time::Instant::now();
    assert_eq!(a.pending(10).unwrap().len(), 1);
    assert!(b.pending(10).unwrap().is_empty());
    // Relay a died holding the lease: once it runs out, not before, b is offered the record.
    let mut got = Vec::new();
    let offered = support::eventually(Duration::from_secs(20), || {
        got = b.pending(10).unwrap();
        !got.is_empty()
    });
    assert!(
        offered,
        "the record was not offered to b once a's lease ran out"
    );
    assert!(
        leased.elapsed() >= lease - Duration::from_millis(200),
        "offered {:?} into a lease of {lease:?}",
        leased.elapsed()
    );
    assert_eq!(got.iter().map(|r| r.id).collect::<Vec<_>>(), vec![id]);
    assert!(a.pending(10).unwrap().is_empty());
}

/// The relay's one-commit step: the published batch goes, the next is leased; a published
/// record whose lease already ran out is deleted, never leased again by the same call.
fn outbox_delete_and_lease_in_one_step(db: &Db) {
    let table = db.table("obdl");
    let a = outbox(db, &table);
    let ids: Vec<i64> = db.in_tx(true, |tx| {
        (0..30).map(|n| a.add(tx, &record(n)).unwrap()).collect()
    });
    let first = a.pending(10).unwrap();
    assert_eq!(first.iter().map(|r| r.id).collect::<Vec<_>>(), ids[..10]);
    let published: Vec<i64> = first.iter().map(|r| r.id).collect();
    let second = a.mark_published_and_lease(&published, 10).unwrap();
    assert_eq!(second.iter().map(|r| r.id).collect::<Vec<_>>(), ids[10..20]);
    assert_eq!(db.count(&table), 20, "the published batch is gone");
    assert_eq!(a.stats().unwrap().pending, 20);

    // Leases of 1 ms: by the time the batch is confirmed they have run out, so the lease half
    // of the step could pick the very records its delete half removes.
    let expired_table = db.table("obdl2");
    let c = outbox_with(db, &expired_table, |o| o.lease(Duration::from_millis(1)));
    let mine: Vec<i64> = db.in_tx(true, |tx| {
        (0..5).map(|n| c.add(tx, &record(n)).unwrap()).collect()
    });
    let leased: Vec<i64> = c.pending(5).unwrap().iter().map(|r| r.id).collect();
    assert_eq!(leased, mine);
    let now = db.connect().dialect().now_ms_sql();
    let expired = format!("SELECT COUNT(*) FROM {expired_table} WHERE lease_until_ms <= {now}");
    assert!(support::eventually(Duration::from_secs(10), || {
        db.connect().query(&expired, &[]).unwrap()[0][0].as_i64() == Some(5)
    }));
    let next = c.mark_published_and_lease(&leased, 10).unwrap();
    assert!(
        next.is_empty(),
        "a deleted record was leased: {:?}",
        next.iter().map(|r| r.id).collect::<Vec<_>>()
    );
    assert_eq!(db.count(&expired_table), 0);
}

/// The table's counters from `pg_stat_user_tables`: sequential scans, rows inserted, updated
/// and deleted.
fn pg_table_stats(table: &str) -> (i64, i64, i64, i64) {
    let rows = db::pg_client()
        .query(
            "SELECT seq_scan, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables \
             WHERE relname = $1",
            &[&table],
        )
        .unwrap();
    rows.first()
        .map_or((0, 0, 0, 0), |r| (r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// A backlog of a few thousand records on PostgreSQL, analyzed (as autovacuum soon does):
/// leasing a batch (alone, and in the relay's delete-and-lease step) finds its rows by the
/// primary key. Before, the planner ran the lease's `id IN (SELECT …)` as a hash join over a
/// sequential scan of the whole table: every batch read every pending row, which cost the
/// relay more than its publishing.
#[test]
fn leasing_from_a_postgres_outbox_of_thousands_never_scans_the_whole_table() {
    let db = Db::postgres();
    let table = db.table("obscan");
    let store = outbox(&db, &table);
    db.in_tx(true, |tx| {
        for n in 0..3000 {
            store.add(tx, &record(n)).unwrap();
        }
    });
    db.connect()
        .execute(&format!("ANALYZE {table}"), &[])
        .unwrap();
    // Each store call runs on a connection of its own, whose server process reports its
    // counters when it exits: wait for the inserts to show, then read where the count starts.
    assert!(
        support::eventually(Duration::from_secs(30), || pg_table_stats(&table).1 == 3000),
        "the inserts never showed in pg_stat_user_tables: {:?}",
        pg_table_stats(&table)
    );
    let (scans_before, ..) = pg_table_stats(&table);

    let mut batch: Vec<i64> = store.pending(100).unwrap().iter().map(|r| r.id).collect();
    for _ in 0..10 {
        assert_eq!(batch.len(), 100);
        batch = store
            .mark_published_and_lease(&batch, 100)
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
    }
    // 11 leases of 100 rows and 10 deletes of 100, every call's counters reported.
    assert!(
        support::eventually(Duration::from_secs(30), || {
            let (_, _, updated, deleted) = pg_table_stats(&table);
            updated >= 1100 && deleted >= 1000
        }),
        "the leases never showed in pg_stat_user_tables: {:?}",
        pg_table_stats(&table)
    );
    let (scans_after, ..) = pg_table_stats(&table);
    assert_eq!(
        scans_after - scans_before,
        0,
        "leasing 11 batches scanned the whole outbox table {} times",
        scans_after - scans_before
    );
}

// ---------------------------------------------------------------------------------------------
// Schema registry

fn registry_round_trip(db: &Db) {
    let table = db.table("sch");
    let reg = SqlSchemaRegistry::new(db.factory(), SqlSchemaRegistryOptions::new().table(&table))
        .unwrap();
    reg.create_table().unwrap();
    let v1 = reg
        .register("orders", "json-schema", "{\"type\":\"object\"}")
        .unwrap();
    assert_eq!(v1.version, 1);
    assert_eq!(v1.subject, "orders");
    assert_eq!(v1.format, "json-schema");
    assert_eq!(
        v1.fingerprint,
        "a2c799262a3ce3c19ef5cdd983bf3d12b43ab3c426227091b909dcb7054738c0"
    );
    // Same bytes: the existing schema.
    assert_eq!(
        reg.register("orders", "json-schema", "{\"type\":\"object\"}")
            .unwrap(),
        v1
    );
    // Different bytes (whitespace counts): a new version.
    let v2 = reg
        .register("orders", "json-schema", "{ \"type\": \"object\" }")
        .unwrap();
    assert_eq!(v2.version, 2);
    assert_ne!(v2.id, v1.id);
    // Another subject starts at 1.
    let other = reg
        .register("payments", "json-schema", "{\"type\":\"object\"}")
        .unwrap();
    assert_eq!(other.version, 1);
    assert_ne!(other.id, v1.id);

    assert_eq!(reg.by_id(v1.id).unwrap(), v1);
    assert_eq!(reg.by_id(v2.id).unwrap(), v2);
    assert_eq!(reg.latest("orders").unwrap(), v2);
    assert_eq!(
        reg.versions("orders").unwrap(),
        vec![v1.clone(), v2.clone()]
    );
    assert!(reg.versions("nobody").unwrap().is_empty());
    assert!(matches!(
        reg.by_id(v2.id + 1000),
        Err(Error::SchemaNotFound { .. })
    ));
    match reg.latest("nobody") {
        Err(Error::SchemaNotFound { what }) => assert!(what.contains("nobody")),
        other => panic!("{other:?}"),
    }
    // Same bytes, another format: refused rather than silently merged.
    assert!(matches!(
        reg.register("orders", "avro", "{\"type\":\"object\"}"),
        Err(Error::InvalidArgument { .. })
    ));
    // A second registry on the same table sees the same schemas.
    let reg2 = SqlSchemaRegistry::new(db.factory(), SqlSchemaRegistryOptions::new().table(&table))
        .unwrap();
    assert_eq!(reg2.latest("orders").unwrap(), v2);
}

fn registry_concurrent_agree(db: &Db) {
    let table = db.table("sch");
    let first = SqlSchemaRegistry::new(db.factory(), SqlSchemaRegistryOptions::new().table(&table))
        .unwrap();
    first.create_table().unwrap();
    for round in 0..5 {
        let subject = format!("subject-{round}");
        let barrier = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let reg = SqlSchemaRegistry::new(
                    db.factory(),
                    SqlSchemaRegistryOptions::new().table(&table),
                )
                .unwrap();
                let (barrier, subject) = (barrier.clone(), subject.clone());
                thread::spawn(move || {
                    barrier.wait();
                    reg.register(&subject, "json-schema", "{\"type\":\"object\"}")
                        .unwrap()
                })
            })
            .collect();
        let got: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(got.iter().all(|s| *s == got[0]), "{got:?}");
        assert_eq!(got[0].version, 1);
        assert_eq!(first.versions(&subject).unwrap().len(), 1);
    }
}

// ---------------------------------------------------------------------------------------------
// Every database alike (issue 51 item 3: MySQL beside SQLite and PostgreSQL)

/// Keys that differ only in case or in bytes past ASCII stay distinct keys (on MySQL the
/// tables' binary collation: a default collation there would make `Order-1` a duplicate of
/// `order-1`).
fn idem_keys_are_compared_exactly(db: &Db) {
    let (store, _) = idem(db);
    for key in ["Order-1", "order-1", "ORDER-1", "order-ı", "order-i"] {
        assert!(
            store.first_time(key).unwrap(),
            "{key} was taken for another key"
        );
    }
    assert!(!store.first_time("Order-1").unwrap());
}

/// A group commit's claims and confirms (the batch statements: one upsert for the group's
/// claims, one update for its confirms) from many threads: every key is claimed exactly once,
/// every confirm holds, a duplicate is absorbed.
fn idem_group_commit_claims_each_key_once(db: &Db) {
    let table = db.table("group");
    let store = Arc::new(
        SqlIdempotencyStore::open(
            db.factory(),
            SqlIdempotencyStoreOptions::default()
                .table(&table)
                .group_commit(true),
        )
        .unwrap(),
    );
    store.create_table().unwrap();
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let (store, barrier) = (store.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let mut mine = Vec::new();
                // Every thread asks for the same 20 keys, in its own order.
                for i in 0..20 {
                    let key = format!("k{}", (i * 7 + t * 3) % 20);
                    if let Claim::Claimed(token) = store.claim(&key).unwrap() {
                        store.confirm(&key, &token).unwrap();
                        mine.push(key);
                    }
                }
                mine
            })
        })
        .collect();
    let mut all: Vec<String> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort();
    let distinct: HashSet<&String> = all.iter().collect();
    assert_eq!(
        distinct.len(),
        all.len(),
        "a key was claimed twice: {all:?}"
    );
    assert_eq!(all.len(), 20, "{all:?}");
    for i in 0..20 {
        assert_eq!(store.claim(&format!("k{i}")).unwrap(), Claim::Duplicate);
    }
    assert_eq!(db.count(&table), 20);
}

/// A body and headers past 64 KiB (MySQL's `BLOB` and `TEXT`) come back whole.
fn outbox_large_record_round_trips(db: &Db) {
    let table = db.table("big");
    let store = outbox(db, &table);
    let mut big = record(1);
    big.body = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    big.headers
        .insert("note".into(), serde_json::json!("é".repeat(40_000)));
    let id = db.in_tx(true, |tx| store.add(tx, &big).unwrap());
    let got = store.pending(1).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, id);
    assert_eq!(got[0].body, big.body);
    assert_eq!(got[0].headers, big.headers);
}

/// A lease is renewed by its holder only, and only while it holds it.
fn outbox_renewed_only_by_its_holder(db: &Db) {
    let table = db.table("renew");
    let short = || {
        SqlOutboxStore::open(
            db.factory(),
            SqlOutboxStoreOptions::default()
                .table(&table)
                .lease(Duration::from_millis(600)),
        )
        .unwrap()
    };
    let (a, b) = (short(), short());
    a.create_table().unwrap();
    let ids: Vec<i64> = db.in_tx(true, |tx| {
        (0..3).map(|n| a.add(tx, &record(n)).unwrap()).collect()
    });
    let leased: Vec<i64> = a.pending(2).unwrap().iter().map(|r| r.id).collect();
    assert_eq!(leased, ids[..2]);
    let mut renewed = a.renew(&ids).unwrap();
    renewed.sort_unstable();
    assert_eq!(renewed, ids[..2], "only the leases a holds");
    assert!(b.renew(&ids).unwrap().is_empty(), "b holds none of them");
    // a's leases run out and b takes them (the third was never leased): a renews nothing.
    let mut taken: Vec<i64> = Vec::new();
    let all = acemq_amqp::testing::wait_until(Duration::from_secs(20), || {
        taken.extend(b.pending(10).unwrap().iter().map(|r| r.id));
        taken.sort_unstable();
        // b's own leases run out too and it takes them again: each id once.
        taken.dedup();
        taken == ids
    });
    assert!(all.is_ok(), "b took {taken:?} of {ids:?}");
    assert!(a.renew(&ids).unwrap().is_empty());
}

/// The generic batch store: a new message's effect and its receipt commit together, a replay
/// returns the recorded outcome, and a failing effect rolls the whole batch back — no effect,
/// no receipt.
fn batch_store_commits_effects_with_their_receipts(db: &Db) {
    let receipts = db.table("rcpt");
    let effects = db.table("eff");
    db.connect()
        .execute(
            &format!(
                "CREATE TABLE {effects} (id VARCHAR(200) NOT NULL, body {})",
                match db.backend {
                    Backend::Sqlite => "BLOB",
                    Backend::Postgres => "BYTEA",
                    Backend::Mysql => "LONGBLOB",
                }
            ),
            &[],
        )
        .unwrap();
    let insert = effects.clone();
    let effect = move |tx: &mut dyn Sql, m: &AckMessage| {
        if m.payload == b"refuse" {
            return Err(Error::InvalidArgument {
                reason: "refused on purpose".into(),
            });
        }
        let d = tx.dialect();
        tx.execute(
            &format!(
                "INSERT INTO {insert} (id, body) VALUES ({}, {})",
                d.placeholder(1),
                d.placeholder(2)
            ),
            &[m.identifier.as_str().into(), m.payload.clone().into()],
        )?;
        Ok(format!("stored {}", m.identifier))
    };
    let store = BatchStore::new(
        db.factory(),
        effect,
        BatchStoreOptions::new().table(&receipts),
    )
    .unwrap();
    store.create_table().unwrap();
    let (a, b) = (
        AckMessage::new("a", b"1".to_vec()),
        AckMessage::new("b", b"2".to_vec()),
    );
    let got = store.apply_batch(&[&a, &b, &a]).unwrap();
    assert!(!got[0].is_replay() && !got[1].is_replay());
    assert!(got[2].is_replay());
    assert_eq!(store.receipt("a").unwrap().as_deref(), Some("stored a"));
    // A batch with a refused message: nothing of it commits.
    let (c, bad) = (
        AckMessage::new("c", b"3".to_vec()),
        AckMessage::new("d", b"refuse".to_vec()),
    );
    assert!(store.apply_batch(&[&c, &bad]).is_err());
    assert_eq!(store.receipt("c").unwrap(), None);
    assert_eq!(db.count(&effects), 2);
    assert_eq!(db.count(&receipts), 2);
    // Replayed later: the effect ran once.
    assert!(store.apply_batch(&[&b]).unwrap()[0].is_replay());
    assert_eq!(db.count(&effects), 2);
}

on_every_database!(
    values_round_trip,
    create_schema_and_ddl,
    invalid_table_names_refused,
    database_error_has_source,
    idem_round_trip,
    idem_claim_race,
    idem_claim_race_on_transactions,
    idem_lease_take_over,
    idem_retention_and_purge,
    idem_purge_confirmed_before_keeps_the_younger,
    outbox_purge_retired_before_keeps_the_pending,
    idem_taken_over_claim_keeps_the_first_holders_receipt,
    idem_stale_holder_cannot_forget_the_new_holders_claim,
    idem_transactional,
    outbox_rollback_then_commit,
    outbox_refuses_autocommit,
    outbox_order_failures_retirement_release,
    outbox_two_relays_never_share,
    outbox_lease_expiry_reoffers,
    outbox_delete_and_lease_in_one_step,
    registry_round_trip,
    registry_concurrent_agree,
    dialect_now_is_the_database_clock_in_ms,
    idem_keys_are_compared_exactly,
    idem_group_commit_claims_each_key_once,
    outbox_large_record_round_trips,
    outbox_renewed_only_by_its_holder,
    batch_store_commits_effects_with_their_receipts,
);

#[test]
fn fingerprint_vectors() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/fingerprint.json"
    ))
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let def = case["definition"].as_str().unwrap();
        assert_eq!(
            fingerprint(def),
            case["sha256"].as_str().unwrap(),
            "{def:?}"
        );
    }
}

/// A connections factory written with `?` on driver calls: the driver's error becomes
/// `Error::Sql` with it as the source.
#[test]
fn driver_errors_convert_into_error_sql() {
    fn sqlite() -> acemq_amqp::Result<rusqlite::Connection> {
        let conn = rusqlite::Connection::open_in_memory()?;
        conn.execute_batch("NOT SQL")?;
        Ok(conn)
    }
    fn pg() -> acemq_amqp::Result<postgres::Client> {
        let mut client = db::pg_connect()?;
        client.batch_execute("NOT SQL")?;
        Ok(client)
    }
    match sqlite().map(drop).unwrap_err() {
        Error::Sql { source, .. } => assert!(source.downcast_ref::<rusqlite::Error>().is_some()),
        other => panic!("{other:?}"),
    }
    match pg().map(drop).unwrap_err() {
        Error::Sql { source, .. } => {
            let e = source.downcast_ref::<postgres::Error>().unwrap();
            assert!(e.as_db_error().is_some(), "{e:?}");
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Clock skew (issue 11, case 11): a host's clock does not decide a lease on PostgreSQL.
//
// A child process (this test binary again, `clock_skew_child`) runs under libfaketime with its
// clock shifted and takes a claim, a receipt or an outbox lease; the parent, on the real clock,
// then checks that the database's clock decided the deadline.

const CHILD_CLOCK: &str = "acemq-skew-child-clock-ms=";
/// How far the child's clock is shifted: ten minutes, far more than any lease used here.
const SKEW_MS: i64 = 10 * 60 * 1000;

fn epoch_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Runs `clock_skew_child` with `role` under `faketime`, its clock shifted by `offset_ms`, and
/// checks that the child's clock really was shifted. Fails (never skips) without `faketime`.
fn run_with_clock(offset_ms: i64, role: &str, table: &str, lease: Duration) {
    let before = epoch_ms();
    let spawned = std::process::Command::new("faketime")
        // -m: the multi-threaded library; the monotonic clock (Instant) stays true.
        .args(["-m", "--exclude-monotonic", "-f"])
        .arg(format!("{:+}s", offset_ms / 1000))
        .arg(std::env::current_exe().unwrap())
        .args([
            "clock_skew_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ACEMQ_SKEW_ROLE", role)
        .env("ACEMQ_SKEW_TABLE", table)
        .env("ACEMQ_SKEW_LEASE_MS", lease.as_millis().to_string())
        .output();
    let out = match spawned {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "the clock skew tests need libfaketime's `faketime` command, which is not \
             installed: `apt-get install faketime` (scripts/test installs it)"
        ),
        Err(e) => panic!("cannot run faketime: {e}"),
    };
    let after = epoch_ms();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the child ({role}, clock {offset_ms:+} ms) failed:\n{stdout}\n{stderr}"
    );
    let child_ms: i64 = stdout
        .split(CHILD_CLOCK)
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("the child did not report its clock:\n{stdout}\n{stderr}"));
    assert!(
        child_ms >= before + offset_ms - 1000 && child_ms <= after + offset_ms + 1000,
        "faketime did not shift the child's clock by {offset_ms} ms: child {child_ms}, \
         parent {before}..{after}"
    );
}

/// Runs in a child process under faketime (see `run_with_clock`).
#[test]
#[ignore = "run as a child process under faketime by the clock skew tests"]
fn clock_skew_child() {
    let Ok(role) = std::env::var("ACEMQ_SKEW_ROLE") else {
        return;
    };
    let table = std::env::var("ACEMQ_SKEW_TABLE").unwrap();
    let lease = Duration::from_millis(
        std::env::var("ACEMQ_SKEW_LEASE_MS")
            .unwrap()
            .parse()
            .unwrap(),
    );
    println!("{CHILD_CLOCK}{}", epoch_ms());
    match role.as_str() {
        "idempotency" => {
            let store = SqlIdempotencyStore::open(
                db::pg_connect,
                SqlIdempotencyStoreOptions::default()
                    .table(&table)
                    .claim_timeout(lease)
                    .retention(lease),
            )
            .unwrap();
            assert!(store.claim("live").unwrap().is_claimed());
            let token = claimed(store.claim("done").unwrap());
            store.confirm("done", &token).unwrap();
            assert!(store.first_time("seen").unwrap());
        }
        "outbox" => {
            let store = SqlOutboxStore::open(
                db::pg_connect,
                SqlOutboxStoreOptions::default().table(&table).lease(lease),
            )
            .unwrap();
            assert_eq!(
                store.pending(10).unwrap().len(),
                1,
                "the child leases the record"
            );
        }
        "receipts" => {
            let store = BatchStore::new(
                db::pg_connect,
                |_: &mut dyn Sql, _: &AckMessage| Ok("done".to_string()),
                BatchStoreOptions::new().table(&table),
            )
            .unwrap();
            let m = AckMessage::new("skew/1", b"{}".to_vec());
            assert!(!store.apply_batch(&[&m]).unwrap()[0].is_replay());
        }
        other => panic!("unknown role {other:?}"),
    }
}

/// `Dialect::now_ms_sql` reads the database's clock in epoch ms (here on this host's clock).
fn dialect_now_is_the_database_clock_in_ms(db: &Db) {
    let mut conn = db.connect();
    let d = conn.dialect();
    let before = epoch_ms();
    let rows = conn
        .query(&format!("SELECT {}", d.now_ms_sql()), &[])
        .unwrap();
    let after = epoch_ms();
    let now = rows[0][0].as_i64().expect("an integer");
    assert!(
        now >= before - 1000 && now <= after + 1000,
        "{d}: {before} <= {now} <= {after}"
    );
}

/// For each row of `table`, how many ms `column` lies ahead of the database's clock.
fn ahead_of_database_clock(db: &Db, table: &str, column: &str) -> Vec<i64> {
    db.connect()
        .query(
            &format!(
                "SELECT {column} - (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT \
                 FROM {table}"
            ),
            &[],
        )
        .unwrap()
        .into_iter()
        .map(|r| r[0].as_i64().unwrap())
        .collect()
}

/// On PostgreSQL: a table of the test's own named after `name` and a store on it made by
/// `store` (with `lease`); then the child, its clock shifted by `offset_ms`, plays `role` on it.
fn after_a_skewed_child<S>(
    name: &str,
    offset_ms: i64,
    role: &str,
    lease: Duration,
    store: impl FnOnce(&Db, &str, Duration) -> S,
) -> (Db, String, S) {
    let db = Db::postgres();
    let table = db.table(name);
    let store = store(&db, &table, lease);
    run_with_clock(offset_ms, role, &table, lease);
    (db, table, store)
}

/// Asserts every row's `column` of `table` lies ahead of the database's clock by an amount in
/// `range` (ms), saying `what` it is.
fn assert_ahead_of_database_clock(
    db: &Db,
    table: &str,
    column: &str,
    range: impl std::ops::RangeBounds<i64> + std::fmt::Debug,
    what: &str,
) {
    for ahead in ahead_of_database_clock(db, table, column) {
        assert!(
            range.contains(&ahead),
            "{what} {ahead} ms ahead, not within {range:?} ms"
        );
    }
}

/// An idempotency store on `table` whose claims and receipts last `lease`, its table created.
fn skew_idempotency_store(db: &Db, table: &str, lease: Duration) -> SqlIdempotencyStore {
    idem_on(db, table, |o| o.claim_timeout(lease).retention(lease))
}

/// A host whose clock runs ten minutes behind claims with a 30 s lease: its claim and its
/// receipts hold by the database's clock, so a host on the right time cannot take them over.
#[test]
fn idem_claims_from_a_clock_behind_hold_by_the_database_clock() {
    let lease = Duration::from_secs(30);
    let (db, table, store) = after_a_skewed_child(
        "skew_idem_behind",
        -SKEW_MS,
        "idempotency",
        lease,
        skew_idempotency_store,
    );
    assert_eq!(
        store.claim("live").unwrap(),
        Claim::InProgress,
        "the slow host's claim is live by the database's clock"
    );
    assert_eq!(store.claim("done").unwrap(), Claim::Duplicate);
    assert!(!store.first_time("seen").unwrap());
    assert_eq!(store.purge_expired().unwrap(), 0, "nothing has expired");
    assert_ahead_of_database_clock(&db, &table, "deadline_ms", 1..=30_000, "deadline");
}

/// A host whose clock runs ten minutes ahead claims with a 1 s lease: the claim and receipts
/// expire 1 s later by the database's clock, not ten minutes later.
#[test]
fn idem_claims_from_a_clock_ahead_expire_by_the_database_clock() {
    let lease = Duration::from_secs(1);
    let (db, table, store) = after_a_skewed_child(
        "skew_idem_ahead",
        SKEW_MS,
        "idempotency",
        lease,
        skew_idempotency_store,
    );
    // The lease is 1000 ms.
    assert_ahead_of_database_clock(&db, &table, "deadline_ms", ..=1_000, "deadline");
    let mut purged = 0;
    assert!(
        support::eventually(Duration::from_secs(20), || {
            purged += store.purge_expired().unwrap();
            purged == 3
        }),
        "the fast host's claim and receipts expire after their 1 s (purged {purged})"
    );
    assert!(store.claim("live").unwrap().is_claimed());
    assert!(store.claim("done").unwrap().is_claimed());
}

/// An outbox store on `table` whose leases last `lease`, its table created, with one record;
/// the store and the record's id.
fn skew_outbox(db: &Db, table: &str, lease: Duration) -> (SqlOutboxStore, i64) {
    let store = outbox_with(db, table, |o| o.lease(lease));
    let id = db.in_tx(true, |tx| store.add(tx, &record(1)).unwrap());
    (store, id)
}

/// A relay whose clock runs ten minutes behind leases a record for 30 s: another relay is not
/// offered it while the lease holds by the database's clock.
#[test]
fn outbox_leases_from_a_clock_behind_hold_by_the_database_clock() {
    let lease = Duration::from_secs(30);
    let (db, table, (store, _)) =
        after_a_skewed_child("skew_ob_behind", -SKEW_MS, "outbox", lease, skew_outbox);
    assert!(
        store.pending(10).unwrap().is_empty(),
        "the slow relay's lease holds by the database's clock"
    );
    assert_ahead_of_database_clock(&db, &table, "lease_until_ms", 1..=30_000, "lease ends");
}

/// A relay whose clock runs ten minutes ahead leases a record for 1 s: another relay is offered
/// it 1 s later by the database's clock, not ten minutes later.
#[test]
fn outbox_leases_from_a_clock_ahead_expire_by_the_database_clock() {
    let lease = Duration::from_secs(1);
    let (db, table, (store, id)) =
        after_a_skewed_child("skew_ob_ahead", SKEW_MS, "outbox", lease, skew_outbox);
    // The lease is 1000 ms.
    assert_ahead_of_database_clock(&db, &table, "lease_until_ms", ..=1_000, "lease ends");
    let mut got = Vec::new();
    assert!(
        support::eventually(Duration::from_secs(20), || {
            got = store.pending(10).unwrap();
            !got.is_empty()
        }),
        "the fast relay's lease runs out after its 1 s"
    );
    assert_eq!(got.iter().map(|r| r.id).collect::<Vec<_>>(), vec![id]);
}

/// Receipts written by a host whose clock runs ten minutes behind are dated by the database's
/// clock: purging those older than five minutes keeps them.
#[test]
fn batch_receipts_from_a_clock_behind_are_dated_by_the_database_clock() {
    let lease = Duration::from_secs(1);
    let (_db, _table, store) = after_a_skewed_child(
        "skew_receipts",
        -SKEW_MS,
        "receipts",
        lease,
        |db, table, _| {
            let store = BatchStore::new(
                db.factory(),
                |_: &mut dyn Sql, _: &AckMessage| Ok("done".to_string()),
                BatchStoreOptions::new().table(table),
            )
            .unwrap();
            store.create_table().unwrap();
            store
        },
    );
    assert_eq!(
        store.purge(Duration::from_secs(5 * 60)).unwrap(),
        0,
        "the receipt was written just now by the database's clock"
    );
    assert_eq!(store.receipt("skew/1").unwrap().as_deref(), Some("done"));
}

// ---------------------------------------------------------------------------------------------
// What a PostgreSQL error says (issue 37, item 2): the driver's own text is only "db error" or
// "error connecting to server"; the library's `Error` names the server's severity, SQLSTATE
// and message, and the I/O cause.

#[test]
fn a_statement_postgres_refuses_names_its_sqlstate_and_the_servers_message() {
    let db = Db::postgres();
    let mut conn = db.connect();
    let e = conn.execute("NOT SQL", &[]).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("42601"), "the SQLSTATE code: {text}");
    assert!(
        text.contains("syntax error"),
        "the server's message: {text}"
    );
    assert!(text.contains("ERROR"), "the severity: {text}");
    // Through a store, on a table that was never created.
    let table = db.table("never_created");
    let store =
        SqlOutboxStore::open(db.factory(), SqlOutboxStoreOptions::default().table(&table)).unwrap();
    let text = store.stats().unwrap_err().to_string();
    assert!(text.contains("42P01"), "the SQLSTATE code: {text}");
    assert!(
        text.contains(&format!("relation \"{table}\" does not exist")),
        "the server's message: {text}"
    );
    // The source is still the driver's error, for a program that reads the code.
    match store.stats().unwrap_err() {
        Error::Sql { source, .. } => {
            let pg = source.downcast_ref::<postgres::Error>().unwrap();
            assert_eq!(pg.code(), Some(&postgres::error::SqlState::UNDEFINED_TABLE));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn connecting_postgres_on_a_closed_port_says_the_connection_was_refused() {
    // Nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("host=127.0.0.1 port={port} user=postgres dbname=test");
    let e: Error = postgres::Client::connect(&url, postgres::NoTls)
        .map(drop)
        .unwrap_err()
        .into();
    let text = e.to_string();
    assert!(
        text.to_lowercase().contains("connection refused"),
        "the I/O cause: {text}"
    );
}

// ---------------------------------------------------------------------------------------------
// MySQL's own

/// The seam's `$N` placeholders on MySQL: sent as `?`, each bound where it is named, one used
/// twice; a statement with `?` goes as written; `$1` in a string stays text.
#[test]
fn mysql_numbered_placeholders_bind_in_the_order_named() {
    let db = Db::mysql();
    let mut conn = db.connect();
    let rows = conn
        .query(
            "SELECT $2, $1 + $1, '$1', CONCAT(?, 'x')",
            &[Value::Integer(20), Value::from("b")],
        )
        .unwrap_err();
    // `$N` and `?` are not mixed: the `?` has no parameter of its own.
    assert!(matches!(rows, Error::Sql { .. }), "{rows:?}");
    let rows = conn
        .query(
            "SELECT $2, $1 + $1, '$1'",
            &[Value::Integer(20), Value::from("b")],
        )
        .unwrap();
    assert_eq!(
        rows,
        vec![vec![
            Value::from("b"),
            Value::Integer(40),
            Value::from("$1")
        ]]
    );
    let rows = conn
        .query("SELECT CONCAT(?, ?)", &[Value::from("a"), Value::from("b")])
        .unwrap();
    assert_eq!(rows, vec![vec![Value::from("ab")]]);
}

/// The r2d2 manager under `CheckIdle`: a pooled connection the server kills fails the one
/// operation that next uses it, reports itself broken as it goes back, and the pool opens a
/// new one for the next operation (no health check ran: it was used a moment before).
#[test]
fn a_mysql_connection_killed_under_a_pool_is_replaced_after_one_failure() {
    use acemq_amqp::sql::{checkout, CheckIdle, MysqlManager};
    let db = Db::mysql();
    let manager = MysqlManager::from_url(&db::mysql_url()).unwrap();
    let pool = r2d2::Pool::builder()
        .max_size(1)
        .build(CheckIdle::new(manager).window(Duration::from_secs(3600)))
        .unwrap();
    let table = db.table("pooled");
    let store = SqlIdempotencyStore::open(
        checkout(&pool),
        SqlIdempotencyStoreOptions::default().table(&table),
    )
    .unwrap();
    store.create_table().unwrap();
    assert!(store.first_time("a").unwrap());
    let id = {
        let mut conn = pool.get().unwrap();
        conn.query("SELECT CONNECTION_ID()", &[]).unwrap()[0][0].clone()
    };
    let mut admin = db.connect();
    admin
        .execute(&format!("KILL CONNECTION {}", id.as_i64().unwrap()), &[])
        .unwrap();
    assert!(matches!(store.first_time("b"), Err(Error::Sql { .. })));
    assert!(
        store.first_time("b").unwrap(),
        "the pool handed out the dead connection again"
    );
    let again = pool
        .get()
        .unwrap()
        .query("SELECT CONNECTION_ID()", &[])
        .unwrap()[0][0]
        .clone();
    assert_ne!(again, id);
}

/// A MySQL pool that cannot connect says why.
#[test]
fn connecting_mysql_on_a_closed_port_says_the_connection_was_refused() {
    use acemq_amqp::sql::{CheckIdle, MysqlManager};
    let manager = MysqlManager::from_url("mysql://root@127.0.0.1:1/test").unwrap();
    let e = r2d2::Pool::builder()
        .connection_timeout(Duration::from_secs(2))
        .build(CheckIdle::new(manager))
        .map(drop)
        .unwrap_err();
    let e = Error::from(e).to_string().to_lowercase();
    assert!(e.contains("refused"), "{e}");
    // The URL's password never reaches the error.
    let Err(e) = MysqlManager::from_url("postgres://root:s3cret@127.0.0.1/test") else {
        panic!("a postgres URL was taken for MySQL");
    };
    assert!(!e.to_string().contains("s3cret"), "{e}");
}

/// The MySQL DDL: `key` quoted (MySQL reserves it), keys with a length, 64 KiB types made
/// long, InnoDB with a binary collation; SQLite's and PostgreSQL's statements unchanged.
#[test]
fn mysql_ddl_quotes_key_and_sizes_its_columns() {
    use acemq_amqp::sql::Dialect;
    let ddl = schema_ddl(Dialect::Mysql);
    for part in [
        "`key` VARCHAR(255) PRIMARY KEY",
        "body LONGBLOB NOT NULL",
        "headers LONGTEXT NOT NULL",
        "definition LONGTEXT NOT NULL",
        "subject VARCHAR(255) NOT NULL",
        "id BIGINT AUTO_INCREMENT PRIMARY KEY",
        "INDEX acemq_idempotency_deadline (deadline_ms)",
        "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    ] {
        assert!(ddl.contains(part), "{part} missing from:\n{ddl}");
    }
    assert!(
        !ddl.contains("CREATE INDEX"),
        "MySQL has no CREATE INDEX IF NOT EXISTS"
    );
    for d in [Dialect::Sqlite, Dialect::Postgres] {
        let ddl = schema_ddl(d);
        assert!(
            !ddl.contains('`') && ddl.contains("    key TEXT PRIMARY KEY"),
            "{ddl}"
        );
    }
}
