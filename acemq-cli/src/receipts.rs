//! `acemq receipts purge`: the library's guarded retention (`patterns::retention::purge`).

use std::time::Duration;

use acemq_amqp::patterns::idempotency::{SqlIdempotencyStore, SqlIdempotencyStoreOptions};
use acemq_amqp::patterns::outbox::{SqlOutboxStore, SqlOutboxStoreOptions};
use acemq_amqp::patterns::retention::{purge as guarded, RetentionOptions};
use acemq_amqp::patterns::scheduler::SchedulerOptions;
use acemq_amqp::RetryPolicy;
use serde_json::json;

use crate::db::Db;
use crate::out::{rfc3339_ms, Out};
use crate::{connect, Failure, Outcome};

/// What `receipts purge` was asked.
pub struct Purge<'a> {
    pub older_than: Duration,
    pub queues: &'a [String],
    pub rungs: &'a [Duration],
    pub schedule: bool,
    pub table: &'a str,
    pub retired_outbox: Option<&'a str>,
    pub scan_limit: usize,
}

pub fn purge(url: &str, db_url: &str, p: &Purge<'_>, out: &mut Out) -> Outcome {
    let db = Db::parse(db_url)?;
    drop(db.connect(false)?);
    let factory = db.clone();
    let receipts = SqlIdempotencyStore::open(
        move || factory.open(false),
        SqlIdempotencyStoreOptions::default().table(p.table),
    )
    .map_err(|e| Failure::from_error("bad receipt store options", e))?;
    let outbox = match p.retired_outbox {
        Some(table) => {
            let factory = db.clone();
            Some(
                SqlOutboxStore::open(
                    move || factory.open(false),
                    SqlOutboxStoreOptions::default().table(table),
                )
                .map_err(|e| Failure::from_error("bad outbox options", e))?,
            )
        }
        None => None,
    };
    // The rungs as a policy's: a fixed wait per rung is enough to name their queues.
    let mut options = RetentionOptions::new(p.older_than)
        .scan_limit(p.scan_limit)
        .retired_outbox(outbox.is_some());
    for q in p.queues {
        options = options.consumed_queue(q, &RetryPolicy::none());
        for rung in p.rungs {
            options = options.queue(&acemq_amqp::retry_queue(q, *rung));
        }
    }
    if p.schedule {
        options = options.scheduler(&SchedulerOptions::new());
    }
    let connection = connect(url)?;
    let result = guarded(&connection, &receipts, outbox.as_ref(), &options);
    let _ = connection.close();
    let report = result.map_err(|e| match e {
        acemq_amqp::Error::InvalidArgument { reason } => Failure {
            code: 1,
            message: format!("nothing purged: {reason}"),
        },
        e => db.failure("purging receipts", p.table, e),
    })?;
    out.text(format!("{}: {report}", p.table));
    out.record(json!({
        "table": p.table,
        "receipts": report.receipts,
        "retired_outbox": report.retired_outbox,
        "cutoff": rfc3339_ms(report.cutoff_ms),
        "asked_cutoff": rfc3339_ms(report.asked_cutoff_ms),
        "held_by": report.held_by.as_ref().map(|h| json!({
            "queue": h.queue, "message_id": h.message_id, "first_seen": rfc3339_ms(h.first_seen_ms)
        })),
        "scanned": report.scanned,
        "beyond_retention": report.beyond_retention,
    }));
    Ok(0)
}
