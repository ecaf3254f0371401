//! The acknowledged consumer without a broker: counters on a temporary SQLite file.
//!
//! ```text
//! cargo run --example acknowledged_consumer
//! ```
//!
//! Feeds the consumer a stream of counter increments in which some messages are delivered twice
//! (with new delivery tokens, as a broker does after a lost acknowledgement) and one batch holds
//! a message for a counter the store does not allow. Prints the report and the counters.

use acemq_amqp::patterns::acknowledged::{
    consume, CounterIncrement, CounterStore, Delivery, IterSource,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("counters.db");
    let store = CounterStore::builder(&path)
        .allow(["page_views", "signups"])
        .build()?;
    store.create_tables()?;

    let mut deliveries = Vec::new();
    let mut token = 0_u64;
    let mut deliver = |message| {
        token += 1;
        deliveries.push(Delivery::new(message, token));
    };
    let page = |n: usize| {
        let counter = if n.is_multiple_of(10) {
            "signups"
        } else {
            "page_views"
        };
        CounterIncrement::new(counter, 1).message(format!("web/{counter}/{n}"))
    };
    // Three batches of new messages (96); their identities are scoped by source and operation.
    for n in 0..96 {
        deliver(page(n));
    }
    // The broker redelivers 32 of them with new tokens (their acknowledgements were lost, say):
    // acknowledged again, not applied again.
    for n in 0..32 {
        deliver(page(n));
    }
    // A batch with one message for a counter nobody may change: the whole batch is rolled back
    // and left unacknowledged.
    for n in 96..112 {
        deliver(page(n));
    }
    deliver(CounterIncrement::new("admin_override", 1_000).message("web/admin/1"));
    for n in 112..127 {
        deliver(page(n));
    }
    // The consumer carries on with the next batch.
    for n in 127..137 {
        deliver(page(n));
    }

    let delivered = deliveries.len();
    let mut acknowledged_tokens = Vec::new();
    let report = consume(
        IterSource::new(deliveries),
        &store,
        |d: &Delivery<u64>| {
            // A broker adapter would ack `d.acknowledgement_token` here.
            acknowledged_tokens.push(d.acknowledgement_token);
            Ok(())
        },
        32,
        64,
    )?;

    println!("database:     {}", path.display());
    println!("delivered:    {delivered}");
    println!("acknowledged: {}", report.acknowledged);
    println!("replayed:     {}", report.replayed);
    println!("failed:       {} (left unacknowledged)", report.failed);
    println!("page_views:   {}", store.value("page_views")?);
    println!("signups:      {}", store.value("signups")?);
    println!("receipts:     {}", store.receipt_count()?);
    assert_eq!(acknowledged_tokens.len() as u64, report.acknowledged);
    Ok(())
}
