//! Store throughput against the same database's raw single-row insert-and-commit rate.
//!
//! ```text
//! cargo run --release --all-features --example bench_stores
//! ```
//!
//! SQLite: a file in a temporary directory, WAL, `synchronous=FULL`. PostgreSQL: `PG_URL` or
//! `host=127.0.0.1 user=postgres dbname=test`. Each phase runs for about `SECS` seconds
//! (default 3). One store operation is counted as one commit: claim + confirm is two,
//! outbox add (committed by the caller) + pending(1) + mark_published is three.

use std::time::{Duration, Instant};

use acemq_amqp::patterns::{
    Claim, IdempotencyStore, NewOutboxRecord, OutboxStore, SqlIdempotencyStore, SqlOutboxStore,
};
use acemq_amqp::sql::{checkout, PostgresConnectionManager, Sql, SqliteManager, Value};
use acemq_amqp::{Error, Result};

fn phase_secs() -> Duration {
    let secs = std::env::var("SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

/// Runs `op` until the phase time is up; returns operations (commits) per second.
fn rate(commits_per_op: u64, mut op: impl FnMut(u64) -> Result<()>) -> Result<(f64, u64)> {
    let limit = phase_secs();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < limit {
        op(n)?;
        n += 1;
    }
    let per_sec = (n * commits_per_op) as f64 / start.elapsed().as_secs_f64();
    Ok((per_sec, n))
}

fn record(n: u64) -> NewOutboxRecord {
    NewOutboxRecord {
        exchange: "bench".into(),
        routing_key: format!("bench.{n}"),
        body: vec![0u8; 256],
        content_type: "application/octet-stream".into(),
        headers: serde_json::Map::new(),
    }
}

struct Figures {
    raw: f64,
    idem: f64,
    outbox: f64,
}

fn report(db: &str, f: &Figures) {
    println!("{db}: raw insert+commit      {:>9.0} commits/s", f.raw);
    println!(
        "{db}: claim+confirm          {:>9.0} ops/s  ({:.2}x raw, {:.0} keys/s)",
        f.idem,
        f.idem / f.raw,
        f.idem / 2.0
    );
    println!(
        "{db}: add+pending+published  {:>9.0} ops/s  ({:.2}x raw, {:.0} records/s)",
        f.outbox,
        f.outbox / f.raw,
        f.outbox / 3.0
    );
}

fn run_stores<M, B>(
    pool: r2d2::Pool<M>,
    raw_table: &str,
    tag: &str,
    mut begin_add: B,
) -> Result<Figures>
where
    M: r2d2::ManageConnection,
    M::Connection: Sql,
    B: FnMut(&mut M::Connection, &SqlOutboxStore, &NewOutboxRecord) -> Result<i64>,
{
    let idem = SqlIdempotencyStore::builder(checkout(&pool))
        .table(format!("bench_idem_{tag}"))
        .build()?;
    idem.create_table()?;
    let outbox = SqlOutboxStore::builder(checkout(&pool))
        .table(format!("bench_outbox_{tag}"))
        .build()?;
    outbox.create_table()?;

    // Raw: one single-row INSERT per commit (autocommit), same database, same connection kind.
    // Measured before and after the store phases; the better of the two is reported.
    let mut round = 0;
    let mut raw_rate = || -> Result<f64> {
        round += 1;
        let mut conn = pool.get()?;
        let d = conn.dialect();
        let sql = format!(
            "INSERT INTO {raw_table} (k, v) VALUES ({}, {})",
            d.placeholder(1),
            d.placeholder(2)
        );
        let (r, _) = rate(1, |n| {
            conn.execute(
                &sql,
                &[
                    Value::Text(format!("raw-{round}-{n}")),
                    Value::Integer(n as i64),
                ],
            )
            .map(drop)
        })?;
        Ok(r)
    };
    let raw_before = raw_rate()?;

    let (idem_rate, _) = rate(2, |n| {
        let key = format!("key-{n}");
        match idem.claim(&key)? {
            Claim::Claimed(token) => idem.confirm(&key, &token),
            other => Err(Error::InvalidArgument {
                reason: format!("fresh key {key} claimed as {other:?}"),
            }),
        }
    })?;

    let (outbox_rate, _) = rate(3, |n| {
        let id = {
            let mut conn = pool.get()?;
            begin_add(&mut *conn, &outbox, &record(n))?
        };
        let got = outbox.pending(1)?;
        match got.first() {
            Some(r) if r.id == id => outbox.mark_published(r.id),
            other => Err(Error::InvalidArgument {
                reason: format!("pending returned {other:?}, expected id {id}"),
            }),
        }
    })?;

    let raw_after = raw_rate()?;
    eprintln!("{tag}: raw before {raw_before:.0}/s, after {raw_after:.0}/s");
    Ok(Figures {
        raw: raw_before.max(raw_after),
        idem: idem_rate,
        outbox: outbox_rate,
    })
}

fn sqlite() -> Result<Figures> {
    let dir = tempfile::tempdir().map_err(|e| Error::Io {
        context: "creating a temp dir".into(),
        source: e,
    })?;
    let path = dir.path().join("bench.db");
    let manager = SqliteManager::file(&path).init(|conn| {
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=10000;",
        )
    });
    let pool = r2d2::Pool::builder().max_size(4).build(manager)?;
    pool.get()?
        .execute("CREATE TABLE bench_raw (k TEXT PRIMARY KEY, v BIGINT)", &[])?;
    {
        let conn = pool.get()?;
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .map_err(|e| Error::Sql {
                context: "reading pragma".into(),
                source: e.into(),
            })?;
        assert_eq!(sync, 2, "synchronous=FULL");
    }
    run_stores(pool, "bench_raw", "sqlite", |conn, outbox, rec| {
        let mut tx = conn.transaction().map_err(|e| Error::Sql {
            context: "begin".into(),
            source: e.into(),
        })?;
        let id = outbox.add(&mut tx, rec)?;
        tx.commit().map_err(|e| Error::Sql {
            context: "commit".into(),
            source: e.into(),
        })?;
        Ok(id)
    })
}

fn postgres() -> Result<Figures> {
    let url = std::env::var("PG_URL")
        .unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=test".to_owned());
    let config: postgres::Config = url.parse()?;
    let pool = r2d2::Pool::builder()
        .max_size(4)
        .build(PostgresConnectionManager::new(config, postgres::NoTls))?;
    let tag = format!("pg{}", std::process::id());
    let raw_table = format!("bench_raw_{tag}");
    let drop_all = |pool: &r2d2::Pool<PostgresConnectionManager<postgres::NoTls>>| -> Result<()> {
        let mut c = pool.get()?;
        for t in [
            raw_table.clone(),
            format!("bench_idem_{tag}"),
            format!("bench_outbox_{tag}"),
        ] {
            c.execute(&format!("DROP TABLE IF EXISTS {t}"), &[])?;
        }
        Ok(())
    };
    pool.get()?.execute(
        &format!("CREATE TABLE {raw_table} (k TEXT PRIMARY KEY, v BIGINT)"),
        &[],
    )?;
    let figures = run_stores(pool.clone(), &raw_table, &tag, |conn, outbox, rec| {
        let mut tx = conn.transaction().map_err(|e| Error::Sql {
            context: "begin".into(),
            source: e.into(),
        })?;
        let id = outbox.add(&mut tx, rec)?;
        tx.commit().map_err(|e| Error::Sql {
            context: "commit".into(),
            source: e.into(),
        })?;
        Ok(id)
    });
    drop_all(&pool)?;
    figures
}

#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(bench);
}

fn bench() -> Result<()> {
    println!("phase length {:?}", phase_secs());
    let s = sqlite()?;
    report("sqlite (WAL, synchronous=FULL)", &s);
    let p = postgres()?;
    report("postgresql", &p);
    Ok(())
}
