//! Identity at the edges (issue 35): outbox rows another program wrote without a usable
//! `x-acemq-id`, foreign ids that cannot go on the wire as they came, and the pipelined relay
//! under a stalled link — one message, one id, on every publish and every attempt.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use acemq_amqp::patterns::{OutboxRelay, OutboxRelayOptions, SqlOutboxStore};
use acemq_amqp::sql::{Sql, Value};
use acemq_amqp::{ConsumerOptions, Message, QueueSpec, RetryPolicy};
use amiquip::{AmqpProperties, AmqpValue, FieldTable};
use support::db::{self, Backend, Db};
use support::raw::Raw;
use support::{connect, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

/// Every log line of this test binary (its own global logger), for the tests that need to see
/// that something was logged.
static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;
impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            LINES
                .lock()
                .unwrap()
                .push(format!("{} {}", record.level(), record.args()));
        }
    }
    fn flush(&self) {}
}

fn capture_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        log::set_logger(&Capture).expect("the only logger of this binary");
        log::set_max_level(log::LevelFilter::Warn);
    });
}

fn logged(needle: &str) -> Vec<String> {
    LINES
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Item 3: an outbox row without a string `x-acemq-id`.

fn outbox(db: &Db, lease: Duration) -> SqlOutboxStore {
    let s = SqlOutboxStore::builder(db.factory())
        .table(db.table("outbox"))
        .lease(lease)
        .build()
        .unwrap();
    s.create_table().unwrap();
    s
}

/// Another relay's store on `first`'s table.
fn same_table(db: &Db, first: &SqlOutboxStore, lease: Duration) -> SqlOutboxStore {
    SqlOutboxStore::builder(db.factory())
        .table(first.table())
        .lease(lease)
        .build()
        .unwrap()
}

/// A row as another program writes it: raw SQL, these headers (the column's text as is).
fn insert_raw(db: &Db, table: &str, routing_key: &str, body: &str, headers: &str) {
    let p = |i: usize| match db.backend {
        Backend::Sqlite => "?".to_string(),
        Backend::Postgres => format!("${i}"),
    };
    db.connect()
        .execute(
            &format!(
                "INSERT INTO {table} (exchange, routing_key, body, content_type, headers, \
                 created_ms) VALUES ('', {}, {}, 'text/plain', {}, {})",
                p(1),
                p(2),
                p(3),
                p(4)
            ),
            &[
                Value::Text(routing_key.into()),
                Value::Bytes(body.as_bytes().to_vec()),
                Value::Text(headers.into()),
                Value::Integer(acemq_amqp::now_ms()),
            ],
        )
        .unwrap();
}

/// The database refuses every `DELETE` on a table until this is dropped (a trigger), as a
/// failing disk or a constraint would: a published record then stays in the table.
struct RefuseDeletes<'a> {
    db: &'a Db,
    table: String,
    name: String,
}

impl<'a> RefuseDeletes<'a> {
    fn new(db: &'a Db, table: &str) -> RefuseDeletes<'a> {
        let name = format!("{table}_nodelete");
        let statements = match db.backend {
            Backend::Sqlite => vec![format!(
                "CREATE TRIGGER {name} BEFORE DELETE ON {table} \
                 BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )],
            Backend::Postgres => vec![
                format!(
                    "CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN \
                     RAISE EXCEPTION 'refused by the test'; END $f$"
                ),
                format!(
                    "CREATE TRIGGER {name} BEFORE DELETE ON {table} \
                     FOR EACH ROW EXECUTE FUNCTION {name}()"
                ),
            ],
        };
        let mut c = db.connect();
        for s in statements {
            c.execute(&s, &[]).unwrap();
        }
        RefuseDeletes {
            db,
            table: table.to_string(),
            name,
        }
    }
}

impl Drop for RefuseDeletes<'_> {
    fn drop(&mut self) {
        let (name, table) = (&self.name, &self.table);
        let statements = match self.db.backend {
            Backend::Sqlite => vec![format!("DROP TRIGGER IF EXISTS {name}")],
            Backend::Postgres => vec![
                format!("DROP TRIGGER IF EXISTS {name} ON {table}"),
                format!("DROP FUNCTION IF EXISTS {name}()"),
            ],
        };
        let mut c = self.db.connect();
        for s in statements {
            if let Err(e) = c.execute(&s, &[]) {
                eprintln!("could not drop the test's trigger: {s}: {e}");
            }
        }
    }
}

/// Rows written by another program with headers `{}`, an empty column and
/// `{"x-acemq-id": 777}`: a relay publishes them and cannot delete them, their lease runs out,
/// a second relay publishes them again. Each row's two copies carry one id (and the AMQP
/// `message_id` is that id), and the three rows three different ids.
fn an_outbox_row_without_a_string_id_is_published_with_the_same_id_every_time(db: &Db) {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("outbox-id-less"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let lease = Duration::from_millis(300);
    let store = outbox(db, lease);
    let table = store.table().to_string();
    for (body, headers) in [
        ("empty-object", "{}"),
        ("empty", ""),
        ("number", r#"{"x-acemq-id": 777}"#),
    ] {
        insert_raw(db, &table, &q, body, headers);
    }
    let first = OutboxRelay::new(
        &conn,
        same_table(db, &store, lease),
        OutboxRelayOptions::new(),
    )
    .unwrap();
    let refusal = RefuseDeletes::new(db, &table);
    let e = first.sweep().unwrap_err();
    assert!(matches!(e, acemq_amqp::Error::Sql { .. }), "{e:?}");
    drop(refusal);
    assert!(eventually(WAIT, || conn
        .queue_info(&q)
        .unwrap()
        .message_count
        == 3));
    // The rows are still there, leased by the first relay: a second relay publishes them
    // again once the lease has run out.
    let second = OutboxRelay::new(
        &conn,
        same_table(db, &store, lease),
        OutboxRelayOptions::new(),
    )
    .unwrap();
    assert!(eventually(WAIT, || {
        let _ = second.sweep();
        conn.queue_info(&q).unwrap().message_count == 6
    }));
    assert_eq!(db.count(&table), 0, "deleted after the second publish");
    let mut ids: BTreeMap<String, Vec<String>> = BTreeMap::new();
    while let Some(m) = conn.get(&q).unwrap() {
        let message_id = m.properties.as_ref().and_then(|p| p.message_id().clone());
        assert_eq!(message_id.as_deref(), Some(m.id()), "message_id is the id");
        ids.entry(String::from_utf8(m.body.clone()).unwrap())
            .or_default()
            .push(m.id().to_string());
    }
    assert_eq!(ids.len(), 3, "{ids:?}");
    for (body, copies) in &ids {
        assert_eq!(copies.len(), 2, "{body}: {copies:?}");
        assert_eq!(copies[0], copies[1], "{body}: one row, one id: {copies:?}");
    }
    let distinct: std::collections::HashSet<&String> = ids.values().map(|c| &c[0]).collect();
    assert_eq!(distinct.len(), 3, "three rows, three ids: {ids:?}");
    first.close().unwrap();
    second.close().unwrap();
}

on_both!(an_outbox_row_without_a_string_id_is_published_with_the_same_id_every_time);

// ---------------------------------------------------------------------------------------------
// Item 4: one identity per message across every attempt.

/// What the observer was told of replaced ids: (queue, id used, reason).
#[derive(Clone, Default)]
struct Replaced(Arc<Mutex<Vec<(String, String, String)>>>);

impl acemq_amqp::Observer for Replaced {
    fn id_replaced(&self, e: &acemq_amqp::observe::IdReplaced<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((e.queue.to_string(), e.id.to_string(), e.reason.to_string()));
    }
}

/// Publishes one raw message with `id` as its `x-acemq-id` (and no `message_id`) to a queue
/// consumed with three attempts, 50 ms apart, by a handler that always fails; returns the ids
/// the handler saw on each attempt, the id of the dead-letter copy, and the observer's events.
fn ids_over_every_attempt(
    prefix: &str,
    id: AmqpValue,
) -> (Vec<String>, String, Vec<(String, String, String)>) {
    capture_logs();
    let observer = Replaced::default();
    let conn = support::connect_with(
        acemq_amqp::ConnectionOptions::new()
            .address(support::amqp_url())
            .observer(observer.clone()),
    );
    let mut clean = Cleanup::new(&conn);
    let q = clean.consumed_queue(&unique(prefix), &[]);
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let raw = Raw::open();
    let mut headers = FieldTable::new();
    headers.insert("x-acemq-id".into(), id);
    headers.insert("x-acemq-type".into(), AmqpValue::LongString("t".into()));
    headers.insert("tenant".into(), AmqpValue::LongString("acme".into()));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let s = seen.clone();
    let consumer = conn
        .consumer(
            &q,
            ConsumerOptions::new().retry(RetryPolicy::fixed(3, Duration::from_millis(50))),
        )
        .unwrap()
        .start(move |m: &Message| {
            s.lock().unwrap().push(m.id().to_string());
            Err("always fails".into())
        })
        .unwrap();
    raw.publish(
        "",
        &q,
        b"body",
        AmqpProperties::default()
            .with_headers(headers)
            .with_delivery_mode(2),
    );
    let dlq = acemq_amqp::dead_letter_queue(&q);
    let mut dead = None;
    assert!(eventually(WAIT, || {
        dead = conn.get(&dlq).unwrap();
        dead.is_some()
    }));
    consumer.close().unwrap();
    raw.close();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "three attempts: {seen:?}");
    let events = observer.0.lock().unwrap().clone();
    (seen, dead.unwrap().id().to_string(), events)
}

/// A foreign `x-acemq-id` of 300 characters cannot be the AMQP `message_id` (a short string)
/// a copy carries: it is replaced by its SHA-256 hex already when read, so attempt 1, the
/// retries and the dead-letter copy all carry the same id, and the replacement is logged and
/// reported.
#[test]
fn a_300_character_id_is_one_identity_on_every_attempt_and_in_the_dead_letter() {
    let long = format!("long-{}", "x".repeat(295));
    let (seen, dead, events) =
        ids_over_every_attempt("id-300", AmqpValue::LongString(long.clone()));
    let hashed = sha256_hex(long.as_bytes());
    assert_eq!(seen, vec![hashed.clone(); 3], "every attempt");
    assert_eq!(dead, hashed, "the dead-letter copy");
    // Replaced once, when it was first read (the copies carry the hash: nothing to replace).
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, hashed);
    assert!(events[0].2.contains("255"), "{events:?}");
    assert!(!logged(&hashed).is_empty(), "a log line names the id used");
}

/// A foreign `x-acemq-id` that is a byte array but not UTF-8 is not dropped: the id is the
/// SHA-256 hex of its bytes on every attempt and on the dead-letter copy (not an id derived from
/// the delivery), and the replacement is logged and reported.
#[test]
fn a_non_utf8_id_is_hashed_from_its_bytes_on_every_attempt_and_reported() {
    let bytes = vec![0xff, 0xfe, b'i', b'd', 0x80, 0x01];
    let (seen, dead, events) =
        ids_over_every_attempt("id-bytes", AmqpValue::ByteArray(bytes.clone()));
    let hashed = sha256_hex(&bytes);
    assert_eq!(seen, vec![hashed.clone(); 3], "every attempt");
    assert_eq!(dead, hashed, "the dead-letter copy");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, hashed);
    assert!(events[0].2.contains("UTF-8"), "{events:?}");
    assert!(!logged(&hashed).is_empty(), "a log line names the id used");
}

/// A foreign `x-acemq-id` that is not a string (an integer) is not an id this crate can use as
/// it is: the message reads under the id derived from the delivery, the same on every attempt,
/// and that is logged and reported.
#[test]
fn a_non_string_id_is_replaced_by_one_derived_id_on_every_attempt_and_reported() {
    let (seen, dead, events) = ids_over_every_attempt("id-int", AmqpValue::LongInt(777));
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|id| *id == seen[0]), "{seen:?}");
    assert_ne!(seen[0], "777");
    assert_eq!(dead, seen[0], "the dead-letter copy");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, seen[0]);
    assert!(events[0].2.contains("not a string"), "{events:?}");
    assert!(!logged(&seen[0]).is_empty(), "a log line names the id used");
}
