//! Helpers of the idempotent consumer's tests (on [`super::db`]): the idempotency store, the
//! effects table the handlers write to, and a recorder of the batched wrapper's commits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::sql::{Sql, Value};

use super::db::Db;

/// A table of effects (`effect_key TEXT NOT NULL`), dropped at the end: one row per effect applied.
pub fn effects_table(db: &Db) -> String {
    let t = db.table("effects");
    db.connect()
        .execute(&format!("CREATE TABLE {t} (effect_key TEXT NOT NULL)"), &[])
        .unwrap();
    t
}

/// The test's effect: a row in `table`, on whatever connection or transaction it is given.
pub fn record_effect(conn: &mut dyn Sql, table: &str, key: &str) -> acemq_amqp::Result<u64> {
    let p = conn.dialect().placeholder(1);
    conn.execute(
        &format!("INSERT INTO {table} (effect_key) VALUES ({p})"),
        &[Value::Text(key.to_string())],
    )
}

/// The keys in `table`, sorted.
pub fn keys(db: &Db, table: &str) -> Vec<String> {
    let mut keys = texts(db, &format!("SELECT effect_key FROM {table}"));
    keys.sort();
    keys
}

/// The first column, as text, of the rows `query` selects.
pub fn texts(db: &Db, query: &str) -> Vec<String> {
    db.connect()
        .query(query, &[])
        .unwrap()
        .into_iter()
        .map(|r| r[0].as_str().unwrap().to_string())
        .collect()
}

/// An idempotency store on its own table (claims leased for 30 s), its table created.
pub fn store(db: &Db) -> Arc<SqlIdempotencyStore> {
    let s = SqlIdempotencyStore::open(
        db.factory(),
        SqlIdempotencyStoreOptions::default()
            .table(db.table("idem"))
            .claim_timeout(Duration::from_secs(30)),
    )
    .unwrap();
    s.create_table().unwrap();
    Arc::new(s)
}

/// What the batched wrapper calls after each commit, with the number of messages committed.
pub type OnCommit = Arc<dyn Fn(usize) + Send + Sync>;

/// An `on_commit` that records each commit's size, and the sizes recorded so far.
pub fn recorder() -> (Arc<Mutex<Vec<usize>>>, OnCommit) {
    let commits = Arc::new(Mutex::new(Vec::new()));
    let c = commits.clone();
    (commits, Arc::new(move |n| c.lock().unwrap().push(n)))
}

/// Hands a boxed handler to the consumer with its batching intact (a closure calling `handle`
/// would hide it: then the wrapper gathers concurrent workers' calls instead).
pub struct Forward(pub Box<dyn acemq_amqp::Handler + Send + Sync>);

impl acemq_amqp::Handler for Forward {
    fn handle(&self, m: &acemq_amqp::Message) -> acemq_amqp::HandlerResult {
        self.0.handle(m)
    }
    fn batch_limits(&self) -> Option<(usize, Duration)> {
        self.0.batch_limits()
    }
    fn handle_batch(
        &self,
        messages: &[&acemq_amqp::Message],
    ) -> Vec<std::thread::Result<acemq_amqp::HandlerResult>> {
        self.0.handle_batch(messages)
    }
}

/// The crash tests' child process (this binary's ignored `crash_child` test), directed by its
/// environment to `db`'s backend and file, `queue`, the idempotency table and the effects
/// table; add any other `.env(…)` and run it.
pub fn crash_child(db: &Db, queue: &str, idem_table: &str, effects: &str) -> std::process::Command {
    let mut child = super::crash_child();
    child
        .env(
            "ACEMQ_CRASH_BACKEND",
            match db.backend {
                super::db::Backend::Sqlite => "sqlite",
                super::db::Backend::Postgres => "postgres",
                super::db::Backend::Mysql => "mysql",
            },
        )
        .env("ACEMQ_CRASH_SQLITE", db.sqlite_path())
        .env("ACEMQ_CRASH_QUEUE", queue)
        .env("ACEMQ_CRASH_IDEM", idem_table)
        .env("ACEMQ_CRASH_EFFECTS", effects);
    child
}

/// What the child [`crash_child`] runs is directed to.
pub struct CrashChild {
    pub backend: super::db::Backend,
    pub sqlite: std::path::PathBuf,
    pub queue: String,
    pub idem: String,
    pub effects: String,
}

impl CrashChild {
    /// In the child [`crash_child`] runs: what it is directed to; `None` when this is not that
    /// child.
    pub fn from_env() -> Option<CrashChild> {
        use super::db::Backend;
        let backend = match std::env::var("ACEMQ_CRASH_BACKEND").as_deref() {
            Ok("sqlite") => Backend::Sqlite,
            Ok("postgres") => Backend::Postgres,
            Ok("mysql") => Backend::Mysql,
            _ => return None,
        };
        let var = |n: &str| std::env::var(n).unwrap();
        Some(CrashChild {
            backend,
            sqlite: std::path::PathBuf::from(var("ACEMQ_CRASH_SQLITE")),
            queue: var("ACEMQ_CRASH_QUEUE"),
            idem: var("ACEMQ_CRASH_IDEM"),
            effects: var("ACEMQ_CRASH_EFFECTS"),
        })
    }

    /// Connections to the child's database.
    pub fn factory(
        &self,
    ) -> impl Fn() -> acemq_amqp::Result<super::db::Conn> + Clone + Send + Sync + 'static {
        use super::db::{self, Backend};
        let (backend, sqlite) = (self.backend, self.sqlite.clone());
        move || -> acemq_amqp::Result<db::Conn> {
            Ok(match backend {
                Backend::Sqlite => Box::new(db::sqlite_open(&sqlite)?),
                Backend::Postgres => Box::new(db::pg_connect()?),
                Backend::Mysql => db::my_connect_boxed()?,
            })
        }
    }
}

/// The idempotent consumer's first scenario, on `conn`'s `queue` and `db`: a message delivered
/// twice (the same `x-acemq-id`) runs the handler and applies its effect once; the second
/// delivery is counted as a duplicate, and both are acknowledged.
pub fn a_duplicate_is_applied_once(conn: &acemq_amqp::Connection, q: &str, db: &Db) {
    use acemq_amqp::patterns::idempotent::{idempotent, IdempotentOptions};
    use acemq_amqp::{ConsumerOptions, Handler, Message, Outcome, RetryPolicy};
    use std::sync::atomic::{AtomicUsize, Ordering};
    const WAIT: Duration = Duration::from_secs(30);
    let effects = effects_table(db);
    let calls = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let (c, r) = (calls.clone(), ran.clone());
    let effect_db = db.factory();
    let effects2 = effects.clone();
    let inner = idempotent(
        store(db),
        move |m: &Message| {
            r.fetch_add(1, Ordering::SeqCst);
            record_effect(&mut effect_db()?, &effects2, m.id())?;
            Ok(Outcome::Accept)
        },
        IdempotentOptions::default(),
    );
    let duplicates = inner.duplicates();
    let consumer = conn
        .consumer(q, ConsumerOptions::new().retry(RetryPolicy::none()))
        .unwrap()
        .start(move |m: &Message| {
            c.fetch_add(1, Ordering::SeqCst);
            inner.handle(m)
        })
        .unwrap();

    let publisher = conn.publisher().unwrap();
    let first = Message::new("charge").with_type("payment.requested");
    let id = first.id().to_string();
    let again = first.clone(); // the same x-acemq-id, delivered a second time
    publisher.publish("", q, first).unwrap();
    publisher.publish("", q, again).unwrap();
    let count = || conn.queue_info(q).unwrap().message_count;
    assert!(
        super::eventually(WAIT, || calls.load(Ordering::SeqCst) == 2),
        "both deliveries handled"
    );
    assert!(
        super::eventually(WAIT, || duplicates.get() == 1
            && consumer.in_flight() == 0
            && count() == 0),
        "both settled, the second as a duplicate"
    );
    consumer.close().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the handler ran once");
    assert_eq!(keys(db, &effects), vec![id], "the effect applied once");
    assert_eq!(count(), 0, "both acknowledged");
}
