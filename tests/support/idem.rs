//! Helpers of the idempotent consumer's tests (on [`super::db`]): the idempotency store, the
//! effects table the handlers write to, and a recorder of the batched wrapper's commits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::sql::{Sql, Value};

use super::db::Db;

/// A table of effects (`key TEXT NOT NULL`), dropped at the end: one row per effect applied.
pub fn effects_table(db: &Db) -> String {
    let t = db.table("effects");
    db.connect()
        .execute(&format!("CREATE TABLE {t} (key TEXT NOT NULL)"), &[])
        .unwrap();
    t
}

/// The test's effect: a row in `table`, on whatever connection or transaction it is given.
pub fn record_effect(conn: &mut dyn Sql, table: &str, key: &str) -> acemq_amqp::Result<u64> {
    let p = conn.dialect().placeholder(1);
    conn.execute(
        &format!("INSERT INTO {table} (key) VALUES ({p})"),
        &[Value::Text(key.to_string())],
    )
}

/// The keys in `table`, sorted.
pub fn keys(db: &Db, table: &str) -> Vec<String> {
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
