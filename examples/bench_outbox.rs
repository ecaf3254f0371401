//! The outbox relay from PostgreSQL and from SQLite to RabbitMQ (mandatory, confirmed, batch
//! 100) against raw amiquip publishing in windows of 100 confirms, and the idempotent consumer
//! on SQLite against raw consume + ack, all in one run.
//! Run: `cargo run --release --all-features --example bench_outbox [records]`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use acemq_amqp::observe::OutboxEvent;
use acemq_amqp::patterns::{
    idempotent, record, OutboxRelay, OutboxRelayOptions, SqlIdempotencyStore, SqlOutboxStore,
};
use acemq_amqp::sql::{checkout, PostgresConnectionManager, Sql, SqliteManager};
use acemq_amqp::Observer;
use acemq_amqp::{
    Connection, ConsumerOptions, Error, JsonCodec, Message, Outcome, QueueSpec, Result,
};
use amiquip::AmqpProperties;

#[path = "common/mod.rs"]
mod common;

const PG_URL: &str = "host=127.0.0.1 user=postgres dbname=test";

fn raw_publish(queue: &str, n: usize, body: &[u8], envelope: bool) -> f64 {
    // With `envelope`, the headers acemq writes (built once): the broker's cost of the contract.
    let props = if envelope {
        Message::new(body).to_properties_for_bench(queue, "acemq@bench")
    } else {
        AmqpProperties::default().with_delivery_mode(2)
    };
    n as f64 / common::raw_publish(queue, n, 100, body, &props).as_secs_f64()
}

fn raw_consume(queue: &str, n: usize) -> f64 {
    n as f64 / common::raw_consume(queue, n, 100).as_secs_f64()
}

/// Adds `n` records, 500 per transaction; `in_tx` runs its closure on a fresh transaction and
/// commits.
fn fill_outbox(
    store: &SqlOutboxStore,
    in_tx: impl Fn(&mut dyn FnMut(&mut dyn Sql) -> Result<()>) -> Result<()>,
    queue: &str,
    n: usize,
) -> Result<()> {
    for chunk in 0..n.div_ceil(500) {
        in_tx(&mut |tx: &mut dyn Sql| {
            for i in 0..500.min(n - chunk * 500) {
                let payload = serde_json::json!({"n": i, "pad": "x".repeat(180)});
                store.add(tx, &record(&JsonCodec, "", queue, &payload)?)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Counts records the relay reports published.
#[derive(Default)]
struct Published(AtomicUsize);
impl Observer for Published {
    fn outbox(&self, event: &OutboxEvent<'_>) {
        if let OutboxEvent::Published { .. } = event {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A started relay (batch 100) until `n` records are out.
fn relay_rate(store: SqlOutboxStore, n: usize) -> Result<f64> {
    let counter = Arc::new(Published::default());
    let connection = acemq_amqp::ConnectionOptions::new()
        .address("amqp://guest:guest@127.0.0.1:5672/")
        .observer(counter.clone())
        .open()?;
    let options = OutboxRelayOptions::new()
        .batch_size(100)
        .interval(Duration::from_millis(5));
    let relay = OutboxRelay::new(&connection, store, options)?;
    let start = Instant::now();
    let relay = relay.start()?;
    while counter.0.load(Ordering::Relaxed) < n {
        std::thread::sleep(Duration::from_micros(200));
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    relay.close()?;
    connection.close()?;
    Ok(rate)
}

fn sqlite_open(
    path: &std::path::Path,
    synchronous: &'static str,
) -> impl Fn() -> Result<rusqlite::Connection> + Send + Sync + Clone + 'static {
    let path = path.to_path_buf();
    move || {
        let c = rusqlite::Connection::open(&path).map_err(|e| Error::Sql {
            context: "open".into(),
            source: e.into(),
        })?;
        c.busy_timeout(Duration::from_secs(30))
            .and_then(|_| {
                c.execute_batch(&format!(
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous};"
                ))
            })
            .map_err(|e| Error::Sql {
                context: "pragmas".into(),
                source: e.into(),
            })?;
        Ok(c)
    }
}

/// The same connections as `sqlite_open`, from an r2d2 pool of `size`.
fn sqlite_pool(
    path: &std::path::Path,
    synchronous: &'static str,
    size: u32,
) -> Result<r2d2::Pool<SqliteManager>> {
    let manager = SqliteManager::file(path).init(move |c| {
        c.busy_timeout(Duration::from_secs(30))?;
        c.execute_batch(&format!(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous={synchronous};"
        ))
    });
    Ok(r2d2::Pool::builder().max_size(size).build(manager)?)
}

fn idempotent_rate(
    connection: &Connection,
    queue: &str,
    n: usize,
    path: &std::path::Path,
    sync: &'static str,
    table: &str,
) -> Result<f64> {
    let pool = sqlite_pool(path, sync, 8)?;
    let store = SqlIdempotencyStore::builder(checkout(&pool))
        .table(table)
        .build()?;
    store.create_table()?;
    let count = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = crossbeam_channel::bounded(1);
    let c = count.clone();
    let handler = idempotent(store, move |_: &Message| Ok(Outcome::Accept));
    let start = Instant::now();
    let consumer = connection
        .consumer(
            queue,
            ConsumerOptions::new()
                .prefetch(100)
                .concurrency(4)
                .declare(false),
        )?
        .start(move |m: &Message| {
            let r = acemq_amqp::Handler::handle(&handler, m);
            if c.fetch_add(1, Ordering::Relaxed) + 1 == n {
                let _ = tx.try_send(Instant::now());
            }
            r
        })?;
    let end = rx.recv().map_err(|_| Error::Closed { what: "bench" })?;
    consumer.close()?;
    Ok(n as f64 / (end - start).as_secs_f64())
}

fn fill_queue(connection: &Connection, queue: &str, n: usize) -> Result<()> {
    common::fill_queue(connection, queue, n, |_| vec![b'x'; 200])
}

#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(bench);
}

fn bench() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000);
    let connection = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
    let run = std::process::id();
    let queue = format!("bench.outbox.{run}");
    connection.declare_queue(&QueueSpec::new(&queue).classic())?;
    let dir = tempfile::tempdir().map_err(|e| Error::Io {
        context: "tempdir".into(),
        source: e,
    })?;
    let path = dir.path().join("bench.db");
    let body = vec![b'x'; 200];

    // Outbox relay: SQLite (WAL, synchronous=FULL) and PostgreSQL, batch 100.
    let sqlite = sqlite_open(&path, "FULL");
    // Stores take connections from a pool, as a service would.
    let sqlite_pool = sqlite_pool(&path, "FULL", 4)?;
    let sqlite_store = || {
        SqlOutboxStore::builder(checkout(&sqlite_pool))
            .table("bench_outbox")
            .build()
    };
    let pg_table = format!("bench_outbox_{run}");
    let pg = || -> Result<postgres::Client> {
        postgres::Client::connect(PG_URL, postgres::NoTls).map_err(|e| Error::Sql {
            context: "connect".into(),
            source: e.into(),
        })
    };
    let pg_config: postgres::Config = PG_URL.parse()?;
    let pg_pool = r2d2::Pool::builder()
        .max_size(4)
        .build(PostgresConnectionManager::new(pg_config, postgres::NoTls))?;
    let pg_store = || {
        SqlOutboxStore::builder(checkout(&pg_pool))
            .table(pg_table.clone())
            .build()
    };
    sqlite_store()?.create_table()?;
    pg_store()?.create_table()?;

    let (mut raw, mut env, mut lite, mut post) = (0f64, 0f64, 0f64, 0f64);
    for _ in 0..3 {
        connection.purge_queue(&queue)?;
        raw = raw.max(raw_publish(&queue, n, &body, false));
        connection.purge_queue(&queue)?;
        env = env.max(raw_publish(&queue, n, &body, true));
        connection.purge_queue(&queue)?;
        let sqlite_tx = |f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>| -> Result<()> {
            let mut c = sqlite()?;
            let mut tx = c.transaction().map_err(|e| Error::Sql {
                context: "begin".into(),
                source: e.into(),
            })?;
            f(&mut tx)?;
            tx.commit().map_err(|e| Error::Sql {
                context: "commit".into(),
                source: e.into(),
            })
        };
        fill_outbox(&sqlite_store()?, sqlite_tx, &queue, n)?;
        lite = lite.max(relay_rate(sqlite_store()?, n)?);
        connection.purge_queue(&queue)?;
        let pg_tx = |f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>| -> Result<()> {
            let mut c = pg()?;
            let mut tx = c.transaction().map_err(|e| Error::Sql {
                context: "begin".into(),
                source: e.into(),
            })?;
            f(&mut tx)?;
            tx.commit().map_err(|e| Error::Sql {
                context: "commit".into(),
                source: e.into(),
            })
        };
        fill_outbox(&pg_store()?, pg_tx, &queue, n)?;
        post = post.max(relay_rate(pg_store()?, n)?);
    }
    println!("outbox relay, {n} records of ~200 bytes, batch 100, best of 3 alternating rounds");
    println!(
        "{:<44} {:>10} {:>8} {:>12}",
        "case", "msg/s", "vs raw", "vs raw+env"
    );
    println!(
        "{:<44} {raw:>10.0} {:>7.2}x {:>11.2}x",
        "raw amiquip, windows of 100 confirms",
        1.0,
        raw / env
    );
    println!(
        "{:<44} {env:>10.0} {:>7.2}x {:>11.2}x",
        "raw+env (same loop, acemq's headers)",
        env / raw,
        1.0
    );
    println!(
        "{:<44} {lite:>10.0} {:>7.2}x {:>11.2}x",
        "relay from SQLite (WAL, synchronous=FULL)",
        lite / raw,
        lite / env
    );
    println!(
        "{:<44} {post:>10.0} {:>7.2}x {:>11.2}x",
        "relay from PostgreSQL",
        post / raw,
        post / env
    );

    // Idempotent consumer on SQLite against raw consume + ack.
    let m = 4 * n;
    let (mut rc, mut full, mut normal) = (0f64, 0f64, 0f64);
    for round in 0..2 {
        fill_queue(&connection, &queue, m)?;
        rc = rc.max(raw_consume(&queue, m));
        fill_queue(&connection, &queue, m)?;
        full = full.max(idempotent_rate(
            &connection,
            &queue,
            m,
            &path,
            "FULL",
            &format!("idem_full_{round}"),
        )?);
        fill_queue(&connection, &queue, m)?;
        normal = normal.max(idempotent_rate(
            &connection,
            &queue,
            m,
            &path,
            "NORMAL",
            &format!("idem_normal_{round}"),
        )?);
    }
    println!();
    println!("idempotent consumer, {m} messages, prefetch 100, concurrency 4, best of 2 rounds");
    println!("{:<44} {:>10} {:>8}", "case", "msg/s", "vs raw");
    println!(
        "{:<44} {rc:>10.0} {:>7.2}x",
        "raw amiquip consume + ack", 1.0
    );
    println!(
        "{:<44} {full:>10.0} {:>7.2}x",
        "idempotent, SQLite WAL synchronous=FULL",
        full / rc
    );
    println!(
        "{:<44} {normal:>10.0} {:>7.2}x",
        "idempotent, SQLite WAL synchronous=NORMAL",
        normal / rc
    );

    let mut c = pg()?;
    c.batch_execute(&format!("DROP TABLE IF EXISTS {pg_table}"))
        .map_err(|e| Error::Sql {
            context: "drop".into(),
            source: e.into(),
        })?;
    connection.delete_queue(&queue)?;
    connection.close()
}
