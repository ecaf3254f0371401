//! RabbitMQ 4.x's quorum delivery limit (issue 46): a message the library puts back without
//! having failed it is never spent by the broker's count of its returns (`x-delivery-count`,
//! limit 20 by default since 4.0; past it the broker drops a message whose queue has no
//! dead-letter target). Every test runs on whichever broker the suite is given and asserts the
//! same: on 3.x the queue has no limit, on 4.x these failed before the library put messages back
//! as fresh copies (`src/consume/owner/put_back.rs`).

mod support;

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::Duration;

use acemq_amqp::testing::{Cleanup, MemoryBroker};
use acemq_amqp::ConnectionOptions;
use acemq_amqp::{Connection, ConsumerOptions, Message, Outcome, QueueSpec};
use support::{amqp_url, connect_with, eventually, publish_n, unique};

const WAIT: Duration = Duration::from_secs(30);
/// Messages held by the restarted consumer.
const HELD: usize = 30;

/// Every message on `queue`, read with a plain consumer until `n` distinct ids are seen (or the
/// deadline): the ids.
fn drain_ids(conn: &Connection, queue: &str, n: usize) -> BTreeSet<String> {
    let (consumer, got) = support::collect(conn, queue);
    eventually(WAIT, || {
        got.lock()
            .unwrap()
            .iter()
            .map(|m| m.id().to_string())
            .collect::<BTreeSet<_>>()
            .len()
            >= n
    });
    consumer.close().expect("close the reader");
    let ids = got
        .lock()
        .unwrap()
        .iter()
        .map(|m| m.id().to_string())
        .collect();
    ids
}

/// A deploy restarts a consumer fifty times while it holds messages it received and never
/// started (prefetched behind a running handler). Each close gives them back; on 4.x each
/// `basic.nack` was a counted return, and past twenty the broker dropped them from the quorum
/// queue (no dead-letter target): all but the started one were gone.
fn restarted(url: &str) {
    let conn = connect_with(ConnectionOptions::new().address(url));
    let mut clean = Cleanup::new(url);
    let q = clean.consumed_queue(&unique("dl-restart"), &[]);
    conn.declare_queue(&QueueSpec::new(&q))
        .expect("a quorum queue");
    // Thirty: the one started each round goes to the back, so each of the others waits behind
    // a running handler for up to 29 restarts in a row, more than the 4.x limit of 20.
    let sent: BTreeSet<String> = publish_n(&conn, &q, HELD, true).into_iter().collect();
    let mut requeued = 0;
    for round in 0..50 {
        let (started_tx, started) = mpsc::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let released = std::sync::Mutex::new(released);
        // One worker: the first message it takes blocks until the test lets it go, so the other
        // 29 wait in the consumer, received and not started. The started one is put back as
        // a fresh copy (`InProgress` with no wait), which the broker never counts.
        let consumer = conn
            .consumer(
                &q,
                ConsumerOptions::new()
                    .declare(false)
                    .prefetch(HELD as u16)
                    .concurrency(1),
            )
            .unwrap()
            .start(move |_: &Message| {
                let _ = started_tx.send(());
                let _ = released.lock().unwrap().recv_timeout(WAIT);
                Ok(Outcome::InProgress {
                    delay: Duration::ZERO,
                })
            })
            .expect("the consumer starts");
        started.recv_timeout(WAIT).expect("a handler started");
        assert!(
            eventually(WAIT, || conn
                .queue_info(&q)
                .is_ok_and(|i| i.message_count == 0)),
            "round {round}: the broker delivered them all"
        );
        // Stop taking new messages first, then let the running handler end: what is left in
        // the consumer was received and never started.
        consumer.stop_handle().stop();
        release.send(()).unwrap();
        let report = consumer.close().expect("close");
        assert_eq!(report.abandoned, 0, "round {round}: {report:?}");
        requeued += report.requeued;
        assert!(
            eventually(WAIT, || conn
                .queue_info(&q)
                .is_ok_and(|i| i.message_count as usize == HELD)),
            "round {round}: all {HELD} are back on {q} (found {:?})",
            conn.queue_info(&q).map(|i| i.message_count)
        );
    }
    assert!(
        requeued >= 50 * (HELD - 2),
        "the rounds gave back what they held unstarted: {requeued}"
    );
    let ids = drain_ids(&conn, &q, sent.len());
    assert_eq!(ids, sent, "every message survived fifty restarts");
}

/// A person inspects a quorum queue (a `.dlq` on a vhost whose queues are quorum by default)
/// fifty times. Each peek returned what it read with a counted `basic.nack`; on 4.x the broker
/// dropped every message after twenty peeks.
fn peeked(url: &str) {
    use acemq_amqp::patterns::peek::{peek, peek_unordered};
    let conn = connect_with(ConnectionOptions::new().address(url));
    let mut clean = Cleanup::new(url);
    let q = clean.queue(&unique("dl-peek"));
    conn.declare_queue(&QueueSpec::new(&q))
        .expect("a quorum queue");
    let sent: BTreeSet<String> = publish_n(&conn, &q, 3, true).into_iter().collect();
    let refused = peek(&conn, &q, 10).unwrap_err();
    assert!(refused.to_string().contains("quorum"), "{refused}");
    for round in 0..50 {
        let seen: BTreeSet<String> = peek_unordered(&conn, &q, 10)
            .unwrap_or_else(|e| panic!("peek {round}: {e}"))
            .iter()
            .map(|m| m.id().to_string())
            .collect();
        assert_eq!(seen, sent, "peek {round} saw every message");
    }
    assert_eq!(conn.queue_info(&q).unwrap().message_count, 3);
    let ids = drain_ids(&conn, &q, sent.len());
    assert_eq!(ids, sent, "every message survived fifty peeks");
}

/// Fifty consumers of one quorum queue of three messages, each closed (shutdown timeout 50 ms)
/// while its handler — single or batch, made by `handler` from a "started" sender and a
/// "release" receiver — is still running: each close abandons `abandoned` handlers' messages,
/// and all three must be back on the queue every time, and readable at the end.
fn fifty_abandoned_closes<H>(
    url: &str,
    name: &str,
    prefetch: u16,
    abandoned: usize,
    handler: impl Fn(mpsc::Sender<()>, mpsc::Receiver<()>) -> H,
) where
    H: acemq_amqp::Handler + Send + Sync + 'static,
{
    let conn = connect_with(ConnectionOptions::new().address(url));
    let mut clean = Cleanup::new(url);
    let q = clean.consumed_queue(&unique(name), &[]);
    conn.declare_queue(&QueueSpec::new(&q))
        .expect("a quorum queue");
    let sent: BTreeSet<String> = publish_n(&conn, &q, 3, true).into_iter().collect();
    for round in 0..50 {
        let (started_tx, started) = mpsc::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let consumer = conn
            .consumer(
                &q,
                ConsumerOptions::new()
                    .declare(false)
                    .prefetch(prefetch)
                    .concurrency(1)
                    .shutdown_timeout(Duration::from_millis(50)),
            )
            .unwrap()
            .start(handler(started_tx, released))
            .expect("the consumer starts");
        started.recv_timeout(WAIT).expect("a handler started");
        let report = consumer.close().expect("close");
        assert_eq!(report.abandoned, abandoned, "round {round}: {report:?}");
        release.send(()).unwrap();
        assert!(
            eventually(WAIT, || conn
                .queue_info(&q)
                .is_ok_and(|i| i.message_count == 3)),
            "round {round}: all three are back on {q} (found {:?})",
            conn.queue_info(&q).map(|i| i.message_count)
        );
    }
    let ids = drain_ids(&conn, &q, sent.len());
    assert_eq!(ids, sent, "every message survived fifty abandoned closes");
}

/// A handler still running when the consumer's shutdown deadline passes is abandoned. Its
/// delivery was left to the channel's close, which RabbitMQ 4.x counts as a return: a message
/// whose handler outlived fifty closes was dropped after twenty. Now the closing consumer gives
/// it back itself, by the rule of `put_back.rs`, and drops the handler's late result.
fn abandoned(url: &str) {
    fifty_abandoned_closes(url, "dl-abandon", 1, 1, |started, released| {
        let released = std::sync::Mutex::new(released);
        move |_: &Message| {
            let _ = started.send(());
            let _ = released.lock().unwrap().recv_timeout(WAIT);
            // Late: the consumer gave the message back already; this is dropped.
            Ok(Outcome::Accept)
        }
    });
}

/// A batch handler gathering every message (`Handler::batch_limits`), still running when the
/// consumer's shutdown deadline passes: the whole batch — all three, as the report's count of
/// abandoned handlers says — is abandoned. Its deliveries were left to
/// the channel's close, a return RabbitMQ 4.x counts, so after twenty rounds they were dropped.
/// The closing consumer now gives them back as it does a single handler's.
fn abandoned_batch(url: &str) {
    struct Blocking {
        started: mpsc::Sender<()>,
        released: std::sync::Mutex<mpsc::Receiver<()>>,
    }
    impl acemq_amqp::Handler for Blocking {
        fn handle(&self, _: &Message) -> acemq_amqp::HandlerResult {
            unreachable!("a batch handler is called with batches")
        }
        fn batch_limits(&self) -> Option<(usize, Duration)> {
            Some((3, Duration::from_secs(5)))
        }
        fn handle_batch(
            &self,
            messages: &[&Message],
        ) -> Vec<std::thread::Result<acemq_amqp::HandlerResult>> {
            let _ = self.started.send(());
            let _ = self.released.lock().unwrap().recv_timeout(WAIT);
            // Late: the consumer gave the batch back already; these are dropped.
            messages.iter().map(|_| Ok(Ok(Outcome::Accept))).collect()
        }
    }
    fifty_abandoned_closes(url, "dl-abandon-batch", 3, 3, |started, released| {
        Blocking {
            started,
            released: std::sync::Mutex::new(released),
        }
    });
}

/// An operator looks at what a replay would move, fifty times, on a quorum queue (a dry run
/// holds every message it reads and returns them at the end). On 4.x each return was counted and
/// the broker dropped every message after twenty dry runs.
fn dry_run_replayed(url: &str) {
    use acemq_amqp::patterns::replay::{replay, ReplayOptions};
    let conn = connect_with(ConnectionOptions::new().address(url));
    let mut clean = Cleanup::new(url);
    let q = clean.queue(&unique("dl-replay"));
    conn.declare_queue(&QueueSpec::new(&q))
        .expect("a quorum queue");
    let sent: BTreeSet<String> = publish_n(&conn, &q, 3, true).into_iter().collect();
    for round in 0..50 {
        let report = replay(&conn, &q, ReplayOptions::default().dry_run(true))
            .run()
            .unwrap_or_else(|e| panic!("dry run {round}: {e}"));
        assert_eq!(report.matched, 3, "dry run {round}: {report:?}");
    }
    assert!(eventually(WAIT, || conn
        .queue_info(&q)
        .is_ok_and(|i| i.message_count == 3)));
    let ids = drain_ids(&conn, &q, sent.len());
    assert_eq!(ids, sent, "every message survived fifty dry runs");
}

/// Each scenario on the tests' RabbitMQ, and on the in-process broker in both of the modes it
/// follows: RabbitMQ 4.x (its default: the delivery limit of 20) and 3.10.
macro_rules! everywhere {
    ($($test:ident: $body:ident),* $(,)?) => {$(
        mod $test {
            use super::*;

            #[test]
            fn on_rabbitmq() {
                $body(&amqp_url());
            }

            #[test]
            fn on_memory_following_rabbitmq_4() {
                let broker = MemoryBroker::named(&unique(stringify!($test)));
                assert_eq!(broker.rabbitmq(), 4, "the in-process broker follows 4.x by default");
                let conn = connect_with(ConnectionOptions::new().address(broker.url()));
                assert_eq!(conn.broker_major(), Some(4));
                $body(&broker.url());
            }

            #[test]
            fn on_memory_following_rabbitmq_3() {
                let broker = MemoryBroker::named(&unique(stringify!($test))).rabbitmq_major(3);
                $body(&broker.url());
            }
        }
    )*};
}

everywhere! {
    a_consumer_restarted_fifty_times_with_prefetched_messages_loses_none: restarted,
    peeking_a_quorum_queue_fifty_times_destroys_nothing: peeked,
    a_handler_outliving_fifty_shutdown_deadlines_loses_its_message_none_of_the_times: abandoned,
    a_batch_handler_outliving_fifty_shutdown_deadlines_loses_none_of_its_batch: abandoned_batch,
    fifty_dry_runs_of_a_replay_of_a_quorum_queue_destroy_nothing: dry_run_replayed,
}

/// Where the broker's limit does fire — a message returned past it, as a consumer crashing on it
/// again and again does — a queue in the family's dead-letter form sends it to `.dlq`, where the
/// reason reads in words though it carries no `x-acemq-error`. (An explicit `x-delivery-limit`
/// of 2, so that both majors have one: 3.x has no default.)
#[test]
fn a_message_past_the_brokers_delivery_limit_lands_in_the_dlq_with_the_reason_in_words() {
    use acemq_amqp::patterns::peek::peek;
    use acemq_amqp::HeaderValue;
    let conn = support::connect();
    let mut clean = Cleanup::new(amqp_url());
    let q = clean.consumed_queue(&unique("dl-fires"), &[]);
    conn.declare_queue(
        &QueueSpec::new(&q)
            .with_dead_letter()
            .argument("x-delivery-limit", HeaderValue::Int(2)),
    )
    .unwrap();
    // The consumer's own topology: `acemq.dlx` and `{q}.dlq`.
    conn.consumer(&q, ConsumerOptions::new()).unwrap();
    let sent = publish_n(&conn, &q, 1, true);
    let raw = support::raw::Raw::open();
    let dlq = acemq_amqp::dead_letter_queue(&q);
    assert!(
        eventually(WAIT, || {
            if let Ok(Some(got)) = raw.channel.basic_get(q.as_str(), false) {
                let _ = got.delivery.nack(&raw.channel, true);
            }
            conn.queue_info(&dlq).is_ok_and(|i| i.message_count == 1)
        }),
        "returned past its limit, it reached {dlq}"
    );
    raw.close();
    let seen = peek(&conn, &dlq, 10).unwrap();
    assert_eq!(seen[0].id(), sent[0]);
    assert_eq!(
        seen[0].envelope.error, None,
        "no x-acemq-error: the broker moved it"
    );
    let reason = seen[0].failure_reason().expect("a reason");
    assert!(
        reason.contains("delivery limit")
            && reason.contains("(delivery_limit)")
            && reason.contains(&q),
        "{reason}"
    );
}
