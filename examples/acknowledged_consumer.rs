//! The acknowledged consumer without a broker: counters on a temporary SQLite file.
//!
//! ```text
//! cargo run --example acknowledged_consumer            # the database is deleted at the end
//! cargo run --example acknowledged_consumer -- --keep  # the database is kept, its path printed
//! ```
//!
//! Feeds the consumer a stream of counter increments in which some messages are delivered twice
//! (with new delivery tokens, as a broker does after a lost acknowledgement) and one batch holds
//! a message for a counter the store does not allow. Prints, in words, what became of the
//! deliveries: which were applied, which were replays, which message failed and why (its batch
//! rolled back, then applied again one message at a time), and what is left unacknowledged.

use acemq_amqp::patterns::acknowledged::{
    consume, Acknowledge, Batcher, BatcherOptions, CounterIncrement, CounterStore,
    CounterStoreOptions, Delivery, IterSource,
};

/// The largest batch: the deliveries applied in one transaction.
const BATCH_SIZE: usize = 32;
/// The counters this store lets messages change.
const ALLOWED: [&str; 2] = ["page_views", "signups"];

/// Stands in for a broker's acknowledgements: records what was acknowledged, which messages
/// failed on their own and which batches were rolled back, and why (a broker adapter would
/// requeue those deliveries after a backoff, and dead-letter a message that keeps failing on
/// its own). Borrows its records, because `consume` takes the acknowledger by value.
struct Acknowledgements<'a> {
    acknowledged: &'a mut Vec<u64>,
    rejected: &'a mut Vec<Rejected>,
    rolled_back: &'a mut Vec<RolledBack>,
}

/// One message that failed alone, through its own fault: its token, identifier, the counter it
/// asks for, and the store's reason.
struct Rejected {
    token: u64,
    identifier: String,
    counter: String,
    reason: String,
}

/// One rolled-back batch: the tokens of its deliveries, the store's reason, and the messages in
/// it that ask for a counter the store does not allow (identifier, counter).
struct RolledBack {
    tokens: Vec<u64>,
    reason: String,
    refused: Vec<(String, String)>,
}

impl Acknowledge<u64> for Acknowledgements<'_> {
    fn acknowledge(&mut self, delivery: &Delivery<u64>) -> acemq_amqp::Result<()> {
        // A broker adapter would acknowledge `delivery.acknowledgement_token` here.
        self.acknowledged.push(delivery.acknowledgement_token);
        Ok(())
    }

    fn rejected(
        &mut self,
        delivery: &Delivery<u64>,
        error: &acemq_amqp::Error,
    ) -> acemq_amqp::Result<()> {
        let counter = CounterIncrement::from_payload(&delivery.message.payload)
            .map(|i| i.counter)
            .unwrap_or_default();
        self.rejected.push(Rejected {
            token: delivery.acknowledgement_token,
            identifier: delivery.message.identifier.clone(),
            counter,
            reason: error.to_string(),
        });
        Ok(())
    }

    fn failed(
        &mut self,
        deliveries: &[Delivery<u64>],
        error: &acemq_amqp::Error,
    ) -> acemq_amqp::Result<()> {
        let refused = deliveries
            .iter()
            .filter_map(|d| {
                let increment = CounterIncrement::from_payload(&d.message.payload).ok()?;
                (!ALLOWED.contains(&increment.counter.as_str()))
                    .then(|| (d.message.identifier.clone(), increment.counter))
            })
            .collect();
        self.rolled_back.push(RolledBack {
            tokens: deliveries.iter().map(|d| d.acknowledgement_token).collect(),
            reason: error.to_string(),
            refused,
        });
        Ok(())
    }
}

/// "deliveries 129 to 160" for a contiguous run of tokens, else the list.
fn describe_tokens(tokens: &[u64]) -> String {
    match (tokens.first(), tokens.last()) {
        (Some(first), Some(last)) if last - first + 1 == tokens.len() as u64 => {
            format!("deliveries {first} to {last}")
        }
        _ => format!("deliveries {tokens:?}"),
    }
}

#[path = "common/fail.rs"]
mod fail;

fn main() {
    fail::run(demo);
}

fn demo() -> Result<(), Box<dyn std::error::Error>> {
    let keep = std::env::args().skip(1).any(|a| a == "--keep");
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("counters.db");
    let store = CounterStore::new(&path, CounterStoreOptions::new().allow(ALLOWED))?;
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
    // A batch with one message for a counter nobody may change: the whole batch is rolled back,
    // then applied again one message at a time; only that message is left unacknowledged.
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
    let (mut acknowledged, mut rejected, mut rolled_back) = (Vec::new(), Vec::new(), Vec::new());
    let acks = Acknowledgements {
        acknowledged: &mut acknowledged,
        rejected: &mut rejected,
        rolled_back: &mut rolled_back,
    };
    let batcher = Batcher::new(
        BatcherOptions::new()
            .batch_size(BATCH_SIZE)
            .max_pending(2 * BATCH_SIZE),
    )?;
    let report = consume(IterSource::new(deliveries), &store, acks, &batcher)?;
    assert_eq!(acknowledged.len() as u64, report.acknowledged);

    let applied = report.acknowledged - report.replayed;
    println!(
        "{delivered} deliveries of counter increments, applied in batches of up to {BATCH_SIZE} \
         (one database transaction per batch):"
    );
    println!(
        "- {} acknowledged: their transaction committed (their batch's, or their own after their batch \
         rolled back), and only then was each acknowledged.",
        report.acknowledged
    );
    println!(
        "  - {applied} were new: the increment and the message's receipt were committed together."
    );
    println!(
        "  - {} were replays of messages already applied (same identity, same payload, new \
         delivery token, as after a lost acknowledgement): acknowledged again, counted once.",
        report.replayed
    );
    println!(
        "- {} failed and {} left unacknowledged.",
        report.failed,
        if report.failed == 1 { "was" } else { "were" }
    );
    for r in &rejected {
        println!(
            "  - Delivery {} (message {:?}) asks to change counter {:?}, which this store does \
             not allow (it allows only {}): {}. Its batch was rolled back as a whole (one \
             transaction, all or nothing); the consumer then applied that batch's messages one \
             at a time, so the others were applied and acknowledged, and only this one failed.",
            r.token,
            r.identifier,
            r.counter,
            ALLOWED.join(" and "),
            r.reason
        );
    }
    for batch in &rolled_back {
        println!(
            "  - The batch of {} ({} deliveries) was rolled back: {}.",
            describe_tokens(&batch.tokens),
            batch.tokens.len(),
            batch.reason
        );
        for (identifier, counter) in &batch.refused {
            println!(
                "    Message {identifier:?} in it asks to change counter {counter:?}, which this \
                 store does not allow (it allows only {}). The other {} deliveries were valid, but a batch \
                 commits all or nothing, so they were rolled back with it.",
                ALLOWED.join(" and "),
                batch.tokens.len() - batch.refused.len()
            );
        }
    }
    if report.failed > 0 {
        println!(
            "  Left unacknowledged means the consumer never told the source it was done with \
             it: a broker keeps such a delivery and delivers it again (over RabbitMQ, AmqpQueue \
             requeues it after a backoff), where it fails again; after 5 such failures of its \
             own AmqpQueue sends it to its dead-letter queue with the reason and acknowledges \
             it. This demo's source is a list, so nothing comes back here."
        );
    }
    println!("Counters now:");
    println!("  page_views: {}", store.value("page_views")?);
    println!("  signups:    {}", store.value("signups")?);
    println!(
        "  receipts:   {} (one per message applied)",
        store.receipt_count()?
    );
    drop(store);
    if keep {
        let kept = dir.keep();
        println!(
            "The database is kept at {} (delete the directory when done).",
            kept.join("counters.db").display()
        );
    } else {
        drop(dir);
        println!(
            "The database was a temporary SQLite file and has been deleted; run with `-- --keep` \
             to keep it."
        );
    }
    Ok(())
}
