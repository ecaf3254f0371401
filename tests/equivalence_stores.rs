//! Equivalence (issue 38): the idempotent consumers, the transactional outbox relay and the
//! acknowledged consumer's `AmqpQueue` on SQLite stores (temporary files), each body run on
//! RabbitMQ and on the in-process `memory://` broker (`on_both!`).

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use acemq_amqp::patterns::acknowledged::{
    consume, AmqpQueue, AmqpQueueOptions, ApplyBatch, Batcher, BatcherOptions, CounterIncrement,
    CounterStore, Message as AckMessage, Receipt, Report,
};
use acemq_amqp::patterns::idempotent::{
    idempotent, idempotent_tx, IdempotentOptions, IdempotentTxBatchOptions,
};
use acemq_amqp::patterns::outbox::record_message;
use acemq_amqp::testing::wait_until;
use acemq_amqp::{
    Connection, ConsumerOptions, Error, FatalError, Message, Outcome, RetryPolicy, StopHandle,
};
use support::ack::counters;
use support::db::{sqlite_open, Db};
use support::idem::{effects_table, keys, record_effect, recorder, store, Forward};
use support::outbox::outbox_and_relay;

const WAIT: Duration = Duration::from_secs(30);

fn message_count(conn: &Connection, q: &str) -> u32 {
    conn.queue_info(q).unwrap().message_count
}

fn within(what: &str, condition: impl FnMut() -> bool) {
    if wait_until(WAIT, condition).is_err() {
        panic!("not within {WAIT:?}: {what}");
    }
}

/// Every message left on `q`, got one by one: their ids.
fn drain_ids(conn: &Connection, q: &str) -> Vec<String> {
    std::iter::from_fn(|| conn.get(q).unwrap())
        .map(|m| m.id().to_string())
        .collect()
}

/// Runs the acknowledged recipe on `q` until `done` says so, then stops it; its report.
fn run_until(
    conn: &Connection,
    q: &str,
    store: &CounterStore,
    batch: usize,
    done: impl FnMut() -> bool,
) -> Report {
    let stop = StopHandle::new();
    let batcher = Batcher::new(
        BatcherOptions::new()
            .batch_size(batch)
            .max_pending(2 * batch)
            .poll_interval(Duration::from_millis(20))
            .stop_handle(stop.clone()),
    )
    .unwrap();
    std::thread::scope(|s| {
        let running = s.spawn(|| {
            let queue = AmqpQueue::open(
                conn,
                q,
                AmqpQueueOptions::new().prefetch(u16::try_from(2 * batch + 1).unwrap()),
            )
            .unwrap();
            let report = consume(
                queue.source().unwrap(),
                store,
                queue.acknowledger(),
                &batcher,
            );
            queue.close().unwrap();
            report
        });
        let reached = wait_until(WAIT, done).is_ok();
        stop.stop();
        let report = running.join().unwrap().unwrap();
        assert!(reached, "the recipe did not get there: {report:?}");
        report
    })
}

/// A store in front of the counters that rolls back its first batch and holds its second on the
/// worker until released, so that a run can be stopped with deliveries rolled back, deliveries
/// taken by the batcher, and deliveries prefetched but not yet taken.
struct RollBackThenHold<'a> {
    counters: &'a CounterStore,
    /// The identities of the rolled-back batch, failed again when the recipe then applies them
    /// one at a time (until another batch comes).
    first: Mutex<Option<Vec<String>>>,
    batches: AtomicUsize,
    rolled_back: AtomicUsize,
    holding: AtomicBool,
    release: Mutex<Option<mpsc::Receiver<()>>>,
}

impl ApplyBatch for RollBackThenHold<'_> {
    fn apply_batch(&self, messages: &[&AckMessage]) -> acemq_amqp::Result<Vec<Receipt>> {
        let ids: Vec<String> = messages.iter().map(|m| m.identifier.clone()).collect();
        {
            let mut first = self.first.lock().unwrap();
            let rolled_back_again = match &*first {
                None => {
                    *first = Some(ids);
                    self.rolled_back.fetch_add(messages.len(), Ordering::SeqCst);
                    true
                }
                Some(f) => {
                    self.batches.load(Ordering::SeqCst) == 0 && ids.iter().all(|i| f.contains(i))
                }
            };
            if rolled_back_again {
                return Err(Error::Handler {
                    source: "the first batch rolls back".into(),
                });
            }
        }
        // The batch after the rolled-back one is held.
        if self.batches.fetch_add(1, Ordering::SeqCst) == 0 {
            let release = self.release.lock().unwrap().take().unwrap();
            self.holding.store(true, Ordering::SeqCst);
            // Released by the test (or by its end): never waits past the deadline.
            let _ = release.recv_timeout(WAIT);
        }
        self.counters.apply_batch(messages)
    }
}

on_both! {
    /// `idempotent` on SQLite: a message delivered twice (the same `x-acemq-id`) runs the
    /// handler and applies its effect once; both deliveries are acknowledged.
    fn idempotent_applies_a_duplicate_once(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-idem-dup");
        support::idem::a_duplicate_is_applied_once(&conn, &q, &Db::sqlite());
    }

    /// `idempotent` on SQLite: a handler that fails is not recorded as done — the message is
    /// dead-lettered (no retries), and the same message sent again runs the handler and applies
    /// its effect (once); a third copy is then a duplicate.
    fn idempotent_does_not_record_a_failing_handler(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-idem-fail");
        let db = Db::sqlite();
        let effects = effects_table(&db);
        let failing = Arc::new(AtomicBool::new(true));
        let ran = Arc::new(AtomicUsize::new(0));
        let (f, r) = (failing.clone(), ran.clone());
        let effect_db = db.factory();
        let effects2 = effects.clone();
        let handler = idempotent(
            store(&db),
            move |m: &Message| {
                r.fetch_add(1, Ordering::SeqCst);
                if f.load(Ordering::SeqCst) {
                    return Err("the payment service is down".into());
                }
                record_effect(&mut effect_db()?, &effects2, m.id())?;
                Ok(Outcome::Accept)
            },
            IdempotentOptions::default(),
        );
        let duplicates = handler.duplicates();
        let consumer = conn
            .consumer(&q, ConsumerOptions::new().retry(RetryPolicy::none()))
            .unwrap()
            .start(handler)
            .unwrap();
        let dlq = format!("{q}.dlq");
        let publisher = conn.publisher().unwrap();
        let m = Message::new("charge");
        let id = m.id().to_string();
        publisher.publish("", &q, m.clone()).unwrap();
        within("the failure dead-lettered", || message_count(&conn, &dlq) == 1);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert!(keys(&db, &effects).is_empty(), "no effect from the failure");

        failing.store(false, Ordering::SeqCst);
        publisher.publish("", &q, m.clone()).unwrap();
        within("the second copy applied", || keys(&db, &effects).len() == 1);
        assert_eq!(ran.load(Ordering::SeqCst), 2, "the failure was not recorded as done");
        publisher.publish("", &q, m).unwrap();
        within("the third copy settled as a duplicate", || {
            duplicates.get() == 1 && consumer.in_flight() == 0 && message_count(&conn, &q) == 0
        });
        consumer.close().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 2, "the third copy is a duplicate");
        assert_eq!(keys(&db, &effects), vec![id], "the effect applied once");
        assert_eq!(message_count(&conn, &q), 0);
        assert_eq!(message_count(&conn, &dlq), 1, "only the failure dead-lettered");
    }

    /// `idempotent_tx` on SQLite: the effect is written in the handler's transaction; a
    /// duplicate is applied once, and a handler that fails after writing its effect rolls it
    /// back and is not recorded (the message is dead-lettered; sent again it is applied).
    fn idempotent_tx_applies_once_and_rolls_back_a_failure(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-idem-tx");
        let db = Db::sqlite();
        let effects = effects_table(&db);
        let path = db.sqlite_path().to_path_buf();
        let ran = Arc::new(AtomicUsize::new(0));
        let fail_bodies = Arc::new(Mutex::new(HashSet::from([b"bad".to_vec()])));
        let (r, fb) = (ran.clone(), fail_bodies.clone());
        let effects2 = effects.clone();
        let handler = idempotent_tx(
            store(&db),
            move || sqlite_open(&path),
            move |m: &Message, tx: &mut rusqlite::Transaction<'_>| {
                r.fetch_add(1, Ordering::SeqCst);
                record_effect(tx, &effects2, m.id())?;
                if fb.lock().unwrap().contains(&m.body) {
                    return Err("failed after writing the effect".into());
                }
                Ok(Outcome::Accept)
            },
            IdempotentOptions::default(),
        );
        let duplicates = handler.duplicates();
        let consumer = conn
            .consumer(&q, ConsumerOptions::new().retry(RetryPolicy::none()))
            .unwrap()
            .start(handler)
            .unwrap();
        let dlq = format!("{q}.dlq");
        let publisher = conn.publisher().unwrap();
        let good = Message::new("good");
        let bad = Message::new("bad");
        publisher.publish("", &q, good.clone()).unwrap();
        publisher.publish("", &q, good.clone()).unwrap();
        publisher.publish("", &q, bad.clone()).unwrap();
        within("the failure dead-lettered", || message_count(&conn, &dlq) == 1);
        within("the rest settled, the copy as a duplicate", || {
            duplicates.get() == 1 && consumer.in_flight() == 0 && message_count(&conn, &q) == 0
        });
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        assert_eq!(keys(&db, &effects), vec![good.id().to_string()], "the failure rolled back");

        fail_bodies.lock().unwrap().clear();
        publisher.publish("", &q, bad.clone()).unwrap();
        within("the failed message applied when sent again", || keys(&db, &effects).len() == 2);
        within("acknowledged", || consumer.in_flight() == 0 && message_count(&conn, &q) == 0);
        consumer.close().unwrap();
        let mut expected = vec![good.id().to_string(), bad.id().to_string()];
        expected.sort();
        assert_eq!(keys(&db, &effects), expected, "each effect once");
        assert_eq!(ran.load(Ordering::SeqCst), 3, "the duplicate never ran the handler");
        assert_eq!(message_count(&conn, &q), 0);
    }

    /// The batched `idempotent_tx(..).batch(..)` on SQLite: 24 messages and a second copy of
    /// four of them, in batches of at most 8: every effect once, fewer commits than messages,
    /// the four copies counted as duplicates, everything acknowledged.
    fn batched_idempotent_tx_applies_each_effect_once(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-idem-batch");
        let db = Db::sqlite();
        let effects = effects_table(&db);
        let publisher = conn.publisher().unwrap();
        let messages: Vec<Message> = (0..24).map(|i| Message::new(format!("m{i}"))).collect();
        for m in &messages {
            publisher.publish("", &q, m.clone()).unwrap();
        }
        for m in messages.iter().step_by(6) {
            publisher.publish("", &q, m.clone()).unwrap();
        }
        let (commits, on_commit) = recorder();
        let path = db.sqlite_path().to_path_buf();
        let effects2 = effects.clone();
        let h = idempotent_tx(
            store(&db),
            move || sqlite_open(&path),
            move |m: &Message, tx: &mut rusqlite::Transaction<'_>| {
                record_effect(tx, &effects2, m.id())?;
                Ok(Outcome::Accept)
            },
            IdempotentOptions::default(),
        )
        .batch(
            IdempotentTxBatchOptions::default()
                .max_messages(8)
                .max_wait(Duration::from_millis(200))
                .on_commit(move |n| on_commit(n)),
        )
        .unwrap();
        let duplicates = h.duplicates();
        let consumer = conn
            .consumer(&q, ConsumerOptions::new().prefetch(16))
            .unwrap()
            .start(Forward(Box::new(h)))
            .unwrap();
        within("all 24 committed", || keys(&db, &effects).len() == 24);
        within("all 28 acknowledged", || {
            let i = conn.queue_info(&q).unwrap();
            i.message_count == 0 && duplicates.get() == 4 && consumer.in_flight() == 0
        });
        consumer.close().unwrap();
        let mut expected: Vec<String> = messages.iter().map(|m| m.id().to_string()).collect();
        expected.sort();
        assert_eq!(keys(&db, &effects), expected, "each effect exactly once");
        let commits = commits.lock().unwrap().clone();
        // A commit counts every message of its batch, the duplicates among them.
        assert_eq!(commits.iter().sum::<usize>(), 28, "{commits:?}");
        assert!(commits.len() < 28 && commits.iter().all(|&n| n <= 8), "{commits:?}");
        assert_eq!(duplicates.get(), 4);
        assert_eq!(message_count(&conn, &q), 0);
    }

    /// The batched `idempotent_tx(..).batch(..)` on SQLite: in a batch of 4, the handler that
    /// fails (after writing its effect) is rolled back alone and dead-lettered, not recorded;
    /// the three others are applied once and acknowledged. Sent again, the failed message is
    /// applied (it was not recorded as done).
    fn batched_idempotent_tx_does_not_record_a_failing_handler(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-idem-batch-fail");
        let db = Db::sqlite();
        let effects = effects_table(&db);
        let publisher = conn.publisher().unwrap();
        let failing = Message::new("fail");
        for m in [Message::new("ok-1"), failing.clone(), Message::new("ok-2"), Message::new("ok-3")] {
            publisher.publish("", &q, m).unwrap();
        }
        let refuse = Arc::new(AtomicBool::new(true));
        let r = refuse.clone();
        let (commits, on_commit) = recorder();
        let path = db.sqlite_path().to_path_buf();
        let effects2 = effects.clone();
        let store = store(&db);
        let idem_table = store.table().to_string();
        let h = idempotent_tx(
            store,
            move || sqlite_open(&path),
            move |m: &Message, tx: &mut rusqlite::Transaction<'_>| {
                let body = String::from_utf8_lossy(&m.body).to_string();
                record_effect(tx, &effects2, &body)?;
                if body == "fail" && r.load(Ordering::SeqCst) {
                    return Err(Box::new(FatalError::new("refused by the test")));
                }
                Ok(Outcome::Accept)
            },
            IdempotentOptions::default(),
        )
        .batch(
            IdempotentTxBatchOptions::default()
                .max_messages(4)
                .max_wait(Duration::from_secs(10))
                .on_commit(move |n| on_commit(n)),
        )
        .unwrap();
        let consumer = conn
            .consumer(&q, ConsumerOptions::new().prefetch(4).retry(RetryPolicy::none()))
            .unwrap()
            .start(Forward(Box::new(h)))
            .unwrap();
        let dlq = format!("{q}.dlq");
        within("the failure dead-lettered", || message_count(&conn, &dlq) == 1);
        within("the others acknowledged", || message_count(&conn, &q) == 0
            && consumer.in_flight() == 0);
        assert_eq!(commits.lock().unwrap().clone(), vec![4], "one transaction for the four");
        assert_eq!(keys(&db, &effects), vec!["ok-1", "ok-2", "ok-3"], "the failure rolled back");
        assert_eq!(db.count(&idem_table), 3, "receipts for the three accepted only");
        let dead = conn.get(&dlq).unwrap().expect("the dead letter");
        assert_eq!(dead.id(), failing.id());

        refuse.store(false, Ordering::SeqCst);
        publisher.publish("", &q, failing).unwrap();
        within("the failed message applied when sent again", || keys(&db, &effects).len() == 4);
        within("acknowledged", || message_count(&conn, &q) == 0 && consumer.in_flight() == 0);
        consumer.close().unwrap();
        assert_eq!(keys(&db, &effects), vec!["fail", "ok-1", "ok-2", "ok-3"]);
        assert_eq!(db.count(&idem_table), 4);
        assert_eq!(message_count(&conn, &dlq), 0);
    }

    /// The outbox: a record added in a rolled-back SQLite transaction publishes nothing; added
    /// in a committed one, the relay publishes it once (confirmed) and deletes it.
    fn outbox_publishes_a_committed_record_once(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-outbox-commit");
        support::outbox::rollback_publishes_nothing_and_commit_publishes_once(
            &conn,
            &q,
            &Db::sqlite(),
        );
    }

    /// The outbox: 150 records committed in batches, relayed by sweeps until the table is
    /// empty: each record's message arrives exactly once, in the order recorded.
    fn outbox_relay_loses_nothing(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-outbox-all");
        let db = Db::sqlite();
        let (store, table, relay) = outbox_and_relay(&conn, &db, 10);
        let mut ids = Vec::new();
        for chunk in 0..3 {
            db.in_tx(true, |tx| {
                for i in 0..50 {
                    let m = Message::new(format!("r{}", chunk * 50 + i));
                    ids.push(m.id().to_string());
                    store.add(tx, &record_message("", &q, &m).unwrap()).unwrap();
                }
            });
        }
        let mut published = 0;
        within("the table emptied", || {
            published += relay.sweep().unwrap();
            db.count(&table) == 0
        });
        assert_eq!(published, 150, "each record published once");
        assert_eq!(relay.sweep().unwrap(), 0);
        within("all 150 on the queue", || message_count(&conn, &q) == 150);
        assert_eq!(drain_ids(&conn, &q), ids, "each once, in order");
        relay.close().unwrap();
    }

    /// The outbox: a nacked publish is retried — the record stays until a later sweep's publish
    /// is confirmed, and its message then arrives once. (The nack is the memory broker's fault
    /// on demand; on RabbitMQ the common part alone runs.)
    fn outbox_retries_a_nacked_publish(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-outbox-nack");
        let db = Db::sqlite();
        let (store, table, relay) = outbox_and_relay(&conn, &db, 10);
        let m = Message::new("r1");
        let id = m.id().to_string();
        db.in_tx(true, |tx| store.add(tx, &record_message("", &q, &m).unwrap()).unwrap());
        if let Some(broker) = on.memory_broker() {
            broker.nack_next_publishes(1);
            let e = relay.sweep().unwrap_err();
            assert!(matches!(e, Error::Nacked { .. }), "{e:?}");
            assert_eq!(db.count(&table), 1, "a nacked record stays");
            assert_eq!(message_count(&conn, &q), 0, "nacked: not enqueued");
        }
        let mut published = 0;
        within("the record published and deleted", || {
            published += relay.sweep().unwrap();
            db.count(&table) == 0
        });
        assert_eq!(published, 1);
        within("the message on the queue", || message_count(&conn, &q) == 1);
        assert_eq!(drain_ids(&conn, &q), vec![id], "once");
        relay.close().unwrap();
    }

    /// The outbox: a publish the broker nacks (a full queue, `x-overflow` reject-publish) is
    /// counted against its record, which stays; once the queue has room, the next sweep
    /// publishes it, confirmed, and deletes it: its message arrives once.
    fn outbox_retries_a_publish_a_full_queue_nacked(on) {
        let (conn, _clean, q) = on.declared_queue_with("eq2-outbox-full", support::full_at_one);
        conn.publisher()
            .unwrap()
            .publish("", &q, Message::new("filler"))
            .unwrap();
        let db = Db::sqlite();
        let (store, table, relay) = outbox_and_relay(&conn, &db, 10);
        let m = Message::new("r1");
        let id = m.id().to_string();
        db.in_tx(true, |tx| {
            store.add(tx, &record_message("", &q, &m).unwrap()).unwrap()
        });
        let e = relay.sweep().unwrap_err();
        assert!(matches!(e, Error::Nacked { .. }), "{e:?}");
        assert_eq!(db.count(&table), 1, "a nacked record stays");
        let attempts = db.connect()
            .query(&format!("SELECT attempts FROM {table}"), &[])
            .unwrap();
        assert_eq!(attempts[0][0].as_i64(), Some(1), "the nack is counted");
        assert_eq!(message_count(&conn, &q), 1, "only the filler");
        let filler = conn.get(&q).unwrap().expect("the filler");
        assert_eq!(filler.body, b"filler".to_vec());
        assert_eq!(relay.sweep().unwrap(), 1, "published once there is room");
        assert_eq!(db.count(&table), 0, "deleted after the confirm");
        assert_eq!(drain_ids(&conn, &q), vec![id], "once");
        relay.close().unwrap();
    }

    /// The acknowledged consumer's `AmqpQueue` on a SQLite counter store: 40 increments and
    /// the first again (the same id): the effect once per message, all 41 acknowledged, one
    /// replayed, the queue empty.
    fn acknowledged_queue_acknowledges_a_redelivery_without_repeating_it(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-ack-dup");
        let dir = tempfile::tempdir().unwrap();
        let store = counters(&dir);
        let publisher = conn.publisher().unwrap();
        let mut first = None;
        for _ in 0..40 {
            let m = Message::new(CounterIncrement::new("page_views", 1).payload());
            first.get_or_insert_with(|| m.clone());
            publisher.publish("", &q, m).unwrap();
        }
        publisher.publish("", &q, first.unwrap()).unwrap();
        let report = run_until(&conn, &q, &store, 8, || {
            store.receipt_count().unwrap() == 40 && message_count(&conn, &q) == 0
        });
        assert_eq!(store.value("page_views").unwrap(), 40, "the effect once per message");
        assert_eq!((report.acknowledged, report.replayed, report.failed), (41, 1, 0));
        within("nothing left", || message_count(&conn, &q) == 0);
    }

    /// `AmqpQueue`: a batch that rolls back is never acknowledged; the others are, and the
    /// failed delivery is back on the queue once the run ends.
    fn acknowledged_queue_returns_a_rolled_back_delivery(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-ack-fail");
        let dir = tempfile::tempdir().unwrap();
        let store = counters(&dir);
        let publisher = conn.publisher().unwrap();
        for i in 0..20 {
            let counter = if i == 5 { "not_allowed" } else { "signups" };
            publisher
                .publish("", &q, Message::new(CounterIncrement::new(counter, 1).payload()))
                .unwrap();
        }
        let report = run_until(&conn, &q, &store, 1, || store.value("signups").unwrap() == 19);
        assert!(report.failed >= 1, "{report:?}");
        assert_eq!(report.acknowledged, 19);
        within("the bad delivery back", || message_count(&conn, &q) == 1);
        let back = conn.get(&q).unwrap().unwrap();
        let inc = CounterIncrement::from_payload(&back.body).unwrap();
        assert_eq!(inc.counter, "not_allowed");
        assert_eq!(store.value("signups").unwrap(), 19);
    }

    /// `AmqpQueue` gives one source at a time (two consumers on one channel could be covered
    /// by one `multiple` ack); dropped, the next may be taken.
    fn acknowledged_queue_gives_one_source_at_a_time(on) {
        let (conn, _clean, q) = on.declared_queue("eq2-ack-one");
        let queue = AmqpQueue::open(&conn, &q, AmqpQueueOptions::new().prefetch(4)).unwrap();
        let first = queue.source().unwrap();
        assert!(matches!(queue.source(), Err(Error::InvalidArgument { .. })));
        drop(first);
        let second = queue.source().unwrap();
        drop(second);
        queue.close().unwrap();
    }

    /// `AmqpQueue`: a second run on one queue (one channel) never acknowledges what the first
    /// run left unapplied (rolled back, taken, or prefetched and not taken): every effect is
    /// applied exactly once and each delivery acknowledged once, after its effect.
    fn acknowledged_queue_second_run_never_acknowledges_what_the_first_left(on) {
    const N: u32 = 40;
    const PREFETCH: u16 = 20;
    let (conn, _clean, q) = on.declared_queue("eq2-ack-rerun");
    let dir = tempfile::tempdir().unwrap();
    let counters = counters(&dir);
    let (release, gate) = mpsc::channel();
    let store = RollBackThenHold {
        counters: &counters,
        first: Mutex::new(None),
        batches: AtomicUsize::new(0),
        rolled_back: AtomicUsize::new(0),
        holding: AtomicBool::new(false),
        release: Mutex::new(Some(gate)),
    };
    let publisher = conn.publisher().unwrap();
    for _ in 0..N {
        let m = Message::new(CounterIncrement::new("page_views", 1).payload());
        publisher.publish("", &q, m).unwrap();
    }
    let batcher = |stop: &StopHandle| {
        Batcher::new(
            BatcherOptions::new()
                .batch_size(4)
                .max_pending(8)
                .poll_interval(Duration::from_millis(20))
                .stop_handle(stop.clone()),
        )
        .unwrap()
    };
    let (first_stop, second_stop) = (StopHandle::new(), StopHandle::new());
    let (first, second, all_applied) = std::thread::scope(|s| {
        let running = s.spawn(|| {
            // Two runs, one after the other, on one queue (one channel).
            let queue =
                AmqpQueue::open(&conn, &q, AmqpQueueOptions::new().prefetch(PREFETCH)).unwrap();
            let first = consume(
                queue.source().unwrap(),
                &store,
                queue.acknowledger(),
                &batcher(&first_stop),
            );
            let second = consume(
                queue.source().unwrap(),
                &store,
                queue.acknowledger(),
                &batcher(&second_stop),
            );
            queue.close().unwrap();
            (first, second)
        });
        // The first run has rolled back its first batch and holds its second, and the broker
        // has sent the whole prefetch. Of those 20 deliveries the batcher takes at most 8 and
        // the rolled-back batch is at most 4: the rest are prefetched and not taken.
        let first_in_place = wait_until(WAIT, || {
            store.holding.load(Ordering::SeqCst)
                && conn.queue_info(&q).unwrap().message_count == N - u32::from(PREFETCH)
        })
        .is_ok();
        first_stop.stop();
        release.send(()).ok();
        // The second run goes until every message's effect has been applied.
        let all_applied = first_in_place
            && wait_until(WAIT, || {
                counters.receipt_count().unwrap() == u64::from(N)
                    && conn.queue_info(&q).unwrap().message_count == 0
            })
            .is_ok();
        second_stop.stop();
        let (first, second) = running.join().unwrap();
        assert!(first_in_place, "the first run never held its second batch");
        (first.unwrap(), second.unwrap(), all_applied)
    });
    assert!(store.rolled_back.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        first.failed,
        store.rolled_back.load(Ordering::SeqCst) as u64
    );
    assert_eq!(
        (
            counters.value("page_views").unwrap(),
            counters.receipt_count().unwrap()
        ),
        (i64::from(N), u64::from(N)),
        "every message's effect applied exactly once (first run {first:?}, second {second:?})"
    );
    assert!(all_applied);
    assert_eq!(
        first.acknowledged + second.acknowledged,
        u64::from(N),
        "each delivery acknowledged once, after its effect"
    );
    assert_eq!(first.replayed + second.replayed, 0);
    // Only now that all were applied: nothing is left on the queue.
    assert!(wait_until(WAIT, || conn
        .queue_info(&q)
        .unwrap()
        .message_count
        == 0)
    .is_ok());
}
}
