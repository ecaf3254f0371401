//! The acknowledged consumer over RabbitMQ: the AMQP source and acknowledgements.

mod support;

use std::time::Duration;

use acemq_amqp::patterns::acknowledged::{
    consume_with, AmqpQueue, Batcher, CounterIncrement, CounterStore, Report, StopHandle,
};
use acemq_amqp::{Message, QueueSpec};
use support::{connect, eventually, unique, Cleanup};

const WAIT: Duration = Duration::from_secs(30);

fn counters(dir: &tempfile::TempDir) -> CounterStore {
    let store = CounterStore::builder(dir.path().join("counters.db"))
        .allow(["page_views", "signups"])
        .build()
        .unwrap();
    store.create_tables().unwrap();
    store
}

/// Runs the recipe on `q` until `done` says so, then stops it; returns its report.
fn run_until(
    conn: &acemq_amqp::Connection,
    q: &str,
    store: &CounterStore,
    batch: usize,
    done: impl Fn() -> bool,
) -> Report {
    let stop = StopHandle::new();
    let batcher = Batcher::builder()
        .batch_size(batch)
        .max_pending(2 * batch)
        .poll_interval(Duration::from_millis(20))
        .stop_handle(stop.clone())
        .build()
        .unwrap();
    std::thread::scope(|s| {
        let running = s.spawn(|| {
            // The source borrows the queue's channel and stays on this thread.
            let queue = AmqpQueue::open(conn, q, u16::try_from(2 * batch + 1).unwrap()).unwrap();
            let report = consume_with(
                queue.source().unwrap(),
                store,
                queue.acknowledger(),
                &batcher,
            );
            queue.close().unwrap();
            report
        });
        assert!(eventually(WAIT, &done), "the recipe did not get there");
        stop.stop();
        running.join().unwrap().unwrap()
    })
}

#[test]
fn over_rabbitmq_a_redelivered_message_is_acknowledged_without_repeating_its_effect() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("ack-amqp"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = counters(&dir);
    let publisher = conn.publisher().unwrap();
    let mut first = None;
    for _ in 0..100 {
        let m = Message::new(CounterIncrement::new("page_views", 1).payload());
        first.get_or_insert_with(|| m.clone());
        publisher.publish("", &q, m).unwrap();
    }
    // The first message again: the same x-acemq-id, another delivery tag.
    publisher.publish("", &q, first.unwrap()).unwrap();

    let report = run_until(&conn, &q, &store, 32, || {
        store.receipt_count().unwrap() == 100 && conn.queue_info(&q).unwrap().message_count == 0
    });
    assert_eq!(
        store.value("page_views").unwrap(),
        100,
        "the effect once per message"
    );
    assert_eq!(
        (report.acknowledged, report.replayed, report.failed),
        (101, 1, 0)
    );
    assert!(eventually(WAIT, || conn
        .queue_info(&q)
        .unwrap()
        .message_count
        == 0));
}

#[test]
fn a_rolled_back_delivery_is_never_covered_by_a_multiple_ack_and_returns_on_close() {
    let conn = connect();
    let mut clean = Cleanup::new(&conn);
    let q = clean.queue(&unique("ack-amqp-fail"));
    conn.declare_queue(&QueueSpec::new(&q)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = counters(&dir);
    let publisher = conn.publisher().unwrap();
    for i in 0..40 {
        // Message 10 names a counter that is not allowed: its batch rolls back.
        let counter = if i == 10 { "not_allowed" } else { "signups" };
        publisher
            .publish(
                "",
                &q,
                Message::new(CounterIncrement::new(counter, 1).payload()),
            )
            .unwrap();
    }
    let report = run_until(&conn, &q, &store, 1, || {
        store.value("signups").unwrap() == 39
    });
    assert_eq!(report.failed, 1);
    assert_eq!(report.acknowledged, 39);
    // Batches after the failure were acknowledged one by one: the bad delivery is back.
    assert!(eventually(WAIT, || conn
        .queue_info(&q)
        .unwrap()
        .message_count
        == 1));
    let back = conn.get(&q).unwrap().unwrap();
    let inc = CounterIncrement::from_payload(&back.body).unwrap();
    assert_eq!(inc.counter, "not_allowed");
}
