//! The acknowledged consumer over RabbitMQ: the AMQP source and acknowledgements — backoff,
//! dead-lettering, outages. The scenarios that run the same on the `memory://` broker (a
//! redelivery replayed, a rolled-back delivery returned, a second run on one queue) are written
//! once, in the on-both `equivalence_stores.rs`.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use acemq_amqp::patterns::acknowledged::{
    consume, AmqpQueue, AmqpQueueOptions, ApplyBatch, Batcher, BatcherOptions, CounterIncrement,
    CounterStore, Message as AckMessage, Receipt, Report,
};
use acemq_amqp::{Error, Message, StopHandle};
use support::ack::counters;
use support::eventually;

const WAIT: Duration = Duration::from_secs(30);

/// Waits (within the deadline) until exactly `n` messages are ready on `q`.
fn assert_left_on(conn: &acemq_amqp::Connection, q: &str, n: u32) {
    assert!(
        eventually(WAIT, || conn.queue_info(q).unwrap().message_count == n),
        "{q} did not come to {n} ready messages (found {:?})",
        conn.queue_info(q).map(|i| i.message_count)
    );
}

/// Publishes `n` counter increments to `q`, confirmed, the i-th for counter `counter(i)`;
/// returns their ids.
fn publish_increments(
    conn: &acemq_amqp::Connection,
    q: &str,
    n: usize,
    counter: impl Fn(usize) -> &'static str,
) -> Vec<String> {
    let publisher = conn.publisher().unwrap();
    (0..n)
        .map(|i| {
            let m = Message::new(CounterIncrement::new(counter(i), 1).payload());
            let id = m.id().to_string();
            publisher.publish("", q, m).unwrap();
            id
        })
        .collect()
}

/// A batcher of up to `batch` with at most `max_pending` taken, polling every 20 ms, and the
/// handle that stops it.
fn stoppable_batcher(batch: usize, max_pending: usize) -> (Batcher, StopHandle) {
    let stop = StopHandle::new();
    let batcher = Batcher::new(
        BatcherOptions::new()
            .batch_size(batch)
            .max_pending(max_pending)
            .poll_interval(Duration::from_millis(20))
            .stop_handle(stop.clone()),
    )
    .unwrap();
    (batcher, stop)
}

/// A store in front of the counters whose commits fail (a database error) until it has rolled
/// back `fail_deliveries` deliveries, then works.
struct FailingCommits {
    counters: CounterStore,
    fail_deliveries: usize,
    rolled_back: AtomicUsize,
}

impl ApplyBatch for FailingCommits {
    fn apply_batch(&self, messages: &[&AckMessage]) -> acemq_amqp::Result<Vec<Receipt>> {
        if self.rolled_back.load(Ordering::SeqCst) < self.fail_deliveries {
            self.rolled_back.fetch_add(messages.len(), Ordering::SeqCst);
            return Err(Error::Sql {
                context: "committing the batch".into(),
                source: "database is locked".into(),
            });
        }
        self.counters.apply_batch(messages)
    }
}

/// Stops a run started by [`run_on_a_thread`] and returns its result, within the deadline.
fn stop_and_join(
    stop: &StopHandle,
    done: &mpsc::Receiver<acemq_amqp::Result<Report>>,
    running: std::thread::JoinHandle<()>,
) -> acemq_amqp::Result<Report> {
    stop.stop();
    let report = done
        .recv_timeout(WAIT)
        .expect("the run did not return within its deadline after being stopped");
    running.join().unwrap();
    report
}

/// Sets a queue's options before its run.
type Configure = Box<dyn FnOnce(AmqpQueueOptions) -> AmqpQueueOptions + Send>;

/// Runs the recipe on `q` on a thread of its own, so that a stalled run fails a test (bounded
/// by deadlines) instead of hanging it; its result arrives on the receiver.
fn run_on_a_thread<S: ApplyBatch + Send + 'static>(
    conn: &acemq_amqp::Connection,
    q: &str,
    prefetch: u16,
    configure: Option<Configure>,
    store: std::sync::Arc<S>,
    batcher: Batcher,
) -> (
    mpsc::Receiver<acemq_amqp::Result<Report>>,
    std::thread::JoinHandle<()>,
) {
    let (done_tx, done) = mpsc::channel();
    let (conn, q) = (conn.clone(), q.to_string());
    let running = std::thread::spawn(move || {
        let run = || -> acemq_amqp::Result<Report> {
            let options = AmqpQueueOptions::new().prefetch(prefetch);
            let options = match configure {
                Some(configure) => configure(options),
                None => options,
            };
            let queue = AmqpQueue::open(&conn, &q, options)?;
            let report = consume(queue.source()?, &store, queue.acknowledger(), &batcher);
            queue.close()?;
            report
        };
        done_tx.send(run()).ok();
    });
    (done, running)
}

#[test]
fn failed_batches_do_not_exhaust_the_prefetch_and_stall_the_run() {
    const N: u32 = 20;
    const PREFETCH: u16 = 4;
    let (conn, _clean, q) = support::declared_consumed_queue("ack-amqp-stall");
    let dir = tempfile::tempdir().unwrap();
    // The first commits fail until as many deliveries as the prefetch were rolled back: held
    // unacknowledged, they would fill the prefetch and the broker would send nothing more.
    let store = std::sync::Arc::new(FailingCommits {
        counters: counters(&dir),
        fail_deliveries: usize::from(PREFETCH),
        rolled_back: AtomicUsize::new(0),
    });
    publish_increments(&conn, &q, N as usize, |_| "page_views");
    // Batches of one: a failed batch of more would be applied again message by message, and
    // the database "locked" for those too would count more rolled-back applies than deliveries.
    let (batcher, stop) = stoppable_batcher(1, usize::from(PREFETCH) - 1);
    let (done, running) = run_on_a_thread(&conn, &q, PREFETCH, None, store.clone(), batcher);
    let mut ended_early = None;
    let all_applied = eventually(WAIT, || {
        if ended_early.is_none() {
            ended_early = done.try_recv().ok();
        }
        ended_early.is_some() || store.counters.receipt_count().unwrap() == u64::from(N)
    }) && ended_early.is_none();
    stop.stop();
    let report = match ended_early {
        Some(r) => r,
        None => done
            .recv_timeout(WAIT)
            .expect("the run did not return within its deadline after being stopped"),
    };
    running.join().unwrap();
    let rolled_back = store.rolled_back.load(Ordering::SeqCst);
    assert!(rolled_back >= usize::from(PREFETCH));
    assert!(
        all_applied,
        "the run stalled: {} of {N} messages applied, {} ready on the queue, {rolled_back} \
         deliveries rolled back, run result {report:?}",
        store.counters.receipt_count().unwrap(),
        conn.queue_info(&q).unwrap().message_count
    );
    let report = report.unwrap();
    assert_eq!(
        (
            store.counters.value("page_views").unwrap(),
            store.counters.receipt_count().unwrap()
        ),
        (i64::from(N), u64::from(N)),
        "every message's effect applied exactly once ({report:?})"
    );
    assert_eq!(report.acknowledged, u64::from(N), "{report:?}");
    assert_eq!(report.failed, rolled_back as u64, "{report:?}");
    assert_left_on(&conn, &q, 0);
}

/// The counters, recording when each batch holding the poisoned message was tried.
struct PoisonWatch {
    counters: CounterStore,
    poisoned_tries: Mutex<Vec<Instant>>,
}

impl PoisonWatch {
    fn on(dir: &tempfile::TempDir) -> std::sync::Arc<PoisonWatch> {
        std::sync::Arc::new(PoisonWatch {
            counters: counters(dir),
            poisoned_tries: Mutex::new(Vec::new()),
        })
    }
}

impl ApplyBatch for PoisonWatch {
    fn apply_batch(&self, messages: &[&AckMessage]) -> acemq_amqp::Result<Vec<Receipt>> {
        let poisoned = messages.iter().any(|m| {
            CounterIncrement::from_payload(&m.payload).is_ok_and(|i| i.counter == "not_allowed")
        });
        // A rolled-back batch is applied again message by message: a try of the poisoned
        // message is the one where it is alone.
        if poisoned && messages.len() == 1 {
            self.poisoned_tries.lock().unwrap().push(Instant::now());
        }
        self.counters.apply_batch(messages)
    }
}

#[test]
fn a_message_that_always_fails_is_requeued_with_a_growing_backoff_until_its_last_attempt() {
    const N: usize = 20;
    const PREFETCH: u16 = 4;
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_millis(400);
    let (conn, _clean, q) = support::declared_consumed_queue("ack-amqp-poison");
    {
        // The backoff is checked.
        let options = || AmqpQueueOptions::new().prefetch(PREFETCH);
        let backoff = |first, max| {
            AmqpQueue::open(
                &conn,
                &q,
                options()
                    .requeue_backoff_first(first)
                    .requeue_backoff_max(max),
            )
        };
        assert!(matches!(
            backoff(Duration::ZERO, MAX),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            backoff(MAX, FIRST),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            backoff(FIRST, Duration::MAX),
            Err(Error::InvalidArgument { .. })
        ));
        // And so is the dead-letter limit.
        let zero = AmqpQueue::open(&conn, &q, options().dead_letter_after(0)).map(|_| ());
        assert!(
            matches!(&zero, Err(Error::InvalidArgument { reason }) if reason.contains("at least 1")),
            "{zero:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let store = PoisonWatch::on(&dir);
    // Message 3 names a counter that is not allowed: every batch holding it rolls back.
    publish_increments(
        &conn,
        &q,
        N,
        |i| if i == 3 { "not_allowed" } else { "signups" },
    );
    let (batcher, stop) = stoppable_batcher(2, usize::from(PREFETCH) - 1);
    // Dead-lettered after ten failures of its own: long after this test has seen six.
    let (done, running) = run_on_a_thread(
        &conn,
        &q,
        PREFETCH,
        Some(Box::new(|options: AmqpQueueOptions| {
            options
                .requeue_backoff_first(FIRST)
                .requeue_backoff_max(MAX)
                .dead_letter_after(10)
        })),
        store.clone(),
        batcher,
    );
    // Every other message gets through (the jitter parts it from the poisoned one), and the
    // poisoned one keeps coming back, until its backoff is capped.
    let got_there = eventually(WAIT, || {
        store.counters.value("signups").unwrap() == N as i64 - 1
            && store.poisoned_tries.lock().unwrap().len() >= 6
    });
    let report = stop_and_join(&stop, &done, running);
    let tries = store.poisoned_tries.lock().unwrap().clone();
    assert!(
        got_there,
        "{} of {} others applied, the poisoned message tried {} times ({report:?})",
        store.counters.value("signups").unwrap(),
        N - 1,
        tries.len()
    );
    let report = report.unwrap();
    // No hot loop: after its n-th consecutive failure the message waits at least half of
    // FIRST × 2^(n-1), capped at MAX.
    for (n, pair) in (1_u32..).zip(tries.windows(2)) {
        let least = FIRST.saturating_mul(1 << (n - 1).min(16)).min(MAX) / 2;
        assert!(
            pair[1] - pair[0] >= least,
            "try {} came {:?} after try {n}, before its backoff of at least {least:?}",
            n + 1,
            pair[1] - pair[0]
        );
    }
    assert_eq!(report.acknowledged, N as u64 - 1, "{report:?}");
    assert!(report.failed >= tries.len() as u64, "{report:?}");
    assert_eq!(store.counters.receipt_count().unwrap(), N as u64 - 1);
    // Never acknowledged: back on the queue once the run is over.
    assert_left_on(&conn, &q, 1);
    let back = conn.get(&q).unwrap().unwrap();
    let inc = CounterIncrement::from_payload(&back.body).unwrap();
    assert_eq!(inc.counter, "not_allowed");
}

/// Runs the recipe on `q` (batches of 4, backoff 10–100 ms) dead-lettering after `attempts`
/// failures of a message's own; returns the stop handle, the result's receiver and the thread.
fn run_dead_lettering<S: ApplyBatch + Send + 'static>(
    conn: &acemq_amqp::Connection,
    q: &str,
    prefetch: u16,
    attempts: u32,
    store: std::sync::Arc<S>,
) -> (
    StopHandle,
    mpsc::Receiver<acemq_amqp::Result<Report>>,
    std::thread::JoinHandle<()>,
) {
    let (batcher, stop) = stoppable_batcher(4, usize::from(prefetch) - 1);
    let (done, running) = run_on_a_thread(
        conn,
        q,
        prefetch,
        Some(Box::new(move |options: AmqpQueueOptions| {
            options
                .requeue_backoff_first(Duration::from_millis(10))
                .requeue_backoff_max(Duration::from_millis(100))
                .dead_letter_after(attempts)
        })),
        store,
        batcher,
    );
    (stop, done, running)
}

/// Once `q` is empty (the original acknowledged after its copy was confirmed), the one dead
/// letter of `q`: it keeps the message's identity and says why, after how many attempts.
fn the_dead_letter(
    conn: &acemq_amqp::Connection,
    q: &str,
    id: &str,
    attempts: u32,
    reason: &str,
) -> Message {
    assert_left_on(conn, q, 0);
    let dlq = acemq_amqp::dead_letter_queue(q);
    let dead = conn.get(&dlq).unwrap().expect("the dead letter");
    assert_eq!(dead.id(), id, "the copy keeps the message's identity");
    let error = dead.envelope.error.clone().unwrap_or_default();
    assert!(
        error.starts_with(&format!("exhausted {attempts} attempts: ")) && error.contains(reason),
        "x-acemq-error: {error:?}"
    );
    dead
}

#[test]
fn a_message_the_store_always_refuses_is_dead_lettered_with_the_reason_after_its_attempts() {
    const N: usize = 20;
    const PREFETCH: u16 = 8;
    const ATTEMPTS: u32 = 3;
    let (conn, _clean, q) = support::declared_consumed_queue("ack-amqp-dlq");
    let dir = tempfile::tempdir().unwrap();
    let store = PoisonWatch::on(&dir);
    // Message 3 names a counter that is not allowed: the store refuses it every time.
    let ids = publish_increments(
        &conn,
        &q,
        N,
        |i| if i == 3 { "not_allowed" } else { "signups" },
    );
    let poisoned_id = ids[3].clone();
    let (stop, done, running) = run_dead_lettering(&conn, &q, PREFETCH, ATTEMPTS, store.clone());
    let dlq = acemq_amqp::dead_letter_queue(&q);
    let dead_lettered = || conn.queue_info(&dlq).is_ok_and(|i| i.message_count == 1);
    let got_there = eventually(WAIT, || {
        store.counters.value("signups").unwrap() == N as i64 - 1 && dead_lettered()
    });
    let report = stop_and_join(&stop, &done, running);
    assert!(
        got_there,
        "{} of {} others applied, dead-lettered: {}, the poisoned message tried {} times \
         ({report:?})",
        store.counters.value("signups").unwrap(),
        N - 1,
        dead_lettered(),
        store.poisoned_tries.lock().unwrap().len()
    );
    let report = report.unwrap();
    // Its batchmates were applied with it out of the way; it failed exactly its attempts.
    assert_eq!(report.acknowledged, N as u64 - 1, "{report:?}");
    assert_eq!(report.failed, u64::from(ATTEMPTS), "{report:?}");
    assert_eq!(
        store.poisoned_tries.lock().unwrap().len(),
        ATTEMPTS as usize
    );
    assert_eq!(store.counters.receipt_count().unwrap(), N as u64 - 1);
    let dead = the_dead_letter(&conn, &q, &poisoned_id, ATTEMPTS, "not authorised");
    assert_eq!(
        CounterIncrement::from_payload(&dead.body).unwrap().counter,
        "not_allowed"
    );
    assert_eq!(
        dead.headers.get("acemq-original-queue"),
        Some(&acemq_amqp::HeaderValue::Text(q.clone()))
    );
}

/// The counters behind a database that is down until told otherwise (a fake: the test's
/// databases cannot be taken down under a parallel test run).
struct Outage {
    counters: CounterStore,
    down: AtomicBool,
    failed_calls: AtomicUsize,
}

impl Outage {
    /// The counters in `dir`, down.
    fn down(dir: &tempfile::TempDir) -> std::sync::Arc<Outage> {
        std::sync::Arc::new(Outage {
            counters: counters(dir),
            down: AtomicBool::new(true),
            failed_calls: AtomicUsize::new(0),
        })
    }
}

impl ApplyBatch for Outage {
    fn apply_batch(&self, messages: &[&AckMessage]) -> acemq_amqp::Result<Vec<Receipt>> {
        if self.down.load(Ordering::SeqCst) {
            self.failed_calls.fetch_add(1, Ordering::SeqCst);
            return Err(Error::Sql {
                context: "connecting to the database".into(),
                source: "connection refused".into(),
            });
        }
        self.counters.apply_batch(messages)
    }
    /// Down is down for the check as well.
    fn check_up(&self) -> acemq_amqp::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(Error::Sql {
                context: "connecting to the database".into(),
                source: "connection refused".into(),
            });
        }
        self.counters.check_up()
    }
}

/// Down long enough for each message to fail more than twenty times: on RabbitMQ 4.x a quorum
/// queue drops a message returned to it more often than its delivery limit (20), so the
/// rolled-back deliveries are held in the run, never requeued, while the outage lasts.
#[test]
fn a_database_outage_longer_than_the_brokers_delivery_limit_backs_off_and_loses_nothing() {
    const N: usize = 10;
    const PREFETCH: u16 = 8;
    let (conn, _clean, q) = support::declared_consumed_queue("ack-amqp-outage");
    let dir = tempfile::tempdir().unwrap();
    let store = Outage::down(&dir);
    publish_increments(&conn, &q, N, |_| "signups");
    let (batcher, stop) = stoppable_batcher(4, usize::from(PREFETCH) - 1);
    let (done, running) = run_on_a_thread(
        &conn,
        &q,
        PREFETCH,
        Some(Box::new(|options: AmqpQueueOptions| {
            options
                .requeue_backoff_first(Duration::from_millis(5))
                .requeue_backoff_max(Duration::from_millis(40))
                .dead_letter_after(2)
        })),
        store.clone(),
        batcher,
    );
    // Down long enough for every message to fail more often than its dead-letter limit, and
    // than the broker's delivery limit.
    let failed_enough = eventually(WAIT, || store.failed_calls.load(Ordering::SeqCst) >= 25 * N);
    store.down.store(false, Ordering::SeqCst);
    let all_applied = eventually(WAIT, || {
        store.counters.value("signups").unwrap() == N as i64
    });
    let report = stop_and_join(&stop, &done, running).unwrap();
    assert!(failed_enough && all_applied, "{report:?}");
    assert_eq!(report.acknowledged, N as u64, "{report:?}");
    assert!(report.failed >= 20 * N as u64, "{report:?}");
    let dlq = acemq_amqp::dead_letter_queue(&q);
    assert!(
        conn.queue_info(&dlq).map_or(true, |i| i.message_count == 0),
        "an outage dead-lettered messages"
    );
    assert_left_on(&conn, &q, 0);
}

/// A service restarted fifty times during a database outage: each run takes the deliveries,
/// fails to apply them, and gives back what it holds when it stops. On RabbitMQ 4.x each give-back
/// was a counted return, and the quorum queue dropped every message after twenty runs; now a
/// message the broker counted a return of goes back as a fresh copy.
#[test]
fn fifty_runs_stopped_during_a_database_outage_lose_nothing() {
    const N: usize = 3;
    const PREFETCH: u16 = 8;
    let (conn, _clean, q) = support::declared_consumed_queue("ack-amqp-restarts");
    let dir = tempfile::tempdir().unwrap();
    let store = Outage::down(&dir);
    publish_increments(&conn, &q, N, |_| "signups");
    let run = |store: &std::sync::Arc<Outage>| {
        let (batcher, stop) = stoppable_batcher(N, usize::from(PREFETCH) - 1);
        let (done, running) = run_on_a_thread(&conn, &q, PREFETCH, None, store.clone(), batcher);
        (stop, done, running)
    };
    for round in 0..50 {
        let before = store.failed_calls.load(Ordering::SeqCst);
        let (stop, done, running) = run(&store);
        assert!(
            eventually(WAIT, || store.failed_calls.load(Ordering::SeqCst) > before),
            "round {round}: the run tried"
        );
        let _ = stop_and_join(&stop, &done, running);
        assert!(
            eventually(WAIT, || conn
                .queue_info(&q)
                .is_ok_and(|i| i.message_count as usize == N)),
            "round {round}: all {N} are back on {q} (found {:?})",
            conn.queue_info(&q).map(|i| i.message_count)
        );
    }
    store.down.store(false, Ordering::SeqCst);
    let (stop, done, running) = run(&store);
    let all_applied = eventually(WAIT, || {
        store.counters.value("signups").unwrap() == N as i64
    });
    let report = stop_and_join(&stop, &done, running).unwrap();
    assert!(all_applied, "{report:?}");
}

/// A message whose effect always fails with a **database** error (here a `CHECK` constraint:
/// not a refusal) while the database is up, alone in every batch it joins: the store's own
/// check says the database commits, so the failure is the message's and it is dead-lettered
/// after its attempts with the database's reason, instead of backing off for ever. The real
/// SQLite file and its real constraint, no fake.
#[test]
fn a_message_failing_alone_with_a_database_error_while_the_database_is_up_is_dead_lettered() {
    use acemq_amqp::patterns::acknowledged::{BatchStore, BatchStoreOptions};
    use acemq_amqp::sql::Sql;
    const ATTEMPTS: u32 = 3;
    let (conn, _clean, q) = support::declared_consumed_queue("ack-amqp-db-poison");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("amounts.db");
    let open = move || {
        rusqlite::Connection::open(&path).map_err(|e| Error::Sql {
            context: "opening the test database".into(),
            source: e.into(),
        })
    };
    Sql::execute(
        &mut open().unwrap(),
        "CREATE TABLE amounts (id TEXT PRIMARY KEY, amount INTEGER NOT NULL CHECK (amount >= 0))",
        &[],
    )
    .unwrap();
    let tries = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = tries.clone();
    let store = BatchStore::new(
        open.clone(),
        move |tx: &mut dyn Sql, m: &AckMessage| {
            counted.fetch_add(1, Ordering::SeqCst);
            let amount: i64 = String::from_utf8_lossy(&m.payload).parse().unwrap_or(0);
            tx.execute(
                "INSERT INTO amounts (id, amount) VALUES (?1, ?2)",
                &[m.identifier.as_str().into(), amount.into()],
            )?;
            Ok("stored".to_string())
        },
        BatchStoreOptions::new().table("receipts"),
    )
    .unwrap();
    store.create_table().unwrap();
    let store = std::sync::Arc::new(store);
    // Published alone: every batch it is in holds only it.
    let poison = Message::new(b"-5".to_vec());
    let poison_id = poison.id().to_string();
    conn.publisher().unwrap().publish("", &q, poison).unwrap();
    let (stop, done, running) = run_dead_lettering(&conn, &q, 8, ATTEMPTS, store.clone());
    let dlq = acemq_amqp::dead_letter_queue(&q);
    let dead_lettered = || conn.queue_info(&dlq).is_ok_and(|i| i.message_count == 1);
    let got_there = eventually(WAIT, dead_lettered);
    // The database still takes messages: one published after it is applied.
    let fine = Message::new(b"7".to_vec());
    let fine_id = fine.id().to_string();
    conn.publisher().unwrap().publish("", &q, fine).unwrap();
    let count = |id: &str| -> i64 {
        let rows = Sql::query(
            &mut open().unwrap(),
            "SELECT COUNT(*) FROM amounts WHERE id = ?1",
            &[id.into()],
        )
        .unwrap();
        rows[0][0].as_i64().expect("COUNT(*) is an integer")
    };
    // The store's identity is `{queue}/{message id}`.
    let applied = eventually(WAIT, || count(&format!("{q}/{fine_id}")) == 1);
    let report = stop_and_join(&stop, &done, running);
    assert!(
        got_there && applied,
        "dead-lettered: {}, tried {} times, the next message applied: {applied} ({report:?})",
        dead_lettered(),
        tries.load(Ordering::SeqCst)
    );
    let report = report.unwrap();
    assert_eq!(report.acknowledged, 1, "{report:?}");
    assert_eq!(report.failed, u64::from(ATTEMPTS), "{report:?}");
    assert_eq!(count(&format!("{q}/{poison_id}")), 0);
    the_dead_letter(&conn, &q, &poison_id, ATTEMPTS, "CHECK constraint");
}
