//! `acemq outbox status|retired|release`.

use acemq_amqp::patterns::outbox::{
    OutboxRecord, OutboxStore, SqlOutboxStore, SqlOutboxStoreOptions,
};
use serde_json::json;

use crate::db::Db;
use crate::out::{age, age_of_ms, rfc3339_ms, Out};
use crate::{Failure, OutboxArgs, OutboxCommand, Outcome};

pub fn run(url: &str, a: &OutboxArgs, out: &mut Out) -> Outcome {
    let db = Db::parse(url)?;
    // Reach the database once first: an unreachable one is exit 3, not a store error.
    drop(db.connect(false)?);
    let factory = db.clone();
    let store = SqlOutboxStore::open(
        move || factory.open(false),
        SqlOutboxStoreOptions::default()
            .table(a.table.clone())
            .max_attempts(a.max_attempts),
    )
    .map_err(|e| Failure::from_error("bad outbox options", e))?;
    let failed = |what: &str| {
        let what = format!("{what} on table {}", a.table);
        let db = &db;
        move |e| db.failure(&what, &a.table, e)
    };
    match &a.command {
        OutboxCommand::Status => {
            let stats = store.stats().map_err(failed("reading the backlog"))?;
            let retired = store.retired().map_err(failed("reading retired records"))?;
            let lag = stats.oldest_created_ms.map(age_of_ms);
            // In words: `pending 0, oldest pending - (lag)` read as a malfunction.
            let pending = match (stats.pending, lag) {
                (0, _) => "nothing pending".to_string(),
                (n, Some(lag)) => format!("pending {n}, oldest pending {} (lag)", age(lag)),
                (n, None) => format!("pending {n}"),
            };
            let retired_text = match retired.len() {
                0 => "nothing retired".to_string(),
                n => format!("retired {n}"),
            };
            let empty = if stats.pending == 0 && retired.is_empty() {
                "empty: "
            } else {
                ""
            };
            out.text(format!("{}: {empty}{pending}, {retired_text}", a.table));
            out.record(json!({
                "table": a.table,
                "pending": stats.pending,
                "oldest_pending": stats.oldest_created_ms.map(rfc3339_ms),
                "lag_ms": lag.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                "retired": retired.len(),
            }));
            Ok(0)
        }
        OutboxCommand::Retired => {
            let retired = store.retired().map_err(failed("reading retired records"))?;
            if retired.is_empty() {
                out.text(format!("{}: no retired records", a.table));
            }
            for r in &retired {
                show(r, out);
            }
            Ok(0)
        }
        OutboxCommand::Release { id, all } => {
            let retired = store.retired().map_err(failed("reading retired records"))?;
            let ids: Vec<i64> = if *all {
                retired.iter().map(|r| r.id).collect()
            } else {
                let id = id.unwrap_or_default();
                if !retired.iter().any(|r| r.id == id) {
                    return Err(Failure::failed(format!(
                        "record {id} is not retired in {} (no such record, or it is still \
                         pending): nothing released",
                        a.table
                    )));
                }
                vec![id]
            };
            for id in &ids {
                store.release(*id).map_err(failed("releasing a record"))?;
                out.text(format!("released record {id}"));
                out.record(json!({ "released": id }));
            }
            out.text(format!(
                "{}: released {} record(s); the relay publishes them on its next sweep",
                a.table,
                ids.len()
            ));
            Ok(0)
        }
    }
}

fn show(r: &OutboxRecord, out: &Out) {
    let created = age_of_ms(r.created_ms);
    out.text(format!(
        "retired {}  exchange={:?}  routing-key={:?}  attempts={}  age={}  last-error={}",
        r.id,
        r.exchange,
        r.routing_key,
        r.attempts,
        age(created),
        r.last_error.as_deref().unwrap_or("-")
    ));
    out.record(json!({
        "retired": r.id,
        "exchange": r.exchange,
        "routing_key": r.routing_key,
        "attempts": r.attempts,
        "created": rfc3339_ms(r.created_ms),
        "age_ms": u64::try_from(created.as_millis()).unwrap_or(u64::MAX),
        "last_error": r.last_error,
        "message_id": r.headers.get(acemq_amqp::headers::ID).and_then(|v| v.as_str()),
    }));
}
