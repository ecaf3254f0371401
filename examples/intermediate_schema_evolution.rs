//! Schema evolution: the producer registers version 1 of `order.placed`, later version 2 (a new
//! optional field), and stamps each message with its schema id in an application header; the
//! consumer looks the id up in the shared registry (SQLite here) and reads both versions. A
//! message naming a schema nobody registered is dead-lettered as unprocessable, not retried.
//! Run: `cargo run --example intermediate_schema_evolution`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use acemq_amqp::patterns::schema_registry::{
    SchemaRegistry, SqlSchemaRegistry, SqlSchemaRegistryOptions,
};
use acemq_amqp::{
    dead_letter_queue, Error, FatalError, HeaderValue, JsonCodec, Message, Outcome, QueueSpec,
    Result,
};

#[path = "common/ex.rs"]
mod ex;
#[path = "common/fail.rs"]
mod fail;

/// The application's own header for the schema id (not part of the AceMQ envelope).
const SCHEMA_ID: &str = "schema-id";

fn main() {
    fail::run(example);
}

fn example() -> Result<()> {
    let dir = tempfile::tempdir().map_err(|e| Error::Io {
        context: "making a temporary directory".into(),
        source: e,
    })?;
    let path = dir.path().join("schemas.db");
    let registry = Arc::new(SqlSchemaRegistry::new(
        move || Ok(rusqlite::Connection::open(&path)?),
        SqlSchemaRegistryOptions::new(),
    )?);
    registry.create_table()?;
    let v1 = registry.register(
        "order.placed",
        "json-schema",
        r#"{"required":["order_id"]}"#,
    )?;
    let v2 = registry.register(
        "order.placed",
        "json-schema",
        r#"{"required":["order_id"],"properties":{"coupon":{}}}"#,
    )?;
    println!(
        "registered order.placed v{} (id {}) and v{} (id {})",
        v1.version, v1.id, v2.version, v2.id
    );

    let connection = ex::connect()?;
    let queue = ex::name("orders");
    connection.declare_queue(&QueueSpec::new(&queue))?;
    let read = Arc::new(AtomicUsize::new(0));
    let (r, reg) = (read.clone(), registry.clone());
    let consumer = connection.consume(&queue, move |m: &Message| {
        let id = match m.headers.get(SCHEMA_ID) {
            Some(HeaderValue::Int(id)) => *id,
            _ => return Err(FatalError::new("no schema id").into()),
        };
        let schema = reg.by_id(id).map_err(|e| FatalError::new(e.to_string()))?;
        let order: serde_json::Value = m.payload()?;
        println!(
            "  read {} with schema {} v{}: coupon {}",
            order["order_id"],
            schema.subject,
            schema.version,
            order
                .get("coupon")
                .map_or("(none: a v1 message)".to_string(), |c| c.to_string())
        );
        r.fetch_add(1, Ordering::SeqCst);
        Ok(Outcome::Accept)
    })?;
    let publisher = connection.publisher()?;
    let orders = [
        (v1.id, serde_json::json!({"order_id": "o-1"})),
        (
            v2.id,
            serde_json::json!({"order_id": "o-2", "coupon": "WINTER"}),
        ),
        (999, serde_json::json!({"order_id": "o-3"})),
    ];
    for (schema, order) in orders {
        publisher.publish(
            "",
            &queue,
            Message::encode(&JsonCodec, &order)?.with_header(SCHEMA_ID, schema),
        )?;
    }
    let dlq = dead_letter_queue(&queue);
    ex::wait_for("two read and one dead-lettered", || {
        read.load(Ordering::SeqCst) == 2
            && connection
                .queue_info(&dlq)
                .is_ok_and(|q| q.message_count == 1)
    });
    consumer.close()?;
    let dead = connection.get(&dlq)?.expect("the dead letter");
    println!("dead-lettered: {}", dead.envelope.error.unwrap_or_default());
    ex::delete_queues(&connection, &[&queue])?;
    connection.close()
}
