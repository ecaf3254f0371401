//! The acknowledged consumer's throughput on SQLite (WAL, `synchronous=FULL`) at batch sizes 1,
//! 32 and 256, against the raw rate of single-row `INSERT` + commit on the same kind of file,
//! measured in the same run.
//!
//! ```text
//! cargo run --release --example bench_acknowledged
//! ```
//!
//! Every commit is an fsync of the WAL. The recipe opens a connection per batch, and SQLite
//! fsyncs the directory on a connection's first WAL write, so a batch costs two fsyncs where
//! the raw loop (one long-lived connection) pays one: batch 1 runs at about half the raw rate.
//! Larger batches amortise both over many messages. The target: batch 32 at least 10× batch 1.

use std::time::{Duration, Instant};

use acemq_amqp::patterns::acknowledged::{
    consume, ConsumeOptions, CounterIncrement, CounterStore, Delivery, IterSource,
};

#[path = "common/mod.rs"]
mod common;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Single-row inserts, each its own transaction, for about `budget`. Returns commits/s.
fn raw_commit_rate(dir: &std::path::Path, name: &str, budget: Duration) -> Res<f64> {
    let conn = rusqlite::Connection::open(dir.join(name))?;
    conn.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; \
         CREATE TABLE raw (id INTEGER PRIMARY KEY, body TEXT NOT NULL);",
    )?;
    let mut insert = conn.prepare("INSERT INTO raw (body) VALUES (?1)")?;
    let start = Instant::now();
    let mut n = 0_u64;
    while start.elapsed() < budget || n < 50 {
        insert.execute([r#"{"counter":"page_views","by":1}"#])?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Consumes `n` new counter messages in batches of `batch`. Returns messages/s.
fn recipe_rate(dir: &std::path::Path, batch: usize, n: usize) -> Res<f64> {
    let store = CounterStore::builder(dir.join(format!("batch{batch}.db"))).build()?;
    store.create_tables()?;
    let deliveries: Vec<Delivery<u64>> = (0..n)
        .map(|i| {
            let counter = format!("c{}", i % 16);
            Delivery::new(
                CounterIncrement::new(counter, 1).message(format!("bench/{batch}/{i}")),
                i as u64,
            )
        })
        .collect();
    let mut acked = 0_u64;
    let start = Instant::now();
    let report = consume(
        IterSource::new(deliveries),
        &store,
        |_: &Delivery<u64>| {
            acked += 1;
            Ok(())
        },
        ConsumeOptions::new()
            .batch_size(batch)
            .max_pending(batch * 2),
    )?;
    let elapsed = start.elapsed().as_secs_f64();
    assert_eq!(report.acknowledged, n as u64);
    assert_eq!(report.failed, 0);
    Ok(n as f64 / elapsed)
}

#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(bench);
}

fn bench() -> Res<()> {
    // On the project's disk, not a tmpfs: the point is the fsync.
    let dir = tempfile::tempdir_in(std::env::current_dir()?)?;
    let raw = raw_commit_rate(dir.path(), "raw-before.db", Duration::from_secs(2))?;
    // Size each run to take a few seconds at most.
    let n1 = ((raw * 2.0) as usize).clamp(100, 5_000);
    let runs = [
        (1, n1),
        (32, (n1 * 16).min(50_000)),
        (256, (n1 * 32).min(100_000)),
    ];
    println!("SQLite WAL, synchronous=FULL; raw single-row insert+commit: {raw:.0}/s");
    println!();
    println!("| batch | messages | messages/s | × raw commit rate | × batch 1 |");
    println!("|---:|---:|---:|---:|---:|");
    let mut batch1 = 0.0;
    let mut batch32 = 0.0;
    for (batch, n) in runs {
        let rate = recipe_rate(dir.path(), batch, n)?;
        if batch == 1 {
            batch1 = rate;
        }
        if batch == 32 {
            batch32 = rate;
        }
        println!(
            "| {batch} | {n} | {rate:.0} | {:.2} | {:.1} |",
            rate / raw,
            rate / batch1
        );
    }
    let raw_after = raw_commit_rate(dir.path(), "raw-after.db", Duration::from_secs(2))?;
    println!();
    println!("raw commit rate measured again after the runs: {raw_after:.0}/s");
    let speedup = batch32 / batch1;
    println!(
        "batch 32 / batch 1 = {speedup:.1}× (target ≥ 10×): {}",
        if speedup >= 10.0 { "met" } else { "NOT met" }
    );
    over_rabbitmq(dir.path())?;
    Ok(())
}

/// The recipe at batch 32 over RabbitMQ against raw amiquip consume + ack (prefetch 100), on
/// the same number of counter messages.
fn over_rabbitmq(dir: &std::path::Path) -> Res<()> {
    use acemq_amqp::patterns::acknowledged::{consume_with, AmqpQueue, Batcher, StopHandle};
    use acemq_amqp::{Connection, QueueSpec};

    let n = 20_000;
    let conn = Connection::open("amqp://guest:guest@127.0.0.1:5672/")?;
    let q = format!("bench.acknowledged.{}", std::process::id());
    conn.declare_queue(&QueueSpec::new(&q))?;
    let fill = || common::fill_queue(&conn, &q, n, |_| CounterIncrement::new("hits", 1).payload());

    // Raw amiquip consume + ack.
    fill()?;
    let raw = n as f64 / common::raw_consume(&q, n, 100).as_secs_f64();

    // The recipe, batch 32.
    fill()?;
    let store = CounterStore::builder(dir.join("amqp.db"))
        .allow(["hits"])
        .build()?;
    store.create_tables()?;
    let stop = StopHandle::new();
    let batcher = Batcher::builder()
        .batch_size(32)
        .max_pending(64)
        .stop_handle(stop.clone())
        .build()?;
    let start = Instant::now();
    let report = std::thread::scope(|s| -> Res<_> {
        let running = s.spawn(|| -> acemq_amqp::Result<_> {
            let queue = AmqpQueue::open(&conn, &q, 100)?;
            let report = consume_with(queue.source()?, &store, queue.acknowledger(), &batcher);
            queue.close()?;
            report
        });
        while store.value("hits")? < n as i64 {
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.stop();
        Ok(running.join().map_err(|_| "the recipe thread panicked")??)
    })?;
    let ours = n as f64 / start.elapsed().as_secs_f64();
    conn.delete_queue(&q)?;
    conn.close()?;
    println!();
    println!("over RabbitMQ, {n} messages, prefetch 100: raw consume + ack {raw:.0}/s, recipe at batch 32 {ours:.0}/s ({:.2}× raw; target ≥ 0.5×), report {report:?}", ours / raw);
    Ok(())
}
