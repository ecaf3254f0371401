//! The acknowledged consumer (issue 6), on real SQLite files, on PostgreSQL and on MySQL/MariaDB.

mod support;
use support::db;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use acemq_amqp::patterns::acknowledged::{
    consume, Acknowledge, ApplyBatch, BatchStore, BatchStoreOptions, Batcher, BatcherOptions,
    CounterIncrement, CounterStore, CounterStoreOptions, Delivery, Effect, IterSource, Message,
    Polled, Receipt, Report, Source,
};
use acemq_amqp::sql::Sql;
use acemq_amqp::{Error, Result, StopHandle};
use parking_lot::Mutex;

// ---------------------------------------------------------------------------------------------
// Helpers

/// A counter store on a fresh SQLite file (kept alive by the returned directory).
fn counter_store() -> (tempfile::TempDir, CounterStore) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = counter_store_at(&dir.path().join("counters.db"));
    (dir, store)
}

fn counter_store_at(path: &std::path::Path) -> CounterStore {
    let store = CounterStore::new(path, CounterStoreOptions::new()).expect("build");
    store.create_tables().expect("create tables");
    store
}

fn inc(id: &str, counter: &str, by: i64) -> Message {
    CounterIncrement::new(counter, by).message(id)
}

/// `consume`'s batcher: batches of up to `n`, at most `2n` deliveries pending.
fn batches_of(n: usize) -> Batcher {
    Batcher::new(BatcherOptions::new().batch_size(n).max_pending(2 * n)).unwrap()
}

/// Deliveries of `messages` with tokens `first_token`, `first_token + 1`, …
fn deliveries(messages: &[Message], first_token: u64) -> Vec<Delivery<u64>> {
    messages
        .iter()
        .zip(first_token..)
        .map(|(m, t)| Delivery::new(m.clone(), t))
        .collect()
}

/// What an instrumented source saw.
#[derive(Debug, Default)]
struct Stats {
    /// Items handed out.
    polled: usize,
    /// Deliveries acknowledged (or failed) so far, counted by the test's callbacks.
    settled: usize,
    /// The most items handed out and not yet settled, measured just after each hand-out.
    max_ahead: usize,
    /// Calls of `close`.
    closed: usize,
    /// Calls of `poll` after `End` or after `close`.
    misuse: usize,
    ended: bool,
}

/// A source over deliveries that measures how far ahead of the acknowledgements it is, can fail
/// at a given position, and can go idle forever instead of ending.
struct TestSource {
    items: std::collections::VecDeque<Delivery<u64>>,
    stats: Arc<Mutex<Stats>>,
    fail_at: Option<usize>,
    idle_forever: bool,
}

impl TestSource {
    fn new(items: Vec<Delivery<u64>>) -> (TestSource, Arc<Mutex<Stats>>) {
        let stats = Arc::new(Mutex::new(Stats::default()));
        (
            TestSource {
                items: items.into(),
                stats: Arc::clone(&stats),
                fail_at: None,
                idle_forever: false,
            },
            stats,
        )
    }
}

impl Source for TestSource {
    type Item = Delivery<u64>;

    fn poll(&mut self, timeout: Duration) -> Result<Polled<Delivery<u64>>> {
        let mut s = self.stats.lock();
        if s.ended || s.closed > 0 {
            s.misuse += 1;
        }
        if self.fail_at == Some(s.polled) {
            return Err(Error::Io {
                context: "reading the test source".into(),
                source: std::io::Error::other("source broke"),
            });
        }
        match self.items.pop_front() {
            Some(d) => {
                s.polled += 1;
                s.max_ahead = s.max_ahead.max(s.polled - s.settled);
                Ok(Polled::Item(d))
            }
            None if self.idle_forever => {
                drop(s);
                thread::sleep(timeout);
                Ok(Polled::Idle)
            }
            None => {
                s.ended = true;
                Ok(Polled::End)
            }
        }
    }

    fn close(&mut self) -> Result<()> {
        self.stats.lock().closed += 1;
        Ok(())
    }
}

/// An acknowledgement that records tokens and counts settlements in `stats`.
fn recorder(
    stats: &Arc<Mutex<Stats>>,
    acked: &Arc<Mutex<Vec<u64>>>,
) -> impl FnMut(&Delivery<u64>) -> Result<()> {
    let stats = Arc::clone(stats);
    let acked = Arc::clone(acked);
    move |d: &Delivery<u64>| {
        acked.lock().push(d.acknowledgement_token);
        stats.lock().settled += 1;
        Ok(())
    }
}

fn report(acknowledged: u64, replayed: u64, failed: u64) -> Report {
    Report {
        acknowledged,
        replayed,
        failed,
    }
}

// ---------------------------------------------------------------------------------------------
// Replays

#[test]
fn the_same_message_twice_changes_the_counter_once_and_is_acknowledged_twice() {
    // Batch 1: the two deliveries are in different transactions; batch 32: in the same one.
    for batch_size in [1, 32] {
        let (_dir, store) = counter_store();
        let m = inc("tenant-a/views/1", "views", 5);
        let twice = vec![Delivery::new(m.clone(), 7_u64), Delivery::new(m, 8)];
        let mut acked = Vec::new();
        let r = consume(
            IterSource::new(twice),
            &store,
            |d: &Delivery<u64>| {
                acked.push(d.acknowledgement_token);
                Ok(())
            },
            &batches_of(batch_size),
        )
        .unwrap();
        assert_eq!(r, report(2, 1, 0), "batch size {batch_size}");
        assert_eq!(acked, [7, 8]);
        assert_eq!(store.value("views").unwrap(), 5);
        assert_eq!(store.receipt_count().unwrap(), 1);
        // The replay returns the earlier outcome.
        let again = store
            .apply_batch(&[&inc("tenant-a/views/1", "views", 5)])
            .unwrap();
        assert_eq!(
            again,
            [Receipt::Replayed {
                outcome: r#"{"counter":"views","value":5}"#.into()
            }]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Crash after commit, before the first acknowledgement

const CRASH_ENV: &str = "ACEMQ_ACK_CRASH_DB";
const CRASH_EXIT: i32 = 42;

fn crash_messages() -> Vec<Message> {
    vec![inc("crash/1", "orders", 1), inc("crash/2", "orders", 2)]
}

/// Not a test of its own: the child process of `a_crash_after_commit_before_ack_…`, which runs
/// it with `ACEMQ_ACK_CRASH_DB` set. It commits one batch and exits at its first acknowledgement.
#[test]
#[ignore = "run as a child process by the crash test"]
fn crash_child() {
    let Ok(path) = std::env::var(CRASH_ENV) else {
        return;
    };
    let store = counter_store_at(std::path::Path::new(&path));
    let _ = consume(
        IterSource::new(deliveries(&crash_messages(), 1)),
        &store,
        |_: &Delivery<u64>| -> Result<()> { std::process::exit(CRASH_EXIT) },
        &batches_of(2),
    );
    panic!("the child should have exited in its first acknowledgement");
}

#[test]
fn a_crash_after_commit_before_ack_is_replayed_on_restart_without_repeating_effects() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.db");
    let status = support::crash_child()
        .env(CRASH_ENV, &path)
        .status()
        .expect("run the child test process");
    assert_eq!(
        status.code(),
        Some(CRASH_EXIT),
        "the child did not exit in its acknowledgement: {status}"
    );

    // The batch committed before the crash.
    let store = counter_store_at(&path);
    assert_eq!(store.value("orders").unwrap(), 3);
    assert_eq!(store.receipt_count().unwrap(), 2);

    // The broker redelivers both with fresh tokens.
    let (source, stats) = TestSource::new(deliveries(&crash_messages(), 100));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let r = consume(source, &store, recorder(&stats, &acked), &batches_of(2)).unwrap();
    assert_eq!(r, report(2, 2, 0));
    assert_eq!(*acked.lock(), [100, 101]);
    assert_eq!(store.value("orders").unwrap(), 3, "an effect was repeated");
    assert_eq!(stats.lock().closed, 1);
}

// ---------------------------------------------------------------------------------------------
// A failing message fails alone

/// Batches of 2: [ok, ok] [ok, bad] [ok, ok]. The middle batch rolls back as a whole; the
/// recipe then applies its two messages one at a time: the good one commits, the bad one fails
/// alone. The first batch stays committed, the last commits.
fn rollback_case(store: &CounterStore, tag: &str, bad: Message) {
    let before = store.value("hits").unwrap();
    let receipts_before = store.receipt_count().unwrap();
    let id = |n: u32| format!("{tag}/{n}");
    let messages = vec![
        inc(&id(1), "hits", 1),
        inc(&id(2), "hits", 1),
        inc(&id(3), "hits", 1),
        bad,
        inc(&id(5), "hits", 1),
        inc(&id(6), "hits", 1),
    ];
    let (source, stats) = TestSource::new(deliveries(&messages, 1));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let r = consume(source, store, recorder(&stats, &acked), &batches_of(2)).unwrap();
    assert_eq!(r, report(5, 0, 1));
    assert_eq!(
        *acked.lock(),
        [1, 2, 3, 5, 6],
        "the failed delivery was acknowledged, or its batchmate was not"
    );
    assert_eq!(store.value("hits").unwrap(), before + 5);
    assert_eq!(store.receipt_count().unwrap(), receipts_before + 5);
    assert!(store.batch_store().receipt(&id(3)).unwrap().is_some());
    assert!(store.batch_store().receipt(&id(1)).unwrap().is_some());
    assert_eq!(stats.lock().closed, 1);
}

#[test]
fn an_invalid_counter_name_fails_alone_and_its_batchmates_commit() {
    let (_dir, store) = counter_store();
    rollback_case(&store, "name", inc("name/4", "no spaces allowed", 1));
    let err = store.apply_batch(&[&inc("x/1", "hits", 1), &inc("x/2", "bad name", 1)]);
    assert!(
        matches!(
            err,
            Err(Error::InvalidName {
                kind: "counter",
                ..
            })
        ),
        "{err:?}"
    );
    // A payload that is not an increment at all.
    rollback_case(&store, "json", Message::new("json/4", b"not json".to_vec()));
}

#[test]
fn an_unauthorised_counter_fails_alone_and_its_batchmates_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = CounterStore::new(
        dir.path().join("auth.db"),
        CounterStoreOptions::new().allow(["hits"]),
    )
    .unwrap();
    store.create_tables().unwrap();
    rollback_case(&store, "auth", inc("auth/4", "admin", 1));
    assert_eq!(store.value("admin").unwrap(), 0);
    let err = store.apply_batch(&[&inc("x/1", "admin", 1)]).unwrap_err();
    assert!(err.to_string().contains("not authorised"), "{err}");
}

#[test]
fn an_identity_reused_with_another_payload_fails_alone_and_its_batchmates_commit() {
    let (_dir, store) = counter_store();
    // reuse/1 is committed in the first batch; the fourth message reuses it with another payload.
    rollback_case(&store, "reuse", inc("reuse/1", "hits", 100));
    // Within one batch, too.
    let err = store
        .apply_batch(&[&inc("same/1", "hits", 1), &inc("same/1", "hits", 2)])
        .unwrap_err();
    assert!(
        err.to_string().contains("different payload"),
        "unexpected error: {err}"
    );
    assert_eq!(store.batch_store().receipt("same/1").unwrap(), None);
}

#[test]
fn an_overflow_fails_alone_and_its_batchmates_commit() {
    let (_dir, store) = counter_store();
    store
        .apply_batch(&[&inc("big/0", "hits", i64::MAX - 10)])
        .unwrap();
    // The five good items take it to MAX - 5; the bad item would go past MAX.
    rollback_case(&store, "overflow", inc("overflow/4", "hits", 100));
    assert_eq!(store.value("hits").unwrap(), i64::MAX - 5);
    let err = store.apply_batch(&[&inc("x/1", "hits", 6)]).unwrap_err();
    assert!(err.to_string().contains("overflow"), "{err}");
    store.apply_batch(&[&inc("x/2", "hits", 5)]).unwrap();
    assert_eq!(store.value("hits").unwrap(), i64::MAX);
}

/// A store that fails with a database error (not a refusal) on any batch holding one of
/// `failing` (all of them when `failing` is empty), counting its calls. A fake: the real
/// databases cannot be made to fail on demand for one message, or go down, in a shared test
/// run; the recipe only sees `apply_batch`'s result.
struct FailingStore<'a> {
    inner: &'a CounterStore,
    failing: Vec<&'static str>,
    calls: AtomicUsize,
}

impl<'a> FailingStore<'a> {
    fn new(inner: &'a CounterStore, failing: Vec<&'static str>) -> Self {
        FailingStore {
            inner,
            failing,
            calls: AtomicUsize::new(0),
        }
    }
}

impl ApplyBatch for FailingStore<'_> {
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let hit = messages
            .iter()
            .any(|m| self.failing.contains(&m.identifier.as_str()));
        if self.failing.is_empty() || hit {
            return Err(Error::Sql {
                context: "applying a batch".into(),
                source: "database is locked".into(),
            });
        }
        self.inner.apply_batch(messages)
    }
    /// Down when everything fails; otherwise the database is up and says so.
    fn check_up(&self) -> Result<()> {
        if self.failing.is_empty() {
            return Err(Error::Sql {
                context: "checking the database".into(),
                source: "database is locked".into(),
            });
        }
        self.inner.check_up()
    }
}

/// Records which deliveries the recipe reported failed (as a batch: not their own fault) and
/// which rejected (failed alone: their own fault).
#[derive(Default)]
struct FaultRecorder {
    acked: Vec<u64>,
    failed: Vec<u64>,
    rejected: Vec<u64>,
}

impl Acknowledge<u64> for FaultRecorder {
    fn acknowledge(&mut self, d: &Delivery<u64>) -> Result<()> {
        self.acked.push(d.acknowledgement_token);
        Ok(())
    }
    fn failed(&mut self, d: &[Delivery<u64>], _: &Error) -> Result<()> {
        self.failed
            .extend(d.iter().map(|d| d.acknowledgement_token));
        Ok(())
    }
    fn rejected(&mut self, d: &Delivery<u64>, _: &Error) -> Result<()> {
        self.rejected.push(d.acknowledgement_token);
        Ok(())
    }
}

/// Consumes `messages` (tokens from `first_token`) through `store` in batches of `batch`,
/// recording what became of each delivery.
fn consume_recording(
    store: &impl ApplyBatch,
    messages: &[Message],
    first_token: u64,
    batch: usize,
) -> (Report, FaultRecorder) {
    let mut acker = FaultRecorder::default();
    let r = consume(
        IterSource::new(deliveries(messages, first_token)),
        store,
        Wrap(&mut acker),
        &Batcher::new(BatcherOptions::new().batch_size(batch).max_pending(batch)).unwrap(),
    )
    .unwrap();
    (r, acker)
}

#[test]
fn a_message_that_fails_alone_while_its_batchmates_commit_is_rejected_as_its_own_fault() {
    let (_dir, store) = counter_store();
    let messages = vec![
        inc("own/1", "hits", 1),
        inc("own/2", "hits", 1),
        inc("own/3", "hits", 1),
        inc("own/4", "hits", 1),
    ];
    let failing = FailingStore::new(&store, vec!["own/2"]);
    let (r, acker) = consume_recording(&failing, &messages, 1, 4);
    assert_eq!(r, report(3, 0, 1));
    assert_eq!(acker.acked, [1, 3, 4]);
    assert_eq!(
        acker.rejected,
        [2],
        "a database error while the others committed"
    );
    assert!(acker.failed.is_empty(), "{:?}", acker.failed);
    assert_eq!(store.value("hits").unwrap(), 3);
    // The batch, then each of its four messages.
    assert_eq!(failing.calls.load(Ordering::SeqCst), 5);
}

#[test]
fn a_message_failing_alone_with_a_database_error_while_the_store_is_up_is_rejected() {
    let (_dir, store) = counter_store();
    let messages = vec![
        inc("lone/1", "hits", 1),
        inc("lone/2", "hits", 1),
        inc("lone/3", "hits", 1),
    ];
    let failing = FailingStore::new(&store, vec!["lone/2"]);
    // Batches of one: the failing message is alone in its batch, nothing commits with it.
    let (r, acker) = consume_recording(&failing, &messages, 1, 1);
    assert_eq!(r, report(2, 0, 1));
    assert_eq!(acker.acked, [1, 3]);
    assert_eq!(
        acker.rejected,
        [2],
        "the store commits, so the failure is the message's own"
    );
    assert!(acker.failed.is_empty(), "{:?}", acker.failed);
    assert_eq!(store.value("hits").unwrap(), 2);
}

#[test]
fn a_batch_whose_every_message_fails_alone_while_the_store_is_up_is_rejected_message_by_message() {
    let (_dir, store) = counter_store();
    let messages: Vec<Message> = (0..4)
        .map(|i| inc(&format!("all/{i}"), "hits", 1))
        .collect();
    let failing = FailingStore::new(&store, vec!["all/0", "all/1", "all/2", "all/3"]);
    let (r, acker) = consume_recording(&failing, &messages, 1, 4);
    assert_eq!(r, report(0, 0, 4));
    assert_eq!(acker.rejected, [1, 2, 3, 4]);
    assert!(acker.failed.is_empty(), "{:?}", acker.failed);
    // The batch, then every message alone: the store being up, none is skipped.
    assert_eq!(failing.calls.load(Ordering::SeqCst), 5);
}

#[test]
fn a_store_that_is_down_is_not_tried_message_by_message_and_rejects_nothing() {
    let (_dir, store) = counter_store();
    let messages: Vec<Message> = (0..8)
        .map(|i| inc(&format!("down/{i}"), "hits", 1))
        .collect();
    let down = FailingStore::new(&store, Vec::new());
    let (r, acker) = consume_recording(&down, &messages, 1, 4);
    assert_eq!(r, report(0, 0, 8));
    assert!(acker.acked.is_empty());
    assert!(
        acker.rejected.is_empty(),
        "an outage is no message's fault: {:?}",
        acker.rejected
    );
    assert_eq!(acker.failed, [1, 2, 3, 4, 5, 6, 7, 8]);
    // Per batch of four: the batch, then two messages alone that fail too; the other two are
    // not tried.
    assert_eq!(down.calls.load(Ordering::SeqCst), 6);
}

// ---------------------------------------------------------------------------------------------
// Acknowledgement failures

fn broker_gone() -> Error {
    Error::Io {
        context: "acknowledging".into(),
        source: std::io::Error::other("broker gone"),
    }
}

#[test]
fn an_acknowledgement_failure_propagates_and_leaves_the_rest_unacknowledged() {
    let (_dir, store) = counter_store();
    let messages: Vec<Message> = (0..20)
        .map(|i| inc(&format!("ackfail/{i}"), "hits", 1))
        .collect();
    let (source, stats) = TestSource::new(deliveries(&messages, 1));
    let mut acked = Vec::new();
    let err = consume(
        source,
        &store,
        |d: &Delivery<u64>| {
            if d.acknowledgement_token == 5 {
                return Err(broker_gone());
            }
            acked.push(d.acknowledgement_token);
            Ok(())
        },
        &batches_of(2),
    )
    .unwrap_err();
    assert!(err.to_string().contains("broker gone"), "{err}");
    assert_eq!(acked, [1, 2, 3, 4], "acknowledged after the failure");
    let s = stats.lock();
    assert_eq!(s.closed, 1);
    assert_eq!(s.misuse, 0);
    // Intake stopped: at most the bound past the failing batch.
    assert!(s.polled <= 4 + 4, "took {} deliveries", s.polled);
    drop(s);

    // The rest is redelivered with new tokens: what committed is replayed, nothing runs twice.
    let committed = store.receipt_count().unwrap();
    assert!(committed >= 6, "the failing batch had committed");
    let mut acked = Vec::new();
    let r = consume(
        IterSource::new(deliveries(&messages, 100)),
        &store,
        |d: &Delivery<u64>| {
            acked.push(d.acknowledgement_token);
            Ok(())
        },
        &batches_of(4),
    )
    .unwrap();
    assert_eq!(r, report(20, committed, 0));
    assert_eq!(acked, (100..120).collect::<Vec<_>>());
    assert_eq!(store.value("hits").unwrap(), 20);
}

/// An acknowledger that acknowledges whole batches (as an AMQP adapter does with `multiple`).
#[derive(Default)]
struct BatchAcker {
    batches: Vec<Vec<u64>>,
    singles: usize,
    failed: Vec<Vec<u64>>,
    fail_on_batch: Option<usize>,
}

impl Acknowledge<u64> for BatchAcker {
    fn acknowledge(&mut self, _: &Delivery<u64>) -> Result<()> {
        self.singles += 1;
        Ok(())
    }

    fn acknowledge_batch(&mut self, deliveries: &[Delivery<u64>]) -> Result<()> {
        if self.fail_on_batch == Some(self.batches.len()) {
            return Err(broker_gone());
        }
        self.batches
            .push(deliveries.iter().map(|d| d.acknowledgement_token).collect());
        Ok(())
    }

    fn failed(&mut self, deliveries: &[Delivery<u64>], _: &Error) -> Result<()> {
        self.failed
            .push(deliveries.iter().map(|d| d.acknowledgement_token).collect());
        Ok(())
    }
}

#[test]
fn a_batch_acknowledger_gets_each_committed_batch_in_order() {
    let (_dir, store) = counter_store();
    let mut messages: Vec<Message> = (0..9)
        .map(|i| inc(&format!("multi/{i}"), "hits", 1))
        .collect();
    messages[4] = inc("multi/bad", "bad name", 1);
    let mut acker = BatchAcker::default();
    let r = consume(
        IterSource::new(deliveries(&messages, 1)),
        &store,
        Wrap(&mut acker),
        &batches_of(3),
    )
    .unwrap();
    // The second batch rolls back; applied again one by one, 4 and 6 commit, 5 fails alone.
    assert_eq!(r, report(8, 0, 1));
    assert_eq!(acker.batches, [vec![1, 2, 3], vec![4, 6], vec![7, 8, 9]]);
    assert_eq!(acker.failed, [vec![5]]);
    assert_eq!(acker.singles, 0);

    // A failing batch acknowledgement propagates like a single one.
    let mut acker = BatchAcker {
        fail_on_batch: Some(1),
        ..BatchAcker::default()
    };
    let more: Vec<Message> = (0..9)
        .map(|i| inc(&format!("multi2/{i}"), "hits", 1))
        .collect();
    let (source, stats) = TestSource::new(deliveries(&more, 1));
    let err = consume(
        source,
        &store,
        Wrap(&mut acker),
        &Batcher::new(BatcherOptions::new().batch_size(3).max_pending(3)).unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("broker gone"));
    assert_eq!(acker.batches, [vec![1, 2, 3]]);
    assert_eq!(stats.lock().closed, 1);
}

/// Lends an acknowledger to `consume` (which takes it by value).
struct Wrap<'a, A>(&'a mut A);

impl<T, A: Acknowledge<T>> Acknowledge<T> for Wrap<'_, A> {
    fn acknowledge(&mut self, d: &Delivery<T>) -> Result<()> {
        self.0.acknowledge(d)
    }
    fn acknowledge_batch(&mut self, d: &[Delivery<T>]) -> Result<()> {
        self.0.acknowledge_batch(d)
    }
    fn rejected(&mut self, d: &Delivery<T>, e: &Error) -> Result<()> {
        self.0.rejected(d, e)
    }
    fn failed(&mut self, d: &[Delivery<T>], e: &Error) -> Result<()> {
        self.0.failed(d, e)
    }
}

// ---------------------------------------------------------------------------------------------
// Bounded intake

/// Records the size of every batch, and optionally sleeps in each (a slow database).
struct Recording<'a> {
    inner: &'a CounterStore,
    sizes: Mutex<Vec<usize>>,
    delay: Duration,
}

impl ApplyBatch for Recording<'_> {
    fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
        self.sizes.lock().push(messages.len());
        thread::sleep(self.delay);
        self.inner.apply_batch(messages)
    }
}

#[test]
fn intake_is_bounded_by_max_pending() {
    let (_dir, store) = counter_store();
    for (case, (batch_size, max_pending, delay)) in [
        (8, 16, Duration::ZERO),
        (8, 16, Duration::from_millis(2)),
        (4, 5, Duration::from_millis(1)),
        (16, 4, Duration::ZERO),
        (1, 1, Duration::ZERO),
    ]
    .into_iter()
    .enumerate()
    {
        let messages: Vec<Message> = (0..300)
            .map(|i| inc(&format!("bound/{case}/{i}"), "hits", 1))
            .collect();
        let (source, stats) = TestSource::new(deliveries(&messages, 1));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let recording = Recording {
            inner: &store,
            sizes: Mutex::new(Vec::new()),
            delay,
        };
        let r = consume(
            source,
            &recording,
            recorder(&stats, &acked),
            &Batcher::new(
                BatcherOptions::new()
                    .batch_size(batch_size)
                    .max_pending(max_pending),
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(r, report(300, 0, 0));
        let s = stats.lock();
        assert!(
            s.max_ahead <= max_pending + 1,
            "batch {batch_size}, max_pending {max_pending}: the source got {} ahead",
            s.max_ahead
        );
        assert!(
            s.max_ahead >= max_pending.min(batch_size),
            "never filled a batch"
        );
        assert_eq!(s.closed, 1);
        let sizes = recording.sizes.lock();
        assert!(sizes
            .iter()
            .all(|&n| n >= 1 && n <= batch_size.min(max_pending)));
        assert_eq!(sizes.iter().sum::<usize>(), 300);
    }
    assert_eq!(store.value("hits").unwrap(), 1500);
}

// ---------------------------------------------------------------------------------------------
// Closing the source, stopping

#[test]
fn a_source_error_drains_accepted_work_closes_the_source_and_propagates() {
    let (_dir, store) = counter_store();
    let messages: Vec<Message> = (0..10)
        .map(|i| inc(&format!("srcerr/{i}"), "hits", 1))
        .collect();
    let (mut source, stats) = TestSource::new(deliveries(&messages, 1));
    source.fail_at = Some(7);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let err = consume(source, &store, recorder(&stats, &acked), &batches_of(4)).unwrap_err();
    assert!(err.to_string().contains("source broke"), "{err}");
    // Everything taken before the error was applied and acknowledged.
    assert_eq!(*acked.lock(), (1..=7).collect::<Vec<_>>());
    assert_eq!(store.value("hits").unwrap(), 7);
    let s = stats.lock();
    assert_eq!((s.closed, s.misuse), (1, 0));
}

#[test]
fn a_panicking_acknowledgement_still_closes_the_source() {
    let (_dir, store) = counter_store();
    let messages: Vec<Message> = (0..6)
        .map(|i| inc(&format!("panic/{i}"), "hits", 1))
        .collect();
    let (source, stats) = TestSource::new(deliveries(&messages, 1));
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        consume(
            source,
            &store,
            |_: &Delivery<u64>| -> Result<()> { panic!("acknowledgement panicked") },
            &batches_of(2),
        )
    }));
    assert!(panicked.is_err());
    assert_eq!(stats.lock().closed, 1);
}

#[test]
fn a_panicking_effect_fails_alone() {
    let (_dir, store) = counter_store();
    struct Panicky<'a>(&'a CounterStore);
    impl ApplyBatch for Panicky<'_> {
        fn apply_batch(&self, messages: &[&Message]) -> Result<Vec<Receipt>> {
            if messages.iter().any(|m| m.identifier == "boom") {
                panic!("effect panicked");
            }
            self.0.apply_batch(messages)
        }
    }
    let messages = vec![
        inc("p/1", "hits", 1),
        inc("boom", "hits", 1),
        inc("p/3", "hits", 1),
    ];
    let (source, stats) = TestSource::new(deliveries(&messages, 1));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let r = consume(
        source,
        &Panicky(&store),
        recorder(&stats, &acked),
        &batches_of(1),
    )
    .unwrap();
    assert_eq!(r, report(2, 0, 1));
    assert_eq!(*acked.lock(), [1, 3]);
    assert_eq!(stats.lock().closed, 1);

    // In one batch with others: the batch rolls back, then the panicking message fails alone
    // (its own fault: the others commit) and the others are acknowledged.
    let messages = vec![
        inc("p/4", "hits", 1),
        inc("boom", "hits", 1),
        inc("p/6", "hits", 1),
    ];
    let (r, acker) = consume_recording(&Panicky(&store), &messages, 4, 3);
    assert_eq!(r, report(2, 0, 1));
    assert_eq!((acker.acked, acker.rejected), (vec![4, 6], vec![5]));
    assert!(acker.failed.is_empty());
    assert_eq!(store.value("hits").unwrap(), 4);
}

#[test]
fn the_source_is_closed_when_it_ends_and_when_every_batch_fails() {
    let (_dir, store) = counter_store();
    // Ends normally.
    let (source, stats) = TestSource::new(deliveries(&[inc("c/1", "hits", 1)], 1));
    let acked = Arc::new(Mutex::new(Vec::new()));
    consume(source, &store, recorder(&stats, &acked), &batches_of(4)).unwrap();
    let s = stats.lock();
    assert_eq!((s.closed, s.misuse), (1, 0));
    drop(s);
    // Every batch fails in the store: not an error of `consume`, and still closed.
    let bad: Vec<Message> = (0..5)
        .map(|i| inc(&format!("c/bad/{i}"), "bad name", 1))
        .collect();
    let (source, stats) = TestSource::new(deliveries(&bad, 1));
    let r = consume(source, &store, recorder(&stats, &acked), &batches_of(2)).unwrap();
    assert_eq!(r, report(0, 0, 5));
    assert_eq!(stats.lock().closed, 1);
    // Empty source.
    let (source, stats) = TestSource::new(Vec::new());
    assert_eq!(
        consume(source, &store, recorder(&stats, &acked), &batches_of(2)).unwrap(),
        Report::default()
    );
    assert_eq!(stats.lock().closed, 1);
    // Invalid options (a zero batch size or intake bound) are errors, not panics; the source
    // is dropped unpolled.
    for options in [
        BatcherOptions::new().batch_size(0).max_pending(4),
        BatcherOptions::new().batch_size(0),
        BatcherOptions::new().batch_size(2).max_pending(0),
    ] {
        let (source, unpolled) = TestSource::new(Vec::new());
        let result = Batcher::new(options.clone())
            .and_then(|batcher| consume(source, &store, recorder(&stats, &acked), &batcher));
        assert!(
            matches!(result, Err(Error::InvalidArgument { .. })),
            "{options:?}: {result:?}"
        );
        assert_eq!(unpolled.lock().polled, 0);
    }
}

#[test]
fn consume_options_default_to_batches_of_32_with_twice_that_pending() {
    /// Acknowledges whole batches, recording their sizes, and counts them as settled.
    struct Sizes {
        stats: Arc<Mutex<Stats>>,
        sizes: Vec<usize>,
    }
    impl Acknowledge<u64> for Sizes {
        fn acknowledge(&mut self, d: &Delivery<u64>) -> Result<()> {
            self.acknowledge_batch(std::slice::from_ref(d))
        }
        fn acknowledge_batch(&mut self, deliveries: &[Delivery<u64>]) -> Result<()> {
            self.sizes.push(deliveries.len());
            self.stats.lock().settled += deliveries.len();
            Ok(())
        }
    }
    let (_dir, store) = counter_store();
    let messages: Vec<Message> = (0..100)
        .map(|i| inc(&format!("defaults/{i}"), "hits", 1))
        .collect();
    let (source, stats) = TestSource::new(deliveries(&messages, 1));
    let mut sizes = Sizes {
        stats: Arc::clone(&stats),
        sizes: Vec::new(),
    };
    let r = consume(
        source,
        &store,
        Wrap(&mut sizes),
        &Batcher::new(BatcherOptions::default()).unwrap(),
    )
    .unwrap();
    assert_eq!(r, report(100, 0, 0));
    // Every item is ready at once, so the first batch fills up to the default batch size.
    assert_eq!(sizes.sizes.first(), Some(&32), "{:?}", sizes.sizes);
    assert!(sizes.sizes.iter().all(|n| *n <= 32), "{:?}", sizes.sizes);
    // The default intake bound: twice the batch size.
    let s = stats.lock();
    assert!(s.max_ahead <= 64, "{s:?}");
    assert_eq!(s.closed, 1);
}

#[test]
fn the_stop_handle_stops_an_idle_consumer_after_draining_what_it_took() {
    let (_dir, store) = counter_store();
    let messages: Vec<Message> = (0..50)
        .map(|i| inc(&format!("stop/{i}"), "hits", 1))
        .collect();
    let (mut source, stats) = TestSource::new(deliveries(&messages, 1));
    source.idle_forever = true;
    let batcher = Batcher::new(
        BatcherOptions::new()
            .batch_size(8)
            .max_pending(16)
            .poll_interval(Duration::from_millis(20)),
    )
    .unwrap();
    let stop: StopHandle = batcher.stop_handle();
    let acked = Arc::new(Mutex::new(Vec::new()));
    let waiter = {
        let acked = Arc::clone(&acked);
        thread::spawn(move || {
            // Stop once everything was taken and acknowledged, while the source idles.
            let deadline = Instant::now() + Duration::from_secs(20);
            while acked.lock().len() < 50 && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
            thread::sleep(Duration::from_millis(50));
            let at = Instant::now();
            stop.stop();
            at
        })
    };
    let r = consume(source, &store, recorder(&stats, &acked), &batcher).unwrap();
    let returned = Instant::now();
    let stopped_at = waiter.join().unwrap();
    assert!(
        returned.duration_since(stopped_at) < Duration::from_secs(1),
        "the stop took {:?} to be noticed",
        returned.duration_since(stopped_at)
    );
    assert_eq!(r, report(50, 0, 0));
    assert_eq!(stats.lock().closed, 1);
    assert!(batcher.stop_handle().is_stopped());

    // Stopping while busy: everything taken is applied and acknowledged, nothing more is taken.
    let more: Vec<Message> = (0..10_000)
        .map(|i| inc(&format!("stop2/{i}"), "hits", 1))
        .collect();
    let (source, stats) = TestSource::new(deliveries(&more, 1));
    let batcher = Batcher::new(BatcherOptions::new().batch_size(4).max_pending(8)).unwrap();
    let stop = batcher.stop_handle();
    let stats2 = Arc::clone(&stats);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let mut record = recorder(&stats, &acked);
    let r = consume(
        source,
        &store,
        |d: &Delivery<u64>| {
            if d.acknowledgement_token == 20 {
                stop.stop();
            }
            record(d)
        },
        &batcher,
    )
    .unwrap();
    let s = stats2.lock();
    assert_eq!(
        r.acknowledged as usize, s.polled,
        "taken but not acknowledged"
    );
    assert!(s.polled < 40, "kept taking after the stop: {}", s.polled);
    assert_eq!(s.closed, 1);
}

// ---------------------------------------------------------------------------------------------
// The batcher on its own

#[test]
fn map_outcomes_returns_one_outcome_per_item_in_order() {
    // max_pending a multiple of the batch size: the batches are [0..7) [7..14) …
    let batcher = Batcher::new(BatcherOptions::new().batch_size(7).max_pending(14)).unwrap();
    let mut seen = Vec::new();
    batcher
        .map_outcomes(
            IterSource::new(0..100_u32),
            |batch: &[u32]| {
                if batch.contains(&50) {
                    return Err(Error::InvalidArgument {
                        reason: "fifty".into(),
                    });
                }
                Ok(batch.iter().map(|n| n * 2).collect())
            },
            |n, outcome| {
                seen.push((n, outcome.map_err(|e| e.to_string())));
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(seen.len(), 100);
    for (i, (n, outcome)) in seen.iter().enumerate() {
        assert_eq!(*n as usize, i);
        if (49..56).contains(n) {
            // 49..56 is the batch holding 50: [0..7) [7..14) … [49..56).
            assert!(outcome.as_ref().unwrap_err().contains("fifty"));
        } else {
            assert_eq!(outcome.as_ref().unwrap(), &(n * 2));
        }
    }
    // A wrong number of outcomes fails the batch.
    let mut errors = 0;
    batcher
        .map_outcomes(
            IterSource::new(0..3_u32),
            |_: &[u32]| Ok(vec![1_u32]),
            |_, outcome| {
                errors += usize::from(outcome.is_err());
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(errors, 3);
    assert!(Batcher::new(BatcherOptions::new().batch_size(1).max_pending(0)).is_err());
    assert!(Batcher::new(BatcherOptions::new().poll_interval(Duration::ZERO)).is_err());
}

#[test]
fn handles_and_stores_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn clone<T: Clone>() {}
    send_sync::<StopHandle>();
    clone::<StopHandle>();
    send_sync::<Batcher>();
    send_sync::<CounterStore>();
    send_sync::<BatchStore<fn(&mut dyn Sql, &Message) -> Result<String>>>();
    send_sync::<Delivery<u64>>();
    send_sync::<Report>();
}

#[test]
fn invalid_table_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("names.db");
    assert!(matches!(
        CounterStore::new(&path, CounterStoreOptions::new().receipts_table("x; drop")),
        Err(Error::InvalidName { kind: "table", .. })
    ));
    assert!(CounterStore::new(
        &path,
        CounterStoreOptions::new()
            .counters_table("same")
            .receipts_table("same")
    )
    .is_err());
    assert!(CounterStore::new(&path, CounterStoreOptions::new().allow(["bad name"])).is_err());
}

// ---------------------------------------------------------------------------------------------
// The generic batch store with a user-supplied effect, on SQLite and PostgreSQL

/// A ledger effect: inserts `(identifier, amount)` into `ledger`; a negative amount is refused.
fn ledger_store(db: &db::Db) -> (BatchStore<impl Effect>, String) {
    let ledger = db.table("ledger");
    let receipts = db.table("receipts");
    let mut conn = db.connect();
    conn.execute(
        &format!("CREATE TABLE {ledger} (identifier TEXT NOT NULL, amount BIGINT NOT NULL)"),
        &[],
    )
    .unwrap();
    let insert = {
        let d = conn.dialect();
        format!(
            "INSERT INTO {ledger} (identifier, amount) VALUES ({}, {})",
            d.placeholder(1),
            d.placeholder(2)
        )
    };
    let effect = move |tx: &mut dyn Sql, m: &Message| -> Result<String> {
        let text = std::str::from_utf8(&m.payload).map_err(|e| Error::InvalidArgument {
            reason: e.to_string(),
        })?;
        let amount: i64 = text.parse().map_err(|_| Error::InvalidArgument {
            reason: format!("not an amount: {text:?}"),
        })?;
        if amount < 0 {
            return Err(Error::InvalidArgument {
                reason: "negative amount".into(),
            });
        }
        tx.execute(&insert, &[m.identifier.as_str().into(), amount.into()])?;
        Ok(format!("booked {amount}"))
    };
    let store = BatchStore::new(
        db.factory(),
        effect,
        BatchStoreOptions::new().table(&receipts),
    )
    .unwrap();
    store.create_table().unwrap();
    (store, ledger)
}

fn ledger_sum(db: &db::Db, ledger: &str) -> i64 {
    let rows = db
        .connect()
        .query(
            &format!(
                "SELECT CAST(COALESCE(SUM(amount), 0) AS {}) FROM {ledger}",
                // (MySQL casts to SIGNED, not BIGINT.)
                if db.backend == db::Backend::Mysql {
                    "SIGNED"
                } else {
                    "BIGINT"
                }
            ),
            &[],
        )
        .unwrap();
    match &rows[0][0] {
        acemq_amqp::sql::Value::Integer(i) => *i,
        // PostgreSQL's SUM(bigint) is numeric, read as text.
        acemq_amqp::sql::Value::Text(t) => t.parse().unwrap(),
        other => panic!("unexpected sum {other:?}"),
    }
}

fn generic_batch_store_with_a_user_effect(db: &db::Db) {
    let (store, ledger) = ledger_store(db);
    let m = |id: &str, amount: i64| Message::new(id, amount.to_string().into_bytes());
    // Batches of 2: [a, b] [a again (replay), c] [d, negative] [e].
    let messages = vec![
        m("pay/a", 10),
        m("pay/b", 20),
        m("pay/a", 10),
        m("pay/c", 30),
        m("pay/d", 40),
        m("pay/neg", -1),
        m("pay/e", 50),
    ];
    let mut acked = Vec::new();
    let r = consume(
        IterSource::new(deliveries(&messages, 1)),
        &store,
        |d: &Delivery<u64>| {
            acked.push(d.acknowledgement_token);
            Ok(())
        },
        &batches_of(2),
    )
    .unwrap();
    // [d, negative] rolls back; applied again one at a time, d commits and the negative
    // amount fails alone.
    assert_eq!(r, report(6, 1, 1));
    assert_eq!(acked, [1, 2, 3, 4, 5, 7]);
    assert_eq!(ledger_sum(db, &ledger), 10 + 20 + 30 + 40 + 50);
    assert_eq!(
        store.receipt("pay/a").unwrap().as_deref(),
        Some("booked 10")
    );
    assert_eq!(
        store.receipt("pay/d").unwrap().as_deref(),
        Some("booked 40"),
        "committed alone after its batch rolled back"
    );
    assert_eq!(store.receipt("pay/neg").unwrap(), None);

    // A mismatched identity rolls back the whole batch.
    let err = store
        .apply_batch(&[&m("pay/f", 60), &m("pay/b", 21)])
        .unwrap_err();
    assert!(err.to_string().contains("different payload"), "{err}");
    assert_eq!(store.receipt("pay/f").unwrap(), None);
    assert_eq!(ledger_sum(db, &ledger), 150);

    // On the caller's transaction: rolled back by the caller, nothing stays; committed, it does.
    let receipts = db.in_tx(false, |tx| {
        store.apply_batch_in(tx, &[&m("pay/g", 70), &m("pay/a", 10)])
    });
    let receipts = receipts.unwrap();
    assert_eq!(
        receipts,
        [
            Receipt::Applied {
                outcome: "booked 70".into()
            },
            Receipt::Replayed {
                outcome: "booked 10".into()
            }
        ]
    );
    assert_eq!(store.receipt("pay/g").unwrap(), None);
    db.in_tx(true, |tx| store.apply_batch_in(tx, &[&m("pay/g", 70)]))
        .unwrap();
    assert_eq!(
        store.receipt("pay/g").unwrap().as_deref(),
        Some("booked 70")
    );
    assert_eq!(ledger_sum(db, &ledger), 220);

    // Outside a transaction it is refused.
    if db.backend == db::Backend::Postgres {
        let mut client = db.connect();
        assert!(matches!(
            store.apply_batch_in(&mut client, &[&m("pay/h", 1)]),
            Err(Error::InvalidArgument { .. })
        ));
    }
    let mut conn = db.connect();
    assert!(store.apply_batch_in(&mut conn, &[&m("pay/h", 1)]).is_err());

    // Purging receipts older than an hour keeps today's.
    assert_eq!(store.purge(Duration::from_secs(3600)).unwrap(), 0);
    // Older than nothing: once the clock has moved past the receipts' millisecond.
    let mut purged = 0;
    assert!(support::eventually(Duration::from_secs(5), || {
        purged += store.purge(Duration::ZERO).unwrap();
        purged >= 1
    }));
    assert_eq!(store.receipt("pay/a").unwrap(), None);
}

on_every_database!(generic_batch_store_with_a_user_effect);

/// A message whose effect the **database** refuses (a `CHECK` constraint: an `Error::Sql`, not
/// a refusal of the store's), alone in its batch: the store's `check_up` commits an empty
/// transaction, so the failure is the message's own — rejected (over AMQP: counted towards its
/// dead letter), not reported as an outage. The real database and its real constraint.
fn a_message_the_database_refuses_alone_is_rejected_as_its_own_fault(db: &db::Db) {
    let table = db.table("checked");
    db.connect()
        .execute(
            &format!(
                "CREATE TABLE {table} (identifier TEXT NOT NULL, amount BIGINT NOT NULL \
                 CHECK (amount <> 13))"
            ),
            &[],
        )
        .unwrap();
    let insert = {
        let d = db.connect().dialect();
        format!(
            "INSERT INTO {table} (identifier, amount) VALUES ({}, {})",
            d.placeholder(1),
            d.placeholder(2)
        )
    };
    let store = BatchStore::new(
        db.factory(),
        move |tx: &mut dyn Sql, m: &Message| {
            let amount: i64 = String::from_utf8_lossy(&m.payload).parse().unwrap_or(0);
            tx.execute(&insert, &[m.identifier.as_str().into(), amount.into()])?;
            Ok("booked".to_string())
        },
        BatchStoreOptions::new().table(db.table("checked_receipts")),
    )
    .unwrap();
    store.create_table().unwrap();
    store.check_up().unwrap();
    let m = |id: &str, amount: i64| Message::new(id, amount.to_string().into_bytes());
    let messages = vec![m("chk/1", 1), m("chk/13", 13), m("chk/2", 2)];
    let (r, acker) = consume_recording(&store, &messages, 1, 1);
    assert_eq!(r, report(2, 0, 1));
    assert_eq!(acker.acked, [1, 3]);
    assert_eq!(
        acker.rejected,
        [2],
        "the database is up: the failure is its own"
    );
    assert!(acker.failed.is_empty(), "{:?}", acker.failed);
    assert_eq!(store.receipt("chk/13").unwrap(), None);
    assert_eq!(store.receipt("chk/2").unwrap().as_deref(), Some("booked"));
}

on_every_database!(a_message_the_database_refuses_alone_is_rejected_as_its_own_fault);

#[test]
fn postgres_is_required_not_skipped() {
    // `Db::postgres` panics with instructions when the server is down: the PostgreSQL test
    // fails rather than passing vacuously.
    let db = db::Db::postgres();
    let mut conn = db.connect();
    assert_eq!(conn.dialect(), acemq_amqp::sql::Dialect::Postgres);
    assert!(conn.query("SELECT 1", &[]).is_ok());
}

#[test]
fn concurrent_consumers_of_one_counter_file_apply_each_identity_once() {
    let (dir, store) = counter_store();
    let path = dir.path().join("counters.db");
    let messages: Vec<Message> = (0..200)
        .map(|i| inc(&format!("conc/{i}"), "hits", 1))
        .collect();
    // Two consumers get the same 200 messages (as after a redelivery storm).
    let failed = AtomicUsize::new(0);
    thread::scope(|s| {
        for first_token in [1_u64, 1000] {
            let path = &path;
            let messages = &messages;
            let failed = &failed;
            s.spawn(move || {
                let store = CounterStore::new(path, CounterStoreOptions::new()).unwrap();
                let r = consume(
                    IterSource::new(deliveries(messages, first_token)),
                    &store,
                    |_: &Delivery<u64>| Ok(()),
                    &batches_of(16),
                )
                .unwrap();
                failed.fetch_add(r.failed as usize, Ordering::Relaxed);
            });
        }
    });
    // SQLite serialises the batches (BEGIN IMMEDIATE), so none fails and each applies once.
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert_eq!(store.value("hits").unwrap(), 200);
    assert_eq!(store.receipt_count().unwrap(), 200);
}
